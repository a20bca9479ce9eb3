package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A group's status: its positions and what it has left, by state, read in
// one READ ONLY snapshot for the operator's read-only group handle.

// StatusRow is a group's state at one snapshot.
type StatusRow struct {
	Now time.Time
	// Committed and Cursor are the last log rows at or before the group's
	// committed position and its cursor (the raw position when no row is):
	// a cursor placed by the head rule, (xmin, 0), reads as the message
	// before it rather than as message 0.
	Committed Position // every position at or below it is settled
	Cursor    Position // the highest position claimed into a range
	Head      Position // the stream's newest visible position ({0,0}: empty)
	// Available counts the messages after the cursor the group's binding
	// set matches; InFlight the matching messages of outstanding ranges not
	// recorded as settled, and the exception rows leased now. Each reads at
	// most the bound it was read with: past it, the count is an estimate
	// from the ids (Estimated).
	Available, InFlight int64
	Estimated           bool
	// Retrying counts exception rows waiting for an attempt (on the curve,
	// parked behind a key, or whose lease lapsed), Quarantined those split
	// out of a reclaimed range and not attempted yet, Dead the dead letters.
	Retrying, Quarantined, Dead int64
	// Oldest is the produced_at of the first position after Committed
	// (zero when there is none).
	Oldest                time.Time
	Ranges, ExpiredRanges int64
	Bindings              int64 // installed binding patterns (0: the whole stream)
	Instances             []InstanceRow
}

// Status reads the group's state in one snapshot. bound limits the log
// positions each of the available and in-flight counts reads (one index
// probe, and with bindings one heap row, per position).
func (g Group) Status(ctx context.Context, bound int64, now Now) (StatusRow, error) {
	var s StatusRow
	err := g.st.readOnly(ctx, "group status", func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "-- store.Status\nSELECT coalesce($1, now())", now).Scan(&s.Now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, g.sql(committedSQL), g.GroupID).Scan(&s.Committed.Xid, &s.Committed.ID); err != nil {
			return fmt.Errorf("committed position: %w", err)
		}
		var cursor Position
		if err := tx.QueryRow(ctx, g.sql(statusCursorSQL), g.GroupID).Scan(&cursor.Xid, &cursor.ID); err != nil {
			return fmt.Errorf("cursor: %w", err)
		}
		err := tx.QueryRow(ctx, g.sql(statusHeadSQL)).Scan(&s.Head.Xid, &s.Head.ID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("head: %w", err)
		}
		err = tx.QueryRow(ctx, g.sql(statusOldestSQL), s.Committed.Xid, s.Committed.ID).Scan(&s.Oldest)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("oldest unconsumed: %w", err)
		}
		var excInFlight int64
		if err := tx.QueryRow(ctx, g.sql(statusCountsSQL), g.GroupID, now).Scan(&s.Ranges, &s.ExpiredRanges,
			&excInFlight, &s.Retrying, &s.Quarantined, &s.Dead, &s.Bindings); err != nil {
			return fmt.Errorf("counts: %w", err)
		}
		if err := g.statusAvailable(ctx, tx, &s, cursor, bound); err != nil {
			return err
		}
		if err := g.statusInFlight(ctx, tx, &s, bound); err != nil {
			return err
		}
		s.InFlight += excInFlight
		if s.Committed, err = g.atOrBefore(ctx, tx, s.Committed); err != nil {
			return fmt.Errorf("committed position: %w", err)
		}
		if s.Cursor, err = g.atOrBefore(ctx, tx, cursor); err != nil {
			return fmt.Errorf("cursor: %w", err)
		}
		rows, err := tx.Query(ctx, g.st.sql(`-- store.Status
SELECT i.id::text, w.name, i.declared_by, i.started_at, i.heartbeat_at, i.expires_at, true
FROM %[1]s.worker_instance i JOIN %[1]s.worker_config w ON w.id = i.worker_config_id
WHERE w.consumer_group_id = $1 AND i.expires_at > coalesce($2, now())
ORDER BY w.name, i.started_at
LIMIT 1000`), g.GroupID, now)
		if err != nil {
			return fmt.Errorf("live instances: %w", err)
		}
		s.Instances, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstanceRow, error) {
			var i InstanceRow
			err := r.Scan(&i.ID, &i.Worker, &i.DeclaredBy, &i.StartedAt, &i.HeartbeatAt, &i.ExpiresAt, &i.Live)
			return i, err
		})
		return err
	})
	return s, err
}

// statusAvailable counts the messages after the cursor: at most bound
// positions in log order, the matching ones among them, and past the bound
// an estimate, the ids after the last position read scaled by the share
// that matched.
func (g Group) statusAvailable(ctx context.Context, tx pgx.Tx, s *StatusRow, cursor Position, bound int64) error {
	var read, matched, lastID int64
	q, args := statusAvailableSQL, []any{cursor.Xid, cursor.ID, bound + 1}
	if s.Bindings > 0 {
		q, args = statusAvailableBoundSQL, append(args, g.GroupID)
	}
	if err := tx.QueryRow(ctx, g.sql(q), args...).Scan(&read, &matched, &lastID); err != nil {
		return fmt.Errorf("available: %w", err)
	}
	s.Available = matched
	if read > bound {
		s.Estimated = true
		if rest := s.Head.ID - lastID; rest > 0 {
			s.Available += rest * matched / read
		}
	}
	return nil
}

