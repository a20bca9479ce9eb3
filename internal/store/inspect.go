package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Inspection: what a group's state is, for the API's listings, the
// simulator's invariants and tests. Nothing here is on the claim path.

// Committed is the group's committed position: every message at or below
// it is settled. Dead letters do not hold it back.
func (g Group) Committed(ctx context.Context) (Position, error) {
	var p Position
	err := g.st.pool.QueryRow(ctx, g.sql(committedSQL), g.GroupID).Scan(&p.Xid, &p.ID)
	if err != nil {
		return p, fmt.Errorf("committed position: %w", err)
	}
	return p, nil
}

// Lease is one outstanding range lease, for inspection and tests.
type Lease struct {
	ID       int64
	Token    string
	Owner    string
	Reclaims int
}

// RangeLeases lists a group's outstanding leases.
func (g Group) RangeLeases(ctx context.Context) ([]Lease, error) {
	rows, err := g.st.pool.Query(ctx, g.sql(rangeLeasesSQL), g.GroupID)
	if err != nil {
		return nil, fmt.Errorf("range leases: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
		var l Lease
		err := r.Scan(&l.ID, &l.Token, &l.Owner, &l.Reclaims)
		return l, err
	})
}

// Unaccounted returns those of ids (messages the caller has not seen
// settled) that the group no longer holds anywhere: below the cursor head,
// in no outstanding range, with no exception row. The simulator's
// no-message-lost invariant; it must always be empty.
func (g Group) Unaccounted(ctx context.Context, ids []int64) ([]int64, error) {
	rows, err := g.st.pool.Query(ctx, g.sql(unaccountedSQL), g.GroupID, ids)
	if err != nil {
		return nil, fmt.Errorf("unaccounted: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// DeadLetter is a dead exception row.
type DeadLetter struct {
	MessageID  int64
	Attempts   int
	LastError  string
	DiedAt     time.Time
	Key        string
	RoutingKey string
	Version    int
	ProducedAt time.Time
}

// ListDead pages through a group's dead letters in message id order.
func (g Group) ListDead(ctx context.Context, afterID int64, limit int) ([]DeadLetter, error) {
	rows, err := g.st.q().Query(ctx, g.sql(listDeadSQL), g.GroupID, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.MessageID, &d.Attempts, &d.LastError, &d.DiedAt, &d.Key, &d.RoutingKey, &d.Version, &d.ProducedAt)
		return d, err
	})
}

// Redrive puts one dead letter (messageID) or all of them (nil) back on the
// curve from attempt zero, due now. It returns how many were redriven.
func (g Group) Redrive(ctx context.Context, messageID *int64, now Now) (int64, error) {
	tag, err := g.st.pool.Exec(ctx, g.sql(redriveSQL), g.GroupID, messageID, now)
	if err != nil {
		return 0, err // the caller names the redrive
	}
	return tag.RowsAffected(), nil
}

// RedriveIDs redrives the dead letters among ids and returns how many were
// dead.
func (g Group) RedriveIDs(ctx context.Context, ids []int64, now Now) (int64, error) {
	tag, err := g.st.pool.Exec(ctx, g.sql(redriveIDsSQL), g.GroupID, ids, now)
	if err != nil {
		return 0, err // the caller names the redrive
	}
	return tag.RowsAffected(), nil
}

// ExceptionState is an exception row as tests and inspection see it.
type ExceptionState struct {
	MessageID   int64
	Status      string
	Attempts    int
	Delays      int
	LastError   string
	CanRunAfter time.Time
	Concurrency string
}

// ExceptionStates lists a group's exception rows in log order.
func (g Group) ExceptionStates(ctx context.Context) ([]ExceptionState, error) {
	rows, err := g.st.pool.Query(ctx, g.sql(exceptionStateSQL), g.GroupID)
	if err != nil {
		return nil, fmt.Errorf("exception states: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExceptionState, error) {
		var e ExceptionState
		err := r.Scan(&e.MessageID, &e.Status, &e.Attempts, &e.Delays, &e.LastError, &e.CanRunAfter, &e.Concurrency)
		return e, err
	})
}

// The inspection statements.

// The committed position: everything at or below it is settled.
// Outstanding ranges and unresolved (non-dead) exception rows pin
// it; dead letters never do.
var committedSQL = perStream(`-- store.Committed
SELECT p.xid, p.id FROM (
    SELECT lo_xid AS xid, lo_id AS id FROM {s}.{t}_range WHERE group_id = $1
    UNION ALL
    SELECT x.message_xid, x.message_id - 1 FROM {s}.{t}_exception x WHERE x.group_id = $1 AND x.status <> 'dead'
    UNION ALL
    SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1
) p ORDER BY p.xid, p.id LIMIT 1`)

var rangeLeasesSQL = perStream(`-- store.RangeLeases
SELECT id, token::text, owner::text, reclaims FROM {s}.{t}_range WHERE group_id = $1 ORDER BY id`)

var unaccountedSQL = perStream(`-- store.Unaccounted
SELECT m.id FROM {s}.{t}_log m
WHERE m.id = ANY($2::bigint[])
  AND NOT EXISTS (SELECT 1 FROM {s}.{t}_exception x
                  WHERE x.group_id = $1 AND x.message_xid = m.xid AND x.message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM {s}.{t}_range g
                  WHERE g.group_id = $1 AND (m.xid, m.id) > (g.lo_xid, g.lo_id) AND (m.xid, m.id) <= (g.hi_xid, g.hi_id))
  AND (m.xid, m.id) <= (SELECT c.head_xid, c.head_id FROM {s}.{t}_cursor c WHERE c.group_id = $1)
ORDER BY m.id`)

var listDeadSQL = perStream(`-- store.ListDead
SELECT x.message_id, x.attempts, x.last_error, x.updated_at, coalesce(x.message_key, ''),
       coalesce(m.routing_key, ''), m.version, m.produced_at
FROM {s}.{t}_exception x JOIN {s}.{t}_log m ON m.xid = x.message_xid AND m.id = x.message_id
WHERE x.group_id = $1 AND x.status = 'dead' AND x.message_id > $2
ORDER BY x.message_id
LIMIT $3`)

// A redrive puts dead letters back on the curve from attempt zero.
var redriveSQL = perStream(`-- store.Redrive
UPDATE {s}.{t}_exception
SET status = 'pending', attempts = 0, delays = 0, can_run_after = coalesce($3, now()),
    last_error = 'redriven after: ' || last_error, updated_at = coalesce($3, now())
WHERE group_id = $1 AND status = 'dead' AND ($2::bigint IS NULL OR message_id = $2)`)

var redriveIDsSQL = perStream(`-- store.RedriveIDs
UPDATE {s}.{t}_exception
SET status = 'pending', attempts = 0, delays = 0, can_run_after = coalesce($3, now()),
    last_error = 'redriven after: ' || last_error, updated_at = coalesce($3, now())
WHERE group_id = $1 AND status = 'dead' AND message_id = ANY($2::bigint[])`)

var exceptionStateSQL = perStream(`-- store.ExceptionStates
SELECT x.message_id, x.status, x.attempts, x.delays, x.last_error, x.can_run_after, x.concurrency
FROM {s}.{t}_exception x WHERE x.group_id = $1 ORDER BY x.message_xid, x.message_id`)
