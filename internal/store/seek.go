package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrGroupActive reports an operator action refused because the group has
// live instances (or leases that have not lapsed yet): moving a cursor
// under running consumers would race their claims and commits.
var ErrGroupActive = errors.New("consumer group is active")

// ErrSeekTarget reports a seek target outside the retained log: a message
// id retention dropped or that was never produced.
var ErrSeekTarget = errors.New("seek target outside the retained log")

// Seek targets.
const (
	SeekBeginning = "beginning" // before the first retained position
	SeekHead      = "head"      // after every position final now (the Start head rule)
	SeekTime      = "time"      // before the first position whose produced_at ≥ Time
	SeekID        = "id"        // before message ID
)

// SeekRequest moves a group's cursor.
type SeekRequest struct {
	To     string // SeekBeginning, SeekHead, SeekTime or SeekID
	Time   time.Time
	ID     int64
	DryRun bool // compute and count, change nothing (a READ ONLY transaction)
	Now    Now
}

// SeekResult is what a seek found and did (or would do, on a dry run).
type SeekResult struct {
	BeforeCursor    Position
	BeforeCommitted Position
	After           Position
	// Ranges, Retrying and Dead count the rows dropped: every range (no
	// live instance holds one), and the exception rows after After, whose
	// messages the log delivers again from attempt zero.
	Ranges, Retrying, Dead, KeyLeases int64
}

// Seek moves the group's cursor to req's target, in one transaction that
// first locks the cursor row (lock order, locks.go), and refuses with
// ErrGroupActive while any instance of the group is live or any of its
// range, exception or key leases has not expired. It drops every range row
// and key lease, and the exception rows after the new cursor; exception
// rows at or below it stay (a retrying message keeps retrying, a dead
// letter stays one). Decision 0024.
func (g Group) Seek(ctx context.Context, req SeekRequest) (SeekResult, error) {
	var res SeekResult
	f := func(tx pgx.Tx) error {
		lock := ""
		if !req.DryRun {
			lock = " FOR UPDATE"
		}
		if err := tx.QueryRow(ctx, g.sql(seekCursorSQL)+lock, g.GroupID).Scan(&res.BeforeCursor.Xid, &res.BeforeCursor.ID); err != nil {
			return fmt.Errorf("read cursor: %w", err)
		}
		if err := tx.QueryRow(ctx, g.sql(committedSQL), g.GroupID).Scan(&res.BeforeCommitted.Xid, &res.BeforeCommitted.ID); err != nil {
			return fmt.Errorf("committed position: %w", err)
		}
		var live, leases int64
		var until *time.Time
		if err := tx.QueryRow(ctx, g.sql(seekActiveSQL), g.GroupID, req.Now).Scan(&live, &leases, &until); err != nil {
			return fmt.Errorf("check for live instances: %w", err)
		}
		if live > 0 {
			return fmt.Errorf("%w: %d live instance(s); stop its consumers first (seek moves the cursor only of a stopped group)", ErrGroupActive, live)
		}
		if leases > 0 {
			return fmt.Errorf("%w: %d lease(s) of stopped instances last until %s; try again after that", ErrGroupActive, leases, until.UTC().Format(time.RFC3339))
		}
		after, err := g.seekTarget(ctx, tx, req)
		if err != nil {
			return err
		}
		res.After = after
		q, args := seekApplySQL, []any{g.GroupID, after.Xid, after.ID, req.Now}
		if req.DryRun {
			q, args = seekCountSQL, args[:3]
		}
		if err := tx.QueryRow(ctx, g.sql(q), args...).Scan(&res.Ranges, &res.Retrying, &res.Dead, &res.KeyLeases); err != nil {
			return err
		}
		// Reported as the last messages at or before them: a cursor placed
		// by the head rule, (xmin, 0), reads as the head, not as message 0.
		for _, p := range []*Position{&res.BeforeCursor, &res.BeforeCommitted, &res.After} {
			if *p, err = g.atOrBefore(ctx, tx, *p); err != nil {
				return fmt.Errorf("read the log at the positions: %w", err)
			}
		}
		return nil
	}
	var err error
	if req.DryRun {
		err = g.st.readOnly(ctx, "", f)
	} else {
		err = pgx.BeginFunc(ctx, g.st.pool, f)
	}
	if err != nil {
		return SeekResult{}, err
	}
	return res, nil
}