// statusInFlight counts the matching messages of the group's outstanding
// ranges not recorded as settled, reading at most bound of them; past it,
// the estimate is the ranges' id spans less what they recorded.
func (g Group) statusInFlight(ctx context.Context, tx pgx.Tx, s *StatusRow, bound int64) error {
	var n, span int64
	if err := tx.QueryRow(ctx, g.sql(statusInFlightSQL), g.GroupID, bound+1).Scan(&n, &span); err != nil {
		return fmt.Errorf("in flight: %w", err)
	}
	s.InFlight = n
	if n > bound {
		s.Estimated = true
		s.InFlight = max(bound, span)
	}
	return nil
}

// atOrBefore returns the last log row at or before p, or p itself when no
// row is (an empty or pruned log).
func (g Group) atOrBefore(ctx context.Context, tx pgx.Tx, p Position) (Position, error) {
	var at Position
	err := tx.QueryRow(ctx, g.sql(atOrBeforeSQL), p.Xid, p.ID).Scan(&at.Xid, &at.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	return at, err
}

var atOrBeforeSQL = perStream(`-- store.Status and store.Seek: the last row at or before a position
SELECT xid, id FROM {s}.{t}_log WHERE (xid, id) <= ($1, $2) AND xid <= $1 ORDER BY xid DESC, id DESC LIMIT 1`)

var statusCursorSQL = perStream(`-- store.Status
SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1`)

var statusHeadSQL = perStream(`-- store.Status
SELECT xid, id FROM {s}.{t}_log ORDER BY xid DESC, id DESC LIMIT 1`)

// Without bindings every position is the group's: an index-only count.
var statusAvailableSQL = perStream(`-- store.Status
SELECT count(*), count(*), coalesce(max(l.id), 0) FROM (
    SELECT id FROM {s}.{t}_log WHERE (xid, id) > ($1, $2) AND xid >= $1 ORDER BY xid, id LIMIT $3
) l`)

// With bindings, a position is the group's when its routing key matches
// the installed set, as the claim decides (claimMessagesSQL).
var statusAvailableBoundSQL = perStream(`-- store.Status
WITH binds AS (
    SELECT array_agg(regex) AS rx FROM {s}.{t}_binding WHERE group_id = $4
)
SELECT count(*),
       count(*) FILTER (WHERE l.routing_key IS NOT NULL
                          AND EXISTS (SELECT 1 FROM unnest((SELECT rx FROM binds)) AS r(x) WHERE ('.' || l.routing_key) ~ r.x)),
       coalesce(max(l.id), 0)
FROM (
    SELECT id, routing_key FROM {s}.{t}_log WHERE (xid, id) > ($1, $2) AND xid >= $1 ORDER BY xid, id LIMIT $3
) l`)

// A range's messages not recorded as settled: after its prefix (lo), up to
// hi, not among those settled beyond it, matching the group's set.
var statusInFlightSQL = perStream(`-- store.Status
WITH binds AS (
    SELECT array_agg(regex) AS rx FROM {s}.{t}_binding WHERE group_id = $1
)
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM {s}.{t}_range r
            CROSS JOIN LATERAL (
                SELECT l.routing_key FROM {s}.{t}_log l
                WHERE (l.xid, l.id) > (r.lo_xid, r.lo_id) AND (l.xid, l.id) <= (r.hi_xid, r.hi_id)
                  AND l.xid >= r.lo_xid AND l.xid <= r.hi_xid
                  AND l.id <> ALL (r.settled)
            ) l
            WHERE r.group_id = $1
              AND ((SELECT rx FROM binds) IS NULL
                   OR (l.routing_key IS NOT NULL
                       AND EXISTS (SELECT 1 FROM unnest((SELECT rx FROM binds)) AS r(x) WHERE ('.' || l.routing_key) ~ r.x)))
            LIMIT $2) x),
       (SELECT coalesce(sum(greatest(hi_id - lo_id - cardinality(settled), 0)), 0)::bigint FROM {s}.{t}_range WHERE group_id = $1)`)

var statusOldestSQL = perStream(`-- store.Status
SELECT produced_at FROM {s}.{t}_log WHERE (xid, id) > ($1, $2) ORDER BY xid, id LIMIT 1`)

// An exception row is in flight while a live lease holds it (running, or
// queued behind its key's head or prefetched); a quarantined row is a
// pending one whose only error is the quarantine's.
var statusCountsSQL = perStream(`-- store.Status
SELECT (SELECT count(*) FROM {s}.{t}_range WHERE group_id = $1),
       (SELECT count(*) FROM {s}.{t}_range WHERE group_id = $1 AND expires_at <= coalesce($2, now())),
       count(*) FILTER (WHERE x.leased),
       count(*) FILTER (WHERE x.status <> 'dead' AND NOT x.leased AND NOT x.quarantined),
       count(*) FILTER (WHERE x.status <> 'dead' AND NOT x.leased AND x.quarantined),
       count(*) FILTER (WHERE x.status = 'dead'),
       (SELECT count(*) FROM {s}.{t}_binding WHERE group_id = $1)
FROM (SELECT status,
             status IN ('running', 'queued') AND expires_at > coalesce($2, now()) AS leased,
             attempts = 0 AND last_error LIKE 'quarantined:%' AS quarantined
      FROM {s}.{t}_exception WHERE group_id = $1) x`)
