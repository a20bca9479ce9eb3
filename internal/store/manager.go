package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FleetWorker is a worker_config row of the manager's (no consumer group).
type FleetWorker struct {
	ID       int64
	Name     string
	Metadata []byte // the declared knobs (JSON)
}

// EnsureFleetWorker returns the fleet worker called name, creating its row
// with the metadata doc when it does not exist yet (an existing row keeps
// its declared knobs).
func (st *Store) EnsureFleetWorker(ctx context.Context, name string, doc []byte, now Now) (FleetWorker, error) {
	w := FleetWorker{Name: name}
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, st.sql(`-- store.EnsureFleetWorker
INSERT INTO %[1]s.worker_config (consumer_group_id, name, metadata, updated_at)
VALUES (NULL, $1, $2, coalesce($3, now()))
ON CONFLICT (name) WHERE consumer_group_id IS NULL DO NOTHING`), name, doc, now); err != nil {
			return err
		}
		return tx.QueryRow(ctx, st.sql(`-- store.EnsureFleetWorker
SELECT id, metadata FROM %[1]s.worker_config WHERE consumer_group_id IS NULL AND name = $1`), name).Scan(&w.ID, &w.Metadata)
	})
	if err != nil {
		return w, fmt.Errorf("ensure fleet worker %q: %w", name, err)
	}
	return w, nil
}

// DeclareFleetWorker replaces a fleet worker's knobs and appends the
// snapshot to worker_config_log (newest wins, as for group config).
func (st *Store) DeclareFleetWorker(ctx context.Context, name string, doc []byte, declaredBy string, now Now) error {
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, st.sql(`-- store.DeclareFleetWorker
INSERT INTO %[1]s.worker_config AS w (consumer_group_id, name, metadata, updated_at)
VALUES (NULL, $1, $2, coalesce($3, now()))
ON CONFLICT (name) WHERE consumer_group_id IS NULL DO UPDATE SET metadata = EXCLUDED.metadata, updated_at = EXCLUDED.updated_at
RETURNING w.id`), name, doc, now).Scan(&id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, st.sql(`-- store.DeclareFleetWorker
INSERT INTO %[1]s.worker_config_log (worker_config_id, metadata, declared_by, declared_at)
VALUES ($1, $2, $3, coalesce($4, now()))`), id, doc, declaredBy, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("declare fleet worker %q: %w", name, err)
	}
	return nil
}

// ProvisionSlotParams are ProvisionSlot's.
type ProvisionSlotParams struct {
	WorkerConfigID int64  // the fleet worker's row
	InstanceID     string // the slot's instance row, inserted when one is free
	DeclaredBy     string
	TTL            time.Duration
	Now            Now
}

// ProvisionSlot takes an instance slot of a fleet worker for InstanceID when
// fewer live instances than the row's target ("instances", default 1; 0
// suspends the worker) hold one. The worker row's lock serializes
// provisioners, so the target is never exceeded. It returns the row's
// metadata either way.
//
// A first read without the lock returns at once when the slots are all
// held: every Consume session's manager asks every TTL/3, and with a lock
// each time, hundreds of idle sessions queued on the worker row (46 ms a
// call, most of the server's CPU in the many-sessions idle window).
func (st *Store) ProvisionSlot(ctx context.Context, p ProvisionSlotParams) (ok bool, doc []byte, err error) {
	var target, live int
	if err := st.pool.QueryRow(ctx, st.sql(provisionReadSQL), p.WorkerConfigID, p.Now).Scan(&doc, &target, &live); err != nil {
		return false, nil, fmt.Errorf("provision slot: %w", err)
	}
	if live >= target {
		return false, doc, nil
	}
	err = pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, st.sql(provisionReadSQL+"\nFOR UPDATE OF w"), p.WorkerConfigID, p.Now).Scan(&doc, &target, &live); err != nil {
			return err
		}
		if live >= target {
			return nil
		}
		if _, err := tx.Exec(ctx, st.sql(`-- store.ProvisionSlot
INSERT INTO %[1]s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
VALUES ($1::uuid, $2, $3, coalesce($4, now()), coalesce($4, now()), coalesce($4, now()) + $5::interval)`),
			p.InstanceID, p.WorkerConfigID, p.DeclaredBy, p.Now, p.TTL); err != nil {
			return err
		}
		ok = true
		return nil
	})
	if err != nil {
		return false, nil, fmt.Errorf("provision slot: %w", err)
	}
	return ok, doc, nil
}

