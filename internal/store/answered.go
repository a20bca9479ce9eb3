package store

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// InTx returns the handle with its statements run on tx: a transactional
// handler's settlement commits with what the handler wrote (RecordProgress,
// SettleException), or not at all.
func (g Group) InTx(tx Querier) Group {
	g.tx = tx
	return g
}

// Counting returns the handle with every statement of it that the database
// answers counted in n. An actor's outage reporter reads it to tell a step
// that reached the database from one that made no store call at all (a
// claim held back by a full queue, an outcome that settles nothing yet):
// only the first ends an outage.
func (g Group) Counting(n *atomic.Uint64) Group {
	g.answered = n
	return g
}

// counted wraps a Querier, counting the statements the database answered:
// an Exec or a row's Scan that returned no error (no row is an answer too),
// rows read to their end, a batch closed without an error.
type counted struct {
	q Querier
	n *atomic.Uint64
}

func (c counted) answered(err error) {
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		c.n.Add(1)
	}
}

func (c counted) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := c.q.Exec(ctx, sql, args...)
	c.answered(err)
	return tag, err
}

func (c counted) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := c.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return &countedRows{Rows: rows, c: c}, nil
}

func (c counted) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return countedRow{row: c.q.QueryRow(ctx, sql, args...), c: c}
}

func (c counted) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return &countedBatch{BatchResults: c.q.SendBatch(ctx, b), c: c}
}

type countedRows struct {
	pgx.Rows
	c    counted
	done bool
}

func (r *countedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.end()
	return false
}

func (r *countedRows) Close() {
	r.Rows.Close()
	r.end()
}

func (r *countedRows) end() {
	if !r.done {
		r.done = true
		if r.Rows.Err() == nil {
			r.c.n.Add(1)
		}
	}
}

type countedRow struct {
	row pgx.Row
	c   counted
}

func (r countedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.c.answered(err)
	return err
}

type countedBatch struct {
	pgx.BatchResults
	c counted
}

func (b *countedBatch) Close() error {
	err := b.BatchResults.Close()
	b.c.answered(err)
	return err
}
