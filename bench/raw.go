package main

// The raw-PostgreSQL baselines: what plain pgx does with the same bytes on a
// table shaped like a stream's log. They are the denominators of the floors.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	rawInsertConns = 4
	rawInsertRows  = 100  // rows per INSERT statement
	rawDrainBatch  = 1000 // rows per keyset read
)

const rawSchema = `
DROP SCHEMA IF EXISTS bench_raw CASCADE;
CREATE SCHEMA bench_raw;
CREATE TABLE bench_raw.t (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload     json        NOT NULL, -- the same type as the log's payload column
    produced_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 100);
CREATE TABLE bench_raw.offsets (id int PRIMARY KEY, pos bigint NOT NULL);
INSERT INTO bench_raw.offsets VALUES (1, 0);`

func (b *bench) raw(ctx context.Context, cc *pgx.ConnConfig) error {
	ins := b.rep.throughput("raw_insert", "raw batched INSERT (100 rows/statement, 4 connections)", "rows/s")
	drain := b.rep.throughput("raw_drain", "raw keyset drain (1 reader, LIMIT 1000, offset UPDATE per batch)", "rows/s")
	conns := make([]*pgx.Conn, rawInsertConns)
	for i := range conns {
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		conns[i] = conn
	}
	// A warm-up insert, not timed: the first writes to a fresh cluster create
	// its WAL segments, which later runs (and the workloads after this one)
	// recycle; without it the first raw run was 15–30% slower than the rest.
	if _, err := conns[0].Exec(ctx, rawSchema); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	if _, err := rawInsert(ctx, conns, b.c.n, "raw insert warm-up (not timed)"); err != nil {
		return err
	}
	for r := 1; r <= b.c.runs; r++ {
		if _, err := conns[0].Exec(ctx, rawSchema); err != nil {
			return fmt.Errorf("create table: %w", err)
		}
		label := fmt.Sprintf("raw insert run %d/%d", r, b.c.runs)
		if err := b.timedRun(ctx, ins, label, b.c.n, func() (float64, error) { return rawInsert(ctx, conns, b.c.n, label) }); err != nil {
			return err
		}
		label = fmt.Sprintf("raw drain run %d/%d", r, b.c.runs)
		if err := b.timedRun(ctx, drain, label, b.c.n, func() (float64, error) { return rawDrain(ctx, conns[0], b.c.n, label) }); err != nil {
			return err
		}
	}
	_, err := conns[0].Exec(ctx, "DROP SCHEMA bench_raw CASCADE")
	return err
}

func insertSQL(rows int) string {
	var sb strings.Builder
	sb.WriteString("INSERT INTO bench_raw.t (payload) VALUES ")
	for i := range rows {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "($%d)", i+1)
	}
	return sb.String()
}

// rawInsert writes n rows with multi-row INSERTs from all conns in parallel,
// each statement its own (durable) transaction.
func rawInsert(ctx context.Context, conns []*pgx.Conn, n int, label string) (float64, error) {
	args := make([]any, rawInsertRows)
	for i := range args {
		args[i] = string(payloadJSON)
	}
	statements := (n + rawInsertRows - 1) / rawInsertRows
	full := insertSQL(rawInsertRows)
	var next atomic.Int64
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	stop := progress(label, "rows", int64(n), &done)
	start := wall.Now()
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				s := int(next.Add(1)) - 1
				if s >= statements {
					return
				}
				rows, sql := min(rawInsertRows, n-s*rawInsertRows), full
				if rows < rawInsertRows {
					sql = insertSQL(rows)
				}
				if _, err := conn.Exec(ctx, sql, args[:rows]...); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(statements))
					return
				}
				done.Add(int64(rows))
			}
		}()
	}
	wg.Wait()
	elapsed := wall.Since(start)
	stop()
	if firstErr != nil {
		return 0, fmt.Errorf("insert: %w", firstErr)
	}
	return report1(label, "rows", n, elapsed), nil
}

// rawDrain reads the whole table by keyset pagination, committing an offset
// row after each batch, the way a hand-written consumer would.
func rawDrain(ctx context.Context, conn *pgx.Conn, n int, label string) (float64, error) {
	var done atomic.Int64
	stop := progress(label, "rows", int64(n), &done)
	defer stop()
	start := wall.Now()
	var cursor int64
	for {
		rows, err := conn.Query(ctx, "SELECT id, payload FROM bench_raw.t WHERE id > $1 ORDER BY id LIMIT $2", cursor, rawDrainBatch)
		if err != nil {
			return 0, err
		}
		got := 0
		for rows.Next() {
			var payload []byte
			if err := rows.Scan(&cursor, &payload); err != nil {
				rows.Close()
				return 0, err
			}
			got++
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if got == 0 {
			break
		}
		if _, err := conn.Exec(ctx, "UPDATE bench_raw.offsets SET pos = $1 WHERE id = 1", cursor); err != nil {
			return 0, err
		}
		done.Add(int64(got))
	}
	elapsed := wall.Since(start)
	if d := done.Load(); d != int64(n) {
		return 0, fmt.Errorf("drained %d rows, want %d", d, n)
	}
	return report1(label, "rows", n, elapsed), nil
}

// report1 prints one run's result and returns its rate.
func report1(label, unit string, n int, elapsed time.Duration) float64 {
	rate := float64(n) / elapsed.Seconds()
	fmt.Printf("  %-34s %d %s in %.2fs = %.0f %s/s\n", label, n, unit, elapsed.Seconds(), rate, unit)
	return rate
}