// provisionReadSQL reads a fleet worker's metadata, its target and its live
// holders: unlocked first, then again under the worker row's lock.
const provisionReadSQL = `-- store.ProvisionSlot
SELECT w.metadata, coalesce((w.metadata->>'instances')::int, 1),
       (SELECT count(*) FROM %[1]s.worker_instance i WHERE i.worker_config_id = w.id AND i.expires_at > coalesce($2, now()))
FROM %[1]s.worker_config w WHERE w.id = $1`

// RenewSlot extends a fleet worker instance's heartbeat and returns the
// worker's current metadata and how many live holders started before this
// one (a holder that finds the target lowered to or below that count gives
// its slot back, so the oldest holders keep theirs). found is false when
// the row is gone or had lapsed (another process may hold the slot now):
// the caller stops the work.
func (st *Store) RenewSlot(ctx context.Context, instanceID string, ttl time.Duration, now Now) (found bool, doc []byte, ahead int, err error) {
	err = st.pool.QueryRow(ctx, st.sql(`-- store.RenewSlot
UPDATE %[1]s.worker_instance i
SET heartbeat_at = coalesce($2, now()), expires_at = coalesce($2, now()) + $3::interval
FROM %[1]s.worker_config w
WHERE i.id = $1::uuid AND w.id = i.worker_config_id AND i.expires_at > coalesce($2, now())
RETURNING w.metadata,
          (SELECT count(*) FROM %[1]s.worker_instance o
           WHERE o.worker_config_id = i.worker_config_id AND o.expires_at > coalesce($2, now())
             AND (o.started_at, o.id) < (i.started_at, i.id))`), instanceID, now, ttl).Scan(&doc, &ahead)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil, 0, nil
	}
	if err != nil {
		return false, nil, 0, fmt.Errorf("renew slot: %w", err)
	}
	return true, doc, ahead, nil
}

// BeginRound claims a fleet worker's next round for its caller: when the
// fleet's last round of the worker (any holder's, worker_config's
// last_round_at) began at least interval ago, or never, it records now and
// returns true. Otherwise it returns false and how long ago that round
// began, so the caller waits out the rest without asking again. The worker
// row's lock serializes holders, so a worker runs one round an interval
// however many processes hold or take over its slots: a restart or a
// rolling deploy does not start a round its predecessor has just done
// (at 3,000 streams a prune round is seconds of server CPU).
func (st *Store) BeginRound(ctx context.Context, workerConfigID int64, interval time.Duration, now Now) (ok bool, since time.Duration, err error) {
	var secs float64
	err = st.pool.QueryRow(ctx, st.sql(`-- store.BeginRound
WITH claimed AS (
    UPDATE %[1]s.worker_config c SET last_round_at = coalesce($3, now())
    WHERE c.id = $1 AND (c.last_round_at IS NULL OR c.last_round_at <= coalesce($3, now()) - $2::interval)
    RETURNING c.id
)
SELECT EXISTS (SELECT 1 FROM claimed),
       greatest(coalesce(extract(epoch FROM coalesce($3, now()) - w.last_round_at), 0), 0)::float8
FROM %[1]s.worker_config w WHERE w.id = $1`), workerConfigID, interval, now).Scan(&ok, &secs)
	if err != nil {
		return false, 0, fmt.Errorf("begin round of fleet worker %d: %w", workerConfigID, err)
	}
	return ok, time.Duration(secs * float64(time.Second)), nil
}

// StreamConfigRow is a stream's id and declared config.
type StreamConfigRow struct {
	ID     int64
	Name   string
	Config []byte
}

