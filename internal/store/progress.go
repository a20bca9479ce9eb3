package store

import (
	"context"
	"fmt"
)

// Progress is what an in-flight range has settled since the last record:
// every message up to and including Lo has an outcome, and so has every
// message whose id is in Settled, so a reclaimer of the range (after this
// instance dies or its lease lapses) starts after Lo and skips Settled
// instead of delivering the settled messages again. The exception and
// delivery-log rows of the messages newly settled are written with it, as
// its commit would have written them.
type Progress struct {
	RangeID int64
	Token   string
	// Lo is the last position of the range's settled prefix; the zero
	// Position leaves the low bound where it is.
	Lo Position
	// Settled adds messages after Lo with an outcome (log ids) to the
	// range's settled set, which holds at most the range's messages.
	Settled    []int64
	Exceptions []ExceptionWrite
	Deliveries []DeliveryWrite
}

// RecordProgress moves the low bound of each range to its Lo and records its
// Settled set, fenced by the range's token (a range reclaimed meanwhile is
// left alone), and writes the settled messages' rows, in one statement for
// all of them. It returns the ids of the ranges it recorded; a range left
// out lost its lease (its commit will say so).
func (g Group) RecordProgress(ctx context.Context, ps []Progress, now Now) (map[int64]bool, error) {
	n := len(ps)
	ids, xids, mids := make([]int64, n), make([]int64, n), make([]int64, n)
	tokens := make([]string, n)
	var xs []ExceptionWrite
	var xr []int64
	var ds []DeliveryWrite
	var dr []int64
	sr, sm := []int64{}, []int64{}
	for i, p := range ps {
		ids[i], tokens[i], xids[i], mids[i] = p.RangeID, p.Token, p.Lo.Xid, p.Lo.ID
		for _, id := range p.Settled {
			sr, sm = append(sr, p.RangeID), append(sm, id)
		}
		for _, x := range p.Exceptions {
			xs, xr = append(xs, x), append(xr, p.RangeID)
		}
		for _, d := range p.Deliveries {
			ds, dr = append(ds, d), append(dr, p.RangeID)
		}
	}
	xc, dc := exceptionColumns(xs), deliveryColumns(ds)
	if xr == nil {
		xr = []int64{}
	}
	if dr == nil {
		dr = []int64{}
	}
	rows, err := g.db().Query(ctx, g.sql(progressSQL), g.GroupID, now, ids, tokens, xids, mids,
		xr, xc.xids, xc.ids, xc.keys, xc.concs, xc.statuses, xc.attempts, xc.delays, xc.errs, xc.afters,
		dr, dc.xids, dc.ids, dc.attempts, dc.outcomes, dc.errs, sr, sm)
	if err != nil {
		return nil, fmt.Errorf("record range progress: %w", err)
	}
	defer rows.Close()
	advanced := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("record range progress: scan: %w", err)
		}
		advanced[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record range progress: %w", err)
	}
	return advanced, nil
}

// The ranges are locked in id order (locks.go); the bound only ever moves
// up, and only under the token the caller holds; the settled set only
// grows (an earlier holder's entries stay, so a range reclaimed twice skips
// what either holder settled), within the range's messages.
var progressSQL = perStream(`-- store.RecordProgress
WITH p AS (
    SELECT p.id, p.token, p.xid, p.mid FROM unnest($3::bigint[], $4::uuid[], $5::bigint[], $6::bigint[]) AS p(id, token, xid, mid)
), rl AS (
    SELECT g.id FROM {s}.{t}_range g JOIN p ON g.id = p.id
    WHERE g.group_id = $1 AND g.token = p.token
    ORDER BY g.id FOR UPDATE OF g
), u AS (
    UPDATE {s}.{t}_range g
    SET lo_xid = CASE WHEN (g.lo_xid, g.lo_id) < (p.xid, p.mid) THEN p.xid ELSE g.lo_xid END,
        lo_id = CASE WHEN (g.lo_xid, g.lo_id) < (p.xid, p.mid) THEN p.mid ELSE g.lo_id END,
        settled = ARRAY(SELECT DISTINCT x.mid FROM (
                    SELECT unnest(g.settled) AS mid
                    UNION ALL
                    SELECT s.mid FROM unnest($23::bigint[], $24::bigint[]) AS s(rid, mid) WHERE s.rid = g.id) x
                  ORDER BY x.mid)
    FROM p
    WHERE g.id = p.id AND g.id IN (SELECT id FROM rl) AND g.token = p.token
    RETURNING g.id, g.group_id
), e AS (
    INSERT INTO {s}.{t}_exception (group_id, message_xid, message_id, message_key, concurrency, status,
                                    attempts, delays, last_error, can_run_after, created_at, updated_at)
    SELECT u.group_id, x.xid, x.id, nullif(x.key, ''), x.conc, x.status, x.attempts, x.delays, x.err,
           coalesce($2, now()) + x.after_us * interval '1 microsecond', coalesce($2, now()), coalesce($2, now())
    FROM unnest($7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[], $13::int[], $14::int[],
                $15::text[], $16::bigint[]) AS x(rid, xid, id, key, conc, status, attempts, delays, err, after_us)
    JOIN u ON u.id = x.rid
    ON CONFLICT (group_id, message_xid, message_id) DO NOTHING
), l AS (
    INSERT INTO {s}.{t}_delivery (group_id, message_xid, message_id, attempt, outcome, error, at)
    SELECT u.group_id, x.xid, x.id, x.attempt, x.outcome, x.err, coalesce($2, now())
    FROM unnest($17::bigint[], $18::bigint[], $19::bigint[], $20::int[], $21::text[], $22::text[]) AS x(rid, xid, id, attempt, outcome, err)
    JOIN u ON u.id = x.rid
)
SELECT id FROM u`)
