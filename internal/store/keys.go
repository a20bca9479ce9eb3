package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// KeyClaim is one key a claimer wants for a keyed message. An Ordered key
// is checked for an unresolved message before Position.
type KeyClaim struct {
	Key     string
	Ordered bool
	Position
}

// AcquireKeys is a request for key leases.
type AcquireKeys struct {
	// RangeID is the caller's own range (0 on the exception path): an
	// ordered key is not blocked by it.
	RangeID int64
	Want    []KeyClaim
	// Token and Owner are the lease's: the range's or exception row's
	// token, and the worker instance.
	Token, Owner string
	TTL          time.Duration
	Now          Now
}

// AcquireKeys leases the keys that are free (or whose holder lapsed) under
// the token for the owner, then gives back the ordered ones that must wait
// for an earlier message, in one round trip (two statements, two snapshots:
// see the SQL). It returns the keys held and the ordered keys blocked; any
// other key is busy elsewhere.
func (g Group) AcquireKeys(ctx context.Context, a AcquireKeys) (held, blocked map[string]bool, err error) {
	want := a.Want
	keys := make([]string, len(want))
	var okeys []string
	var oxids, oids []int64
	for i, k := range want {
		keys[i] = k.Key
		if k.Ordered {
			okeys, oxids, oids = append(okeys, k.Key), append(oxids, k.Xid), append(oids, k.ID)
		}
	}
	var b pgx.Batch
	b.Queue(g.sql(acquireKeysSQL), g.GroupID, keys, a.Token, a.Owner, a.Now, a.TTL)
	if len(okeys) > 0 {
		b.Queue(g.sql(blockOrderedSQL), g.GroupID, okeys, oxids, oids, a.RangeID, a.Token)
	}
	br := g.db().SendBatch(ctx, &b)
	defer br.Close()
	held, blocked = map[string]bool{}, map[string]bool{}
	for q := range b.Len() {
		rows, err := br.Query()
		if err != nil {
			return nil, nil, fmt.Errorf("acquire keys: %w", err)
		}
		for rows.Next() {
			var key string
			if err := rows.Scan(&key); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("acquire keys: scan: %w", err)
			}
			if q == 0 {
				held[key] = true
			} else {
				delete(held, key)
				blocked[key] = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("acquire keys: %w", err)
		}
	}
	return held, blocked, nil
}

// The key statements.

// Keys are leased unless another live holder has them. A deleted
// lease row does not conflict, so this may take a key the moment its
// holder commits; whether an ordered key must still wait is decided
// by the next statement, under a newer snapshot.
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

// An ordered key held by us is blocked, and given back, while an
// earlier message of the key is unresolved: a non-dead exception
// row, or a message inside another outstanding range of the group.
// A holder settles its range (range row deleted, exception rows
// written, key released) in one transaction, so this statement's
// snapshot, taken after the key was seen free, sees one or the
// other.
var blockOrderedSQL = perStream(`-- store.AcquireKeys
WITH req AS (
    SELECT k.key, k.xid, k.id FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS k(key, xid, id)
), blocked AS (
    SELECT req.key FROM req
    WHERE EXISTS (
        SELECT 1 FROM {s}.{t}_exception x
        WHERE x.group_id = $1 AND x.message_key = req.key AND x.status <> 'dead'
          AND (x.message_xid, x.message_id) < (req.xid, req.id))
    OR EXISTS (` + rangeHoldsEarlier("req.key", "req.xid", "req.id", "AND g.id <> $5") + `)
), kl AS (
    SELECT message_key FROM {s}.{t}_key_lease
    WHERE group_id = $1 AND token = $6::uuid AND message_key IN (SELECT key FROM blocked)
    ORDER BY message_key FOR UPDATE
)
DELETE FROM {s}.{t}_key_lease
WHERE group_id = $1 AND token = $6::uuid AND message_key IN (SELECT message_key FROM kl)
RETURNING message_key`)

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
func keyHeldLive(key string) string {
	return fmt.Sprintf(`
        SELECT 1 FROM {s}.{t}_key_lease l JOIN {s}.worker_instance i ON i.id = l.owner
        WHERE l.group_id = $1 AND l.message_key = %s AND i.expires_at > coalesce($2, now())`, key)
}
