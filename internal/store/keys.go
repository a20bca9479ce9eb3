package store

import (
	"context"
	"fmt"
	"time"
)

// KeyClaim is one key a claimer wants for a keyed message. An Ordered key
// is checked for an unresolved message before Position.
type KeyClaim struct {
	Key     string
	Ordered bool
	Position
}

// RangeKeys asks whether a range's keyed messages may run. A range holds
// the keys of its messages for as long as it is outstanding and its owner
// is live, without a row per key (decision 0043): the claim that wrote the
// range row committed before this statement, so of two holders that want
// one key at once, the later to look sees the earlier.
type RangeKeys struct {
	// RangeID is the caller's own range: an ordered key is not blocked by
	// its earlier messages there.
	RangeID int64
	// Owner is the range claimer's instance: its other ranges do not make a
	// key busy (the claimer shares those keys in memory).
	Owner string
	Want  []KeyClaim
	Now   Now
}

// RangeKeys returns the wanted keys that another live holder has (busy:
// another instance's outstanding range holds a message of the key, or an
// exception row's key lease), and the ordered keys that must wait for an
// earlier unresolved message (blocked: a non-dead exception row, or a
// message inside another outstanding range). Every other key may run.
// It writes nothing; each statement answers in one snapshot. When only
// exclusive keys are wanted, a gate statement that finds nobody else
// holding anything answers alone.
func (g Group) RangeKeys(ctx context.Context, r RangeKeys) (busy, blocked map[string]bool, err error) {
	keys := make([]string, len(r.Want))
	ordered := make([]bool, len(r.Want))
	xids := make([]int64, len(r.Want))
	ids := make([]int64, len(r.Want))
	anyOrdered := false
	for i, k := range r.Want {
		keys[i], ordered[i], xids[i], ids[i] = k.Key, k.Ordered, k.Xid, k.ID
		anyOrdered = anyOrdered || k.Ordered
	}
	busy, blocked = map[string]bool{}, map[string]bool{}
	if !anyOrdered {
		// Exclusive keys only: nearly always nobody else holds anything,
		// which a statement cheap to plan says. The full one took about
		// 1 ms to plan, and a range's keys wait for it.
		var contended bool
		if err := g.st.pool.QueryRow(ctx, g.sql(keysContendedSQL), g.GroupID, r.Owner, r.Now).Scan(&contended); err != nil {
			return nil, nil, fmt.Errorf("range keys: %w", err)
		}
		if !contended {
			return busy, blocked, nil
		}
	}
	rows, err := g.st.pool.Query(ctx, g.sql(rangeKeysSQL), g.GroupID, keys, ordered, xids, ids, r.Owner, r.Now, r.RangeID, anyOrdered)
	if err != nil {
		return nil, nil, fmt.Errorf("range keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var isBlocked bool
		if err := rows.Scan(&key, &isBlocked); err != nil {
			return nil, nil, fmt.Errorf("range keys: scan: %w", err)
		}
		if isBlocked {
			blocked[key] = true
		} else {
			busy[key] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("range keys: %w", err)
	}
	return busy, blocked, nil
}

// AcquireKeys is a request for key leases: the exception claimer's, for
// the keyed rows it starts.
type AcquireKeys struct {
	Want []KeyClaim
	// Token and Owner are the lease's: the exception row's token, and the
	// worker instance.
	Token, Owner string
	TTL          time.Duration
	Now          Now
}

// AcquireKeys leases the keys that are free (or whose holder lapsed) under
// the token for the owner, and returns the keys held. Ranges hold their
// exclusive keys without lease rows (RangeKeys), so it takes two
// transactions: the leases are committed first, then the exclusive keys an
// outstanding range of a live owner holds are given back. Of a range
// claimer and this caller wanting one key at once, the later to look sees
// the other. An ordered key needs no second look: the exception claim
// took its row only if no outstanding range held an earlier message of
// the key, and a later one waits for it.
func (g Group) AcquireKeys(ctx context.Context, a AcquireKeys) (held map[string]bool, err error) {
	keys := make([]string, len(a.Want))
	for i, k := range a.Want {
		keys[i] = k.Key
	}
	held = map[string]bool{}
	if err := g.collectKeys(ctx, held, true, g.sql(acquireKeysSQL), g.GroupID, keys, a.Token, a.Owner, a.Now, a.TTL); err != nil {
		return nil, err
	}
	var taken []string // exclusive keys: an ordered one's earlier messages were checked by the claim
	for _, k := range a.Want {
		if !k.Ordered && held[k.Key] {
			taken = append(taken, k.Key)
		}
	}
	if len(taken) == 0 {
		return held, nil
	}
	if err := g.collectKeys(ctx, held, false, g.sql(yieldRangeKeysSQL), g.GroupID, taken, a.Token, a.Owner, a.Now); err != nil {
		// Whatever the first statement took stays under the token: the
		// caller settles the row, which releases it.
		return nil, err
	}
	return held, nil
}

// collectKeys runs a statement returning keys and adds them to (or, with
// add false, removes them from) set.
func (g Group) collectKeys(ctx context.Context, set map[string]bool, add bool, sql string, args ...any) error {
	rows, err := g.st.pool.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("acquire keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			return fmt.Errorf("acquire keys: scan: %w", err)
		}
		if add {
			set[key] = true
		} else {
			delete(set, key)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("acquire keys: %w", err)
	}
	return nil
}

// The key statements.

// Keys are leased unless another live holder has them. A deleted
// lease row does not conflict, so this may take a key the moment its
// holder commits.
var acquireKeysSQL = perStream(`-- store.AcquireKeys
INSERT INTO {s}.{t}_key_lease AS l (group_id, message_key, token, owner, expires_at)
SELECT $1, k.key, $3::uuid, $4::uuid, coalesce($5, now()) + $6::interval
FROM unnest($2::text[]) AS k(key)
ORDER BY k.key -- the lock order (locks.go): ON CONFLICT locks each row it meets
ON CONFLICT (group_id, message_key) DO UPDATE
    SET token = EXCLUDED.token, owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
    WHERE NOT EXISTS (SELECT 1 FROM {s}.worker_instance i
                      WHERE i.id = l.owner AND i.expires_at > coalesce($5, now()))
RETURNING l.message_key`)

// The keys just leased under $3 that an outstanding range of a live owner
// holds are given back, in key order (locks.go). This statement's
// snapshot is taken after the leases committed.
var yieldRangeKeysSQL = perStream(`-- store.AcquireKeys
WITH want AS (
    SELECT k.key FROM unnest($2::text[]) AS k(key)
), ranged AS MATERIALIZED (` + rangesHoldingKeys("$1", "$4::uuid", "$5", "AND m.message_key IN (SELECT key FROM want)") + `
), kl AS (
    SELECT message_key FROM {s}.{t}_key_lease
    WHERE group_id = $1 AND token = $3::uuid AND message_key IN (SELECT message_key FROM ranged)
    ORDER BY message_key FOR UPDATE
)
DELETE FROM {s}.{t}_key_lease
WHERE group_id = $1 AND token = $3::uuid AND message_key IN (SELECT message_key FROM kl)
RETURNING message_key`)

// An exclusive key is busy when another live holder has it: another
// instance's outstanding range holding a message of it, or a key lease.
// An ordered key is busy only under a key lease: a later message of it in
// another range waits for this one (it is blocked), so counting it would
// hold an ordered key back behind its own later messages for as long as
// ranges keep bringing them. An ordered key that is not busy is blocked
// while an earlier message of it is unresolved: a non-dead exception row,
// or a message inside another outstanding range of the group, whatever its
// owner (ranges are claimed in log order, and settled in one transaction
// with the exception rows they write, so this one snapshot sees every
// earlier message one way or the other).
// Whether another live instance has an outstanding range of the group, or
// the group has a key lease: RangeKeys' gate, alone.
var keysContendedSQL = perStream(`-- store.RangeKeys
SELECT ` + otherLiveRange("$2::uuid", "$3") + ` OR ` + anyKeyLease)

// otherLiveRange is an EXISTS: the group ($1) has an outstanding range of a
// live instance other than owner, at now.
func otherLiveRange(owner, now string) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM {s}.{t}_range g JOIN {s}.worker_instance i ON i.id = g.owner
               WHERE g.group_id = $1 AND g.owner <> %s AND i.expires_at > coalesce(%s, now()))`, owner, now)
}

// anyKeyLease is an EXISTS: the group ($1) has a key lease.
const anyKeyLease = `EXISTS (SELECT 1 FROM {s}.{t}_key_lease WHERE group_id = $1)`

var rangeKeysSQL = perStream(`-- store.RangeKeys
WITH gate AS MATERIALIZED (
    -- Usually no other live instance has a range and no key is leased: then
    -- only ordered keys ($9: one is wanted) have anything to look up.
    SELECT ` + otherLiveRange("$6::uuid", "$7") + ` AS ranges, ` + anyKeyLease + ` AS leases
), req AS MATERIALIZED (
    SELECT k.key, k.ordered, k.xid, k.id
    FROM gate, unnest($2::text[], $3::boolean[], $4::bigint[], $5::bigint[]) AS k(key, ordered, xid, id)
    WHERE gate.ranges OR gate.leases OR $9::boolean
), ranged AS MATERIALIZED (` + rangesHoldingKeys("$1", "$6::uuid", "$7", "AND m.message_key IN (SELECT key FROM req WHERE NOT ordered)") + `
), busy AS MATERIALIZED (
    SELECT req.key FROM req
    WHERE (NOT req.ordered AND req.key IN (SELECT message_key FROM ranged))
       OR ((SELECT leases FROM gate) AND EXISTS (` + keyHeldLiveAt("req.key", "$7") + `))
)
SELECT req.key, false FROM req WHERE req.key IN (SELECT key FROM busy)
UNION ALL
SELECT req.key, true FROM req
WHERE req.ordered AND req.key NOT IN (SELECT key FROM busy) AND (
    EXISTS (
        SELECT 1 FROM {s}.{t}_exception x
        WHERE x.group_id = $1 AND x.message_key = req.key AND x.status <> 'dead'
          AND (x.message_xid, x.message_id) < (req.xid, req.id))
    OR EXISTS (` + rangeHoldsEarlier("req.key", "req.xid", "req.id", "AND g.id <> $8") + `))`)

// rangesHoldingKeys is the body of a CTE: the keys of the messages inside
// the group's ($1) outstanding ranges whose owner is a live instance other
// than owner, at now; filter narrows the messages read. Driven from the
// few ranges, each read within its own bounds (see rangeHoldsEarlier).
func rangesHoldingKeys(group, owner, now, filter string) string {
	return fmt.Sprintf(`
    SELECT DISTINCT m.message_key FROM {s}.{t}_range g
    JOIN {s}.worker_instance i ON i.id = g.owner AND i.expires_at > coalesce(%[3]s, now())
    CROSS JOIN LATERAL (
        SELECT m.message_key FROM {s}.{t}_log m
        WHERE m.xid >= g.lo_xid AND m.xid <= g.hi_xid
          AND (m.xid, m.id) > (g.lo_xid, g.lo_id) AND (m.xid, m.id) <= (g.hi_xid, g.hi_id)
          AND m.message_key IS NOT NULL %[4]s) m
    WHERE g.group_id = %[1]s AND g.owner <> %[2]s`, group, owner, now, filter)
}

// rangeHoldsEarlier is the body of an EXISTS: an outstanding range of the
// group ($1) holds a message of key before position (xid, id). It is driven
// from the few ranges, each probing the log within its own bounds: written
// as a join of ranges and log, the planner turned it into a log scan per
// key once the statistics were stale (as when autovacuum has not run), and
// every claim cost O(log). extra narrows the ranges further.
func rangeHoldsEarlier(key, xid, id, extra string) string {
	return fmt.Sprintf(`
        SELECT 1 FROM {s}.{t}_range g
        CROSS JOIN LATERAL (
            SELECT 1 FROM {s}.{t}_log m
            WHERE m.xid >= g.lo_xid AND m.xid <= g.hi_xid
              AND (m.xid, m.id) > (g.lo_xid, g.lo_id) AND (m.xid, m.id) <= (g.hi_xid, g.hi_id)
              AND (m.xid, m.id) < (%[2]s, %[3]s) AND m.message_key = %[1]s
            LIMIT 1) hit
        WHERE g.group_id = $1 %[4]s AND (g.lo_xid, g.lo_id) < (%[2]s, %[3]s)`, key, xid, id, extra)
}

// keyHeldLive is the body of an EXISTS: a live holder leases key in the
// group ($1), at the statement's time ($2).
func keyHeldLive(key string) string { return keyHeldLiveAt(key, "$2") }

// keyHeldLiveAt is keyHeldLive at the time now.
func keyHeldLiveAt(key, now string) string {
	return fmt.Sprintf(`
        SELECT 1 FROM {s}.{t}_key_lease l JOIN {s}.worker_instance i ON i.id = l.owner
        WHERE l.group_id = $1 AND l.message_key = %s AND i.expires_at > coalesce(%s, now())`, key, now)
}
