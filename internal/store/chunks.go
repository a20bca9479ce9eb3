package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A stream's log is partitioned by xid into chunks (decision 0011): the
// retention worker attaches chunks ahead of the current xid and drops whole
// chunks behind every group's committed position, so expiring messages
// leaves no dead tuples and no statement runs long. Rows no chunk covers
// live in the DEFAULT partition ({t}_log_default).

// Chunk is one partition of a stream's log: positions with Lo <= xid < Hi.
type Chunk struct {
	Lo, Hi    int64
	CreatedAt time.Time
}

// XidClock is where the cluster's transaction ids stand: Next is the next
// xid to be assigned (the snapshot's xmax; reading it assigns none), Xmin the
// oldest still running (every xid below it has finished), At the database's
// (or the injected) now.
type XidClock struct {
	Next, Xmin int64
	At         time.Time
}

// ErrChunkBusy is returned when a chunk statement could not take its lock
// within ChunkLockTimeout: claims and produces are never made to wait
// longer than that; the worker tries again next round.
var ErrChunkBusy = errors.New("log chunk: lock not available")

// ChunkLockTimeout bounds how long attaching or dropping a chunk waits for
// its lock (and so how long it can hold up the statements queued behind it).
const ChunkLockTimeout = "1s"

// floorCTE computes the lowest committed position over every group of the
// stream (their outstanding ranges' low bounds, unresolved exception rows and
// cursor heads); a stream without groups has none. Everything at or below it
// every group has committed.
const floorCTE = `floor AS (
    SELECT p.xid, p.id FROM (
        SELECT lo_xid AS xid, lo_id AS id FROM {s}.{t}_range
        UNION ALL
        SELECT x.message_xid, x.message_id - 1 FROM {s}.{t}_exception x WHERE x.status <> 'dead'
        UNION ALL
        SELECT head_xid, head_id FROM {s}.{t}_cursor
    ) p ORDER BY p.xid, p.id LIMIT 1
)`

func (st *Store) chunkSQL(streamID int64, q string) string {
	q = strings.ReplaceAll(q, "{floor}", floorCTE)
	return strings.NewReplacer("{s}", st.s, "{t}", tablePrefix(streamID)).Replace(q)
}

// chunkTable names the partition holding positions from lo.
func chunkTable(streamID, lo int64) string {
	return fmt.Sprintf("%s_log_%d", tablePrefix(streamID), lo)
}

// ReadXidClock reads where transaction ids stand.
func (st *Store) ReadXidClock(ctx context.Context, now Now) (XidClock, error) {
	var c XidClock
	err := st.pool.QueryRow(ctx, `-- store.ReadXidClock
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
       coalesce($1, now())`, now).Scan(&c.Next, &c.Xmin, &c.At)
	if err != nil {
		return c, fmt.Errorf("read xid clock: %w", err)
	}
	return c, nil
}

// Chunks lists a stream's chunks, oldest first.
func (st *Store) Chunks(ctx context.Context, streamID int64) ([]Chunk, error) {
	rows, err := st.pool.Query(ctx, st.chunkSQL(streamID, `-- store.Chunks
SELECT lo_xid, hi_xid, created_at FROM {s}.{t}_chunk ORDER BY lo_xid`))
	if err != nil {
		return nil, fmt.Errorf("list log chunks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Chunk, error) {
		var c Chunk
		err := r.Scan(&c.Lo, &c.Hi, &c.CreatedAt)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list log chunks: %w", err)
	}
	return out, nil
}

// DefaultTop is one past the highest xid the default partition holds (0 when
// it is empty): a new chunk must start at or above it, or attaching it would
// find rows of its range in the default.
func (st *Store) DefaultTop(ctx context.Context, streamID int64) (int64, error) {
	var top int64
	err := st.pool.QueryRow(ctx, st.chunkSQL(streamID, `-- store.DefaultTop
SELECT coalesce((SELECT xid + 1 FROM {s}.{t}_log_default ORDER BY xid DESC, id DESC LIMIT 1), 0)`)).Scan(&top)
	if err != nil {
		return 0, fmt.Errorf("read default partition top: %w", err)
	}
	return top, nil
}

// LogAnalyzeThreshold is the rows that must change in a log partition (the
// default one and every chunk) before autovacuum analyzes it, on top of the
// default 10% of its rows (stream migration 0006, decision 0056): each
// analyze that changes its statistics makes every backend replan the
// stream's claim path, whose plans do not depend on them.
const LogAnalyzeThreshold = 10_000

// AddChunk attaches an empty chunk for xids [lo, hi). The table is created
// on its own and attached, which takes only a SHARE UPDATE EXCLUSIVE lock on
// the log (produces and claims go on) and an ACCESS EXCLUSIVE one on the
// default partition while it checks that none of its rows belong to the new
// range; the default is kept small, so that check is short. Bounds are
// formatted integers because DDL takes no bind parameters.
func (st *Store) AddChunk(ctx context.Context, streamID, lo, hi int64, now Now) error {
	if lo < 0 || hi <= lo {
		return fmt.Errorf("add log chunk: empty range [%d, %d)", lo, hi)
	}
	name := chunkTable(streamID, lo)
	return st.chunkTx(ctx, "add log chunk", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.AddChunk
CREATE TABLE {s}.%[1]s (LIKE {s}.{t}_log INCLUDING DEFAULTS) WITH (fillfactor = 100, autovacuum_analyze_threshold = %[2]d)`, name, LogAnalyzeThreshold))); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.AddChunk
ALTER TABLE {s}.{t}_log ATTACH PARTITION {s}.%[1]s FOR VALUES FROM (%[2]d) TO (%[3]d)`, name, lo, hi))); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, st.chunkSQL(streamID, `-- store.AddChunk
INSERT INTO {s}.{t}_chunk (lo_xid, hi_xid, created_at) VALUES ($1, $2, coalesce($3, now()))`), lo, hi, now)
		return err
	})
}

