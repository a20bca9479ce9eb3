package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNotFound reports a stream or group that has not been registered.
var ErrNotFound = errors.New("not found")

// ErrGroupStream reports a group name already registered on another stream.
var ErrGroupStream = errors.New("consumer group belongs to another stream")

// StreamRow is a registered stream.
type StreamRow struct {
	ID     int64
	Name   string
	Config []byte
}

// RegisterStream creates the stream's row and tables, or reuses them. config
// replaces the stored document (newest wins) and every change appends a
// snapshot to stream_config_log; changed reports whether it differed, with
// the old document for the caller's warning, and created whether this call
// made the stream.
func (st *Store) RegisterStream(ctx context.Context, name string, config []byte, declaredBy string, now Now) (row StreamRow, old []byte, changed, created bool, err error) {
	err = pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, st.sql(`-- store.RegisterStream
INSERT INTO %[1]s.stream_config AS s (name, config, created_at, updated_at)
VALUES ($1, '{}', coalesce($2, now()), coalesce($2, now()))
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING s.id, s.config, s.xmax = 0`), name, now).Scan(&row.ID, &old, &created); err != nil {
			return fmt.Errorf("upsert stream row: %w", err)
		}
		row.Name = name
		row.Config = config
		var same bool
		if err := tx.QueryRow(ctx, "-- store.RegisterStream\nSELECT $1::jsonb = $2::jsonb", old, config).Scan(&same); err != nil {
			return fmt.Errorf("compare stream config: %w", err)
		}
		if !same {
			changed = true
			if _, err := tx.Exec(ctx, st.sql(`-- store.RegisterStream
UPDATE %[1]s.stream_config SET config = $2, updated_at = coalesce($3, now()) WHERE id = $1`), row.ID, config, now); err != nil {
				return fmt.Errorf("replace stream config: %w", err)
			}
			if _, err := tx.Exec(ctx, st.sql(`-- store.RegisterStream
INSERT INTO %[1]s.stream_config_log (stream_id, config, declared_by, declared_at)
VALUES ($1, $2, $3, coalesce($4, now()))`), row.ID, config, declaredBy, now); err != nil {
				return fmt.Errorf("log stream config: %w", err)
			}
		}
		return st.applyStreamTemplates(ctx, tx, row.ID)
	})
	if err != nil {
		return StreamRow{}, nil, false, false, fmt.Errorf("register stream %q: %w", name, err)
	}
	return row, old, changed, created, nil
}

// LookupStream reads a registered stream by name, on q (a caller's
// transaction) or, when q is nil, on the pool.
func (st *Store) LookupStream(ctx context.Context, q Querier, name string) (StreamRow, error) {
	if q == nil {
		q = st.q()
	}
	row := StreamRow{Name: name}
	err := q.QueryRow(ctx, st.sql(`-- store.LookupStream
SELECT id, config FROM %[1]s.stream_config WHERE name = $1`), name).Scan(&row.ID, &row.Config)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, fmt.Errorf("stream %q: %w (call Register first)", name, ErrNotFound)
	}
	if err != nil {
		return row, fmt.Errorf("lookup stream %q: %w", name, err)
	}
	return row, nil
}

// Start positions for a new group's cursor.
const (
	StartBeginning = "beginning"
	StartHead      = "head"
)

// GroupRow is a registered consumer group.
type GroupRow struct {
	ID       int64
	StreamID int64
	Name     string
	Start    string // the Start the cursor was created with
	Created  bool   // this call created the group
	// Workers maps worker name to its worker_config id.
	Workers map[string]int64
}

// Worker names a group owns.
const (
	WorkerMessageConsumer   = "message_consumer"
	WorkerExceptionConsumer = "exception_consumer"
)

// RegisterGroup creates the group, its cursor (placed by start, read only
// here) and its worker rows, or returns the existing ones.
func (st *Store) RegisterGroup(ctx context.Context, streamID int64, name, start string, now Now) (GroupRow, error) {
	g := GroupRow{Name: name, Workers: map[string]int64{}}
	r := st.stream(streamID)
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, st.sql(`-- store.RegisterGroup
INSERT INTO %[1]s.consumer_group_config (stream_id, name, start, created_at)
VALUES ($1, $2, $3, coalesce($4, now()))
ON CONFLICT (name) DO NOTHING
RETURNING id, stream_id, start`), streamID, name, start, now).Scan(&g.ID, &g.StreamID, &g.Start)
		if err == nil {
			g.Created = true
		} else if errors.Is(err, pgx.ErrNoRows) {
			if err := tx.QueryRow(ctx, st.sql(`-- store.RegisterGroup
SELECT id, stream_id, start FROM %[1]s.consumer_group_config WHERE name = $1`), name).Scan(&g.ID, &g.StreamID, &g.Start); err != nil {
				return fmt.Errorf("read group row: %w", err)
			}
		} else {
			return fmt.Errorf("insert group row: %w", err)
		}
		if g.StreamID != streamID {
			return fmt.Errorf("group %q: %w", name, ErrGroupStream)
		}
		// The cursor is placed once. "head" skips every position already
		// final: rows of transactions below the snapshot's xmin.
		if _, err := tx.Exec(ctx, r.sql(insertCursorSQL), g.ID, g.Start == StartHead, now); err != nil {
			return fmt.Errorf("create cursor: %w", err)
		}
		for _, w := range []string{WorkerMessageConsumer, WorkerExceptionConsumer} {
			var id int64
			if err := tx.QueryRow(ctx, st.sql(`-- store.RegisterGroup
WITH ins AS (
    INSERT INTO %[1]s.worker_config (consumer_group_id, name, updated_at)
    VALUES ($1, $2, coalesce($3, now()))
    ON CONFLICT (consumer_group_id, name) DO NOTHING
    RETURNING id
)
SELECT id FROM ins
UNION ALL
SELECT id FROM %[1]s.worker_config WHERE consumer_group_id = $1 AND name = $2
LIMIT 1`), g.ID, w, now).Scan(&id); err != nil {
				return fmt.Errorf("worker row %s: %w", w, err)
			}
			g.Workers[w] = id
		}
		return nil
	})
	if err != nil {
		return GroupRow{}, fmt.Errorf("register group %q: %w", name, err)
	}
	return g, nil
}

var insertCursorSQL = perStream(`-- store.RegisterGroup
INSERT INTO {s}.{t}_cursor (group_id, head_xid, head_id, updated_at)
SELECT $1,
       CASE WHEN $2 THEN pg_snapshot_xmin(pg_current_snapshot())::text::bigint ELSE 0 END,
       0, coalesce($3, now())
ON CONFLICT (group_id) DO NOTHING`)