// seekTarget is the cursor position req names.
func (g Group) seekTarget(ctx context.Context, tx pgx.Tx, req SeekRequest) (Position, error) {
	var p Position
	head := func() (Position, error) {
		err := tx.QueryRow(ctx, "-- store.Seek\nSELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&p.Xid)
		p.ID = 0
		return p, err
	}
	before := func(err error) (Position, error) {
		if errors.Is(err, pgx.ErrNoRows) {
			return head()
		}
		p.ID--
		return p, err
	}
	switch req.To {
	case SeekBeginning:
		err := tx.QueryRow(ctx, g.sql(seekFirstSQL)).Scan(&p.Xid, &p.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			return Position{}, nil
		}
		p.ID--
		return p, err
	case SeekHead:
		return head()
	case SeekTime:
		return before(tx.QueryRow(ctx, g.sql(seekTimeSQL), req.Time).Scan(&p.Xid, &p.ID))
	case SeekID:
		err := tx.QueryRow(ctx, g.sql(seekIDSQL), req.ID).Scan(&p.Xid, &p.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			var first, last *int64
			if err := tx.QueryRow(ctx, g.sql(seekBoundsSQL)).Scan(&first, &last); err != nil {
				return p, fmt.Errorf("read the retained log's bounds: %w", err)
			}
			switch {
			case first == nil:
				return p, fmt.Errorf("%w: message %d: the stream's log is empty", ErrSeekTarget, req.ID)
			case req.ID < *first:
				return p, fmt.Errorf("%w: message %d is before the retained log (its first message is %d)", ErrSeekTarget, req.ID, *first)
			case req.ID > *last:
				return p, fmt.Errorf("%w: message %d has not been produced (the newest is %d)", ErrSeekTarget, req.ID, *last)
			}
			return p, fmt.Errorf("%w: message %d is not in the log (its transaction rolled back)", ErrSeekTarget, req.ID)
		}
		p.ID--
		return p, err
	}
	return p, fmt.Errorf("seek target %q: want %s, %s, %s or %s", req.To, SeekBeginning, SeekHead, SeekTime, SeekID)
}

var seekCursorSQL = perStream(`-- store.Seek
SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1`)

// A group is active while an instance row is live or a lease of its
// ranges, exception runs or keys has not expired.
var seekActiveSQL = perStream(`-- store.Seek
WITH leases AS (
    SELECT expires_at FROM {s}.{t}_range WHERE group_id = $1 AND expires_at > coalesce($2, now())
    UNION ALL
    SELECT expires_at FROM {s}.{t}_exception WHERE group_id = $1 AND expires_at > coalesce($2, now())
    UNION ALL
    SELECT expires_at FROM {s}.{t}_key_lease WHERE group_id = $1 AND expires_at > coalesce($2, now())
)
SELECT (SELECT count(*) FROM {s}.worker_instance i JOIN {s}.worker_config w ON w.id = i.worker_config_id
        WHERE w.consumer_group_id = $1 AND i.expires_at > coalesce($2, now())),
       (SELECT count(*) FROM leases), (SELECT max(expires_at) FROM leases)`)

var seekFirstSQL = perStream(`-- store.Seek
SELECT xid, id FROM {s}.{t}_log ORDER BY xid, id LIMIT 1`)

var seekTimeSQL = perStream(`-- store.Seek
SELECT xid, id FROM {s}.{t}_log WHERE produced_at >= $1 ORDER BY xid, id LIMIT 1`)

var seekIDSQL = perStream(`-- store.Seek
SELECT xid, id FROM {s}.{t}_log WHERE id = $1`)

var seekBoundsSQL = perStream(`-- store.Seek
SELECT min(id), max(id) FROM {s}.{t}_log`)

var seekCountSQL = perStream(`-- store.Seek
SELECT (SELECT count(*) FROM {s}.{t}_range WHERE group_id = $1),
       (SELECT count(*) FROM {s}.{t}_exception WHERE group_id = $1 AND status <> 'dead' AND (message_xid, message_id) > ($2, $3)),
       (SELECT count(*) FROM {s}.{t}_exception WHERE group_id = $1 AND status = 'dead' AND (message_xid, message_id) > ($2, $3)),
       (SELECT count(*) FROM {s}.{t}_key_lease WHERE group_id = $1 AND message_key <> '')`)

// The cursor row is locked already; the rest follows the lock order: ranges
// by id, exception rows by key, key leases by key, each step reading the
// one before so that they run in that order.
var seekApplySQL = perStream(`-- store.Seek
WITH cur AS (
    UPDATE {s}.{t}_cursor SET head_xid = $2, head_id = $3, updated_at = coalesce($4, now())
    WHERE group_id = $1
    RETURNING group_id
), rl AS (
    SELECT r.id FROM {s}.{t}_range r, cur WHERE r.group_id = cur.group_id ORDER BY r.id FOR UPDATE OF r
), rd AS (
    DELETE FROM {s}.{t}_range r USING rl WHERE r.id = rl.id RETURNING r.id
), xl AS (
    SELECT x.message_xid, x.message_id FROM {s}.{t}_exception x
    WHERE x.group_id = $1 AND (x.message_xid, x.message_id) > ($2, $3)
      AND (SELECT count(*) FROM rd) >= 0
    ORDER BY x.message_xid, x.message_id FOR UPDATE OF x
), xd AS (
    DELETE FROM {s}.{t}_exception x USING xl
    WHERE x.group_id = $1 AND x.message_xid = xl.message_xid AND x.message_id = xl.message_id
    RETURNING x.status
), kl AS (
    SELECT k.message_key FROM {s}.{t}_key_lease k
    WHERE k.group_id = $1 AND k.message_key <> '' AND (SELECT count(*) FROM xd) >= 0
    ORDER BY k.message_key FOR UPDATE OF k
), kd AS (
    DELETE FROM {s}.{t}_key_lease k USING kl WHERE k.group_id = $1 AND k.message_key = kl.message_key RETURNING 1
)
SELECT (SELECT count(*) FROM rd),
       (SELECT count(*) FROM xd WHERE status <> 'dead'),
       (SELECT count(*) FROM xd WHERE status = 'dead'),
       (SELECT count(*) FROM kd)`)