// Dropped is what DropChunk did.
type Dropped struct {
	// Dropped: the chunk is gone. False when a group has not committed all
	// of it yet, a transaction could still write to it, or a row in it is
	// younger than the TTL.
	Dropped bool
	// Rows the chunk held; Kept of them (dead letters' messages) moved to
	// the default partition first.
	Rows, Kept int64
}

// DropChunk drops chunk c when every row in it is older than ttl, every
// group has committed past it, and no running transaction can still write to
// it. The messages of exception rows in it (dead letters: unresolved rows
// hold the floor below the chunk) move to the default partition first, so a
// dead letter stays listable and redrivable. The checks that scan the chunk
// run before the lock: once no transaction can write to it, its rows are
// fixed. The floor is checked again under the lock, which holds until commit.
func (st *Store) DropChunk(ctx context.Context, streamID int64, c Chunk, ttl time.Duration, now Now) (Dropped, error) {
	var d Dropped
	name := chunkTable(streamID, c.Lo)
	// Exact, not just hi <= floor: a group's committed position often sits
	// inside the chunk, at its last row. Once no transaction can write to
	// the chunk (hi <= xmin), no row can appear above the floor either.
	floorOK := st.chunkSQL(streamID, fmt.Sprintf(`-- store.DropChunk
WITH {floor}
SELECT $1 <= pg_snapshot_xmin(pg_current_snapshot())::text::bigint
   AND (NOT EXISTS (SELECT 1 FROM floor)
        OR NOT EXISTS (SELECT 1 FROM {s}.%[1]s m, floor f WHERE (m.xid, m.id) > (f.xid, f.id)))`, name))
	var ok bool
	if err := st.pool.QueryRow(ctx, floorOK, c.Hi).Scan(&ok); err != nil {
		return d, fmt.Errorf("drop log chunk: check floor: %w", err)
	}
	if !ok {
		return d, nil
	}
	// The newest position's age first (one index probe); the whole chunk
	// only when that passes, since producers' clocks need not agree.
	if err := st.pool.QueryRow(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.DropChunk
SELECT coalesce((SELECT m.produced_at < coalesce($1, now()) - $2::interval
                 FROM {s}.%[1]s m ORDER BY m.xid DESC, m.id DESC LIMIT 1), true)
   AND NOT EXISTS (SELECT 1 FROM {s}.%[1]s m WHERE m.produced_at >= coalesce($1, now()) - $2::interval)`, name)),
		now, ttl).Scan(&ok); err != nil {
		return d, fmt.Errorf("drop log chunk: check age: %w", err)
	}
	if !ok {
		return d, nil
	}
	err := st.chunkTx(ctx, "drop log chunk", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.DropChunk
ALTER TABLE {s}.{t}_log DETACH PARTITION {s}.%[1]s`, name))); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, floorOK, c.Hi).Scan(&ok); err != nil {
			return err
		}
		if !ok { // a group moved back under the lock (a new group at the start): roll the detach back
			return errNotNow
		}
		if err := tx.QueryRow(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.DropChunk
SELECT count(*) FROM {s}.%[1]s`, name))).Scan(&d.Rows); err != nil {
			return err
		}
		// Detached, the chunk's range is covered by no partition, so these
		// rows route to the default.
		tag, err := tx.Exec(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.DropChunk
INSERT INTO {s}.{t}_log (id, xid, produced_at, version, routing_key, message_key, payload, options)
OVERRIDING SYSTEM VALUE
SELECT m.id, m.xid, m.produced_at, m.version, m.routing_key, m.message_key, m.payload, m.options
FROM {s}.%[1]s m
WHERE (m.xid, m.id) IN (SELECT x.message_xid, x.message_id FROM {s}.{t}_exception x
                        WHERE x.message_xid >= $1 AND x.message_xid < $2)`, name)), c.Lo, c.Hi)
		if err != nil {
			return err
		}
		d.Kept = tag.RowsAffected()
		if _, err := tx.Exec(ctx, st.chunkSQL(streamID, fmt.Sprintf(`-- store.DropChunk
DROP TABLE {s}.%[1]s`, name))); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, st.chunkSQL(streamID, `-- store.DropChunk
DELETE FROM {s}.{t}_chunk WHERE lo_xid = $1`), c.Lo)
		return err
	})
	switch {
	case errors.Is(err, errNotNow):
		return Dropped{}, nil
	case err != nil:
		return Dropped{}, err
	}
	d.Dropped = true
	return d, nil
}

var errNotNow = errors.New("not droppable now")

// chunkTx runs f in a transaction whose locks wait at most
// ChunkLockTimeout; a lock that is not granted in time is ErrChunkBusy.
func (st *Store) chunkTx(ctx context.Context, what string, f func(pgx.Tx) error) error {
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "-- store.chunkTx\nSET LOCAL lock_timeout = '"+ChunkLockTimeout+"'"); err != nil {
			return err
		}
		return f(tx)
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNotNow):
		return err
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return fmt.Errorf("%s: %w", what, ErrChunkBusy)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