// Streams lists every stream with its declared config.
func (st *Store) Streams(ctx context.Context) ([]StreamConfigRow, error) {
	rows, err := st.pool.Query(ctx, st.sql(`-- store.Streams
SELECT id, name, config FROM %[1]s.stream_config ORDER BY id`))
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamConfigRow, error) {
		var s StreamConfigRow
		err := r.Scan(&s.ID, &s.Name, &s.Config)
		return s, err
	})
}

// DeleteExpired drops up to limit messages of a stream produced more than
// ttl ago, oldest first, never one at or above the slowest group's
// committed position (every group's range leases, unresolved exception rows
// and cursor head) and never one that has an exception row (a dead letter
// stays listable and redrivable). It returns how many it dropped; callers
// loop in bounded batches, so no statement runs long.
func (st *Store) DeleteExpired(ctx context.Context, streamID int64, ttl time.Duration, limit int, now Now) (int64, error) {
	tag, err := st.pool.Exec(ctx, st.stream(streamID).sql(deleteExpiredSQL), now, ttl, limit)
	if err != nil {
		return 0, fmt.Errorf("retention: delete expired: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PruneBindingLedger drops up to limit superseded waiting rows of a
// stream's binding declaration ledger (see the statement).
func (st *Store) PruneBindingLedger(ctx context.Context, streamID int64, limit int) (int64, error) {
	tag, err := st.pool.Exec(ctx, st.stream(streamID).sql(pruneLedgerSQL), oneShot, limit)
	if err != nil {
		return 0, fmt.Errorf("prune binding ledger: %w", err)
	}
	return tag.RowsAffected(), nil
}

// oneShot runs a statement unprepared: parsed, planned and run in one round
// trip, and kept in no statement cache. The prune round's statements are
// per stream and run once a stream every ten minutes: prepared, a round over
// 1,000 streams cost 3,000 prepares, each a round trip of its own, and cycled
// 3,000 texts through the pool connections' statement caches (pgx keeps 512
// a connection), evicting the statements the application runs all the time.
// So do a session's occasional per-stream statements: a busy claimer's
// sweep look (LeasesExpired, once a poll tick), the heartbeat's lease
// renewals and the reconcile's look (ForgetUnknownRanges). Over 1,000
// streams they were 1,644 prepares in a 3.9 s running round, each new to its
// connection (decision 0061); one stream ran them 12 to 20 times a round,
// re-planning each a few tens of microseconds.
const oneShot = pgx.QueryExecModeExec

// PruneDeliveries drops up to limit delivery-log rows older than age.
func (st *Store) PruneDeliveries(ctx context.Context, streamID int64, age time.Duration, limit int, now Now) (int64, error) {
	tag, err := st.pool.Exec(ctx, st.stream(streamID).sql(pruneDeliveriesSQL), oneShot, now, age, limit)
	if err != nil {
		return 0, fmt.Errorf("prune delivery log: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PruneIdempotency drops up to limit idempotency keys older than age.
func (st *Store) PruneIdempotency(ctx context.Context, streamID int64, age time.Duration, limit int, now Now) (int64, error) {
	tag, err := st.pool.Exec(ctx, st.stream(streamID).sql(pruneIdempotencySQL), oneShot, now, age, limit)
	if err != nil {
		return 0, fmt.Errorf("prune idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PruneInstances drops up to limit worker_instance rows that expired more
// than keep ago. Nothing references them once expired: a key lease or range
// naming a missing owner is as free as one naming an expired owner.
func (st *Store) PruneInstances(ctx context.Context, keep time.Duration, limit int, now Now) (int64, error) {
	tag, err := st.pool.Exec(ctx, st.sql(`-- store.PruneInstances
WITH victims AS (
    SELECT id FROM %[1]s.worker_instance WHERE expires_at < coalesce($1, now()) - $2::interval LIMIT $3
)
DELETE FROM %[1]s.worker_instance i USING victims v WHERE i.id = v.id`), now, keep, limit)
	if err != nil {
		return 0, fmt.Errorf("prune worker instances: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PruneConfigLogs keeps the newest keep snapshots per worker in
// worker_config_log and per stream in stream_config_log, dropping up to
// limit older ones of each.
func (st *Store) PruneConfigLogs(ctx context.Context, keep, limit int) (int64, error) {
	var total int64
	for _, q := range []string{`-- store.PruneConfigLogs
WITH victims AS (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY worker_config_id ORDER BY id DESC) AS rn
        FROM %[1]s.worker_config_log
    ) r WHERE rn > $1 ORDER BY id LIMIT $2
)
DELETE FROM %[1]s.worker_config_log l USING victims v WHERE l.id = v.id`, `-- store.PruneConfigLogs
WITH victims AS (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY stream_id ORDER BY id DESC) AS rn
        FROM %[1]s.stream_config_log
    ) r WHERE rn > $1 ORDER BY id LIMIT $2
)
DELETE FROM %[1]s.stream_config_log l USING victims v WHERE l.id = v.id`} {
		tag, err := st.pool.Exec(ctx, st.sql(q), keep, limit)
		if err != nil {
			return total, fmt.Errorf("prune config logs: %w", err)
		}
		total += tag.RowsAffected()
	}
	return total, nil
}

// The retention and prune statements over a stream's tables.

// Row by row only in the default partition (rows no chunk covered;
// whole chunks go by DropChunk). The victims are read through the
// (xid, id) index from its start, never above the floor (floorCTE).
var deleteExpiredSQL = perStream(`-- store.DeleteExpired
WITH ` + floorCTE + `, victims AS (
    SELECT m.xid, m.id FROM {s}.{t}_log_default m
    WHERE m.produced_at < coalesce($1, now()) - $2::interval
      AND (NOT EXISTS (SELECT 1 FROM floor) OR (m.xid, m.id) <= (SELECT f.xid, f.id FROM floor f))
      AND NOT EXISTS (SELECT 1 FROM {s}.{t}_exception x WHERE x.message_xid = m.xid AND x.message_id = m.id)
    ORDER BY m.xid, m.id
    LIMIT $3
)
DELETE FROM {s}.{t}_log_default l USING victims v WHERE l.xid = v.xid AND l.id = v.id`)

// The binding ledger's deferred cleanup (seed 0511): installed rows
// stay (the set-change audit); a waiting row goes once it is
// superseded, that is, when a newer installed row closed its wait or
// its declarer appended a newer waiting row. Rows are
// self-contained (declared_at rides on every attempt), so dropping
// older attempts loses neither the listing nor a wait's start.
var pruneLedgerSQL = perStream(`-- store.PruneBindingLedger
WITH inst AS (
    SELECT group_id, max(id) AS id FROM {s}.{t}_binding_declaration WHERE status = 'installed' GROUP BY group_id
), newest AS (
    SELECT DISTINCT ON (d.group_id, d.declared_by) d.id
    FROM {s}.{t}_binding_declaration d LEFT JOIN inst ON inst.group_id = d.group_id
    WHERE d.status = 'waiting' AND d.id > coalesce(inst.id, 0)
    ORDER BY d.group_id, d.declared_by, d.id DESC
), victims AS (
    SELECT d.id FROM {s}.{t}_binding_declaration d
    WHERE d.status = 'waiting' AND d.id NOT IN (SELECT id FROM newest)
    ORDER BY d.id LIMIT $1
)
DELETE FROM {s}.{t}_binding_declaration b USING victims v WHERE b.id = v.id AND b.status = 'waiting'`)

var pruneDeliveriesSQL = perStream(`-- store.PruneDeliveries
WITH victims AS (
    SELECT id FROM {s}.{t}_delivery WHERE at < coalesce($1, now()) - $2::interval ORDER BY at LIMIT $3
)
DELETE FROM {s}.{t}_delivery d USING victims v WHERE d.id = v.id`)

var pruneIdempotencySQL = perStream(`-- store.PruneIdempotency
WITH victims AS (
    SELECT key FROM {s}.{t}_idempotency WHERE created_at < coalesce($1, now()) - $2::interval LIMIT $3
)
DELETE FROM {s}.{t}_idempotency i USING victims v WHERE i.key = v.key`)
