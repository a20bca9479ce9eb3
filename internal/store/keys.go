package store

import (
	"context"
	"crypto/rand"
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
	// Gate, when set, also asks for the group's key gate under this token
	// (decision 0051). It is granted when no other live instance of the
	// owner's worker (WorkerConfigID) runs, no other live holder has a key
	// lease or the gate, and no keyed message of the group is unresolved
	// in the exception table. Under a granted gate the exclusive keys of
	// Want are held without a row each; held[KeyGateKey] reports the grant.
	Gate           string
	WorkerConfigID int64
}

// KeyGateKey is the key-lease row of a group's key gate (decision 0051): its
// holder holds every exclusive key of the group without a row each, and
// every key acquisition takes a share lock on it first, so that a gate is
// granted only while no other acquisition is under way. The row is never
// deleted while the group exists (it is freed instead): a lock on it is
// what orders acquisitions against the gate. No message key is empty (a
// keyed policy without a key runs as parallel), so it names no key.
const KeyGateKey = ""

// keyGateFree marks a gate row no one holds.
const keyGateFree = "00000000-0000-0000-0000-000000000000"

// AcquireKeys leases the keys that are free (or whose holder lapsed) under
// the token for the owner, then gives back the ordered ones that must wait
// for an earlier message, in one round trip (two statements, two snapshots:
// see the SQL). It returns the keys held and the ordered keys blocked; any
// other key is busy elsewhere.
func (g Group) AcquireKeys(ctx context.Context, a AcquireKeys) (held, blocked map[string]bool, err error) {
	want := a.Want
	keys, ordered := make([]string, len(want)), make([]bool, len(want))
	var okeys []string
	var oxids, oids []int64
	for i, k := range want {
		keys[i], ordered[i] = k.Key, k.Ordered
		if k.Ordered {
			okeys, oxids, oids = append(okeys, k.Key), append(oxids, k.Xid), append(oids, k.ID)
		}
	}
	var gate any // the gate token asked for, or NULL
	if a.Gate != "" {
		gate = a.Gate
	}
	var b pgx.Batch
	b.Queue(g.sql(keyGateRowSQL), g.GroupID, keyGateFree)
	if a.Gate != "" {
		b.Queue(g.sql(keyGateLockSQL), g.GroupID)
		b.Queue(g.sql(keyGateTakeSQL), g.GroupID, a.Gate, a.Owner, a.Now, a.TTL, a.WorkerConfigID)
	} else {
		b.Queue(g.sql(keyGateShareSQL), g.GroupID)
	}
	b.Queue(g.sql(acquireKeysSQL), g.GroupID, keys, a.Token, a.Owner, a.Now, a.TTL, ordered, gate)
	if len(okeys) > 0 {
		b.Queue(g.sql(blockOrderedSQL), g.GroupID, okeys, oxids, oids, a.RangeID, a.Token)
	}
	br := g.db().SendBatch(ctx, &b)
	defer br.Close()
	for range 2 { // the gate row and its lock
		if _, err := br.Exec(); err != nil {
			return nil, nil, fmt.Errorf("acquire keys: gate row: %w", err)
		}
	}
	held, blocked = map[string]bool{}, map[string]bool{}
	if a.Gate != "" {
		tag, err := br.Exec()
		if err != nil {
			return nil, nil, fmt.Errorf("acquire keys: gate: %w", err)
		}
		if tag.RowsAffected() > 0 {
			held[KeyGateKey] = true
			for _, k := range want {
				if !k.Ordered {
					held[k.Key] = true // under the gate: no row
				}
			}
		}
	}
	for q := range 2 {
		if q == 1 && len(okeys) == 0 {
			break
		}
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
//
// No key is taken while another live holder has the group's gate (the
// statements before this one hold a lock on the gate row, so no gate is
// granted before this commits), and an exclusive key is not written at
// all under a gate this acquisition was granted ($8).
var acquireKeysSQL = perStream(`-- store.AcquireKeys
INSERT INTO {s}.{t}_key_lease AS l (group_id, message_key, token, owner, expires_at)
SELECT $1, k.key, $3::uuid, $4::uuid, coalesce($5, now()) + $6::interval
FROM unnest($2::text[], $7::bool[]) AS k(key, ordered)
WHERE NOT EXISTS (SELECT 1 FROM {s}.{t}_key_lease g JOIN {s}.worker_instance i ON i.id = g.owner
                  WHERE g.group_id = $1 AND g.message_key = '' AND g.owner <> $4::uuid
                    AND i.expires_at > coalesce($5, now()))
  AND (k.ordered OR NOT EXISTS (SELECT 1 FROM {s}.{t}_key_lease g
                                WHERE g.group_id = $1 AND g.message_key = '' AND g.token = $8::uuid))
ORDER BY k.key -- the lock order (locks.go): ON CONFLICT locks each row it meets
ON CONFLICT (group_id, message_key) DO UPDATE
    SET token = EXCLUDED.token, owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
    WHERE NOT EXISTS (SELECT 1 FROM {s}.worker_instance i
                      WHERE i.id = l.owner AND i.expires_at > coalesce($5, now()))
RETURNING l.message_key`)

// The gate row exists from a group's first key acquisition on: each
// acquisition locks it, and a lock needs a row.
var keyGateRowSQL = perStream(`-- store.AcquireKeys
INSERT INTO {s}.{t}_key_lease (group_id, message_key, token, owner, expires_at)
VALUES ($1, '', $2::uuid, $2::uuid, '-infinity')
ON CONFLICT (group_id, message_key) DO NOTHING`)

// A key acquisition shares the gate row's lock: no gate is granted while
// it runs, and it waits for a gate being granted. The first key-lease row
// in the lock order (locks.go): ” sorts before every key.
var keyGateShareSQL = perStream(`-- store.AcquireKeys
SELECT 1 FROM {s}.{t}_key_lease WHERE group_id = $1 AND message_key = '' FOR SHARE`)

// Asking for the gate takes the row's lock alone: the acquisitions under
// way commit first, so the next statement's snapshot sees their leases.
var keyGateLockSQL = perStream(`-- store.AcquireKeys
SELECT 1 FROM {s}.{t}_key_lease WHERE group_id = $1 AND message_key = '' FOR UPDATE`)

// The gate is granted when no other live holder has it or any key of the
// group, no other live instance of the owner's worker runs (another
// session of the group would only find every key busy), and no keyed
// message waits in the exception table (its retry needs its key, and the
// exception claimer is another instance).
var keyGateTakeSQL = perStream(`-- store.AcquireKeys
UPDATE {s}.{t}_key_lease g
SET token = $2::uuid, owner = $3::uuid, expires_at = coalesce($4, now()) + $5::interval
WHERE g.group_id = $1 AND g.message_key = ''
  AND NOT EXISTS (SELECT 1 FROM {s}.worker_instance i
                  WHERE i.id = g.owner AND i.id <> $3::uuid AND i.expires_at > coalesce($4, now()))
  AND NOT EXISTS (SELECT 1 FROM {s}.{t}_key_lease o JOIN {s}.worker_instance i ON i.id = o.owner
                  WHERE o.group_id = $1 AND o.message_key <> '' AND o.owner <> $3::uuid
                    AND i.expires_at > coalesce($4, now()))
  AND NOT EXISTS (SELECT 1 FROM {s}.worker_instance i
                  WHERE i.worker_config_id = $6 AND i.id <> $3::uuid AND i.expires_at > coalesce($4, now()))
  AND NOT EXISTS (SELECT 1 FROM {s}.{t}_exception x
                  WHERE x.group_id = $1 AND x.message_key IS NOT NULL AND x.status <> 'dead'
                    AND x.concurrency <> 'parallel')
RETURNING g.message_key`)

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

// keyHeldLive is the body of an EXISTS: a live holder leases key, or has
// the group's gate, in the group ($1), at the statement's time ($2).
func keyHeldLive(key string) string {
	return fmt.Sprintf(`
        SELECT 1 FROM {s}.{t}_key_lease l JOIN {s}.worker_instance i ON i.id = l.owner
        WHERE l.group_id = $1 AND l.message_key IN (%s, '') AND i.expires_at > coalesce($2, now())`, key)
}

// KeyGateRelease gives up a group's key gate held under Token by Owner. Keys
// are the exclusive keys the owner still holds under it, each with the
// token of the range that took it: they get a lease row each, in the
// statement that frees the gate, so that no moment finds them unheld.
type KeyGateRelease struct {
	Token, Owner string
	Keys         []KeyLease
	TTL          time.Duration
	Now          Now
}

// ReleaseKeyGate writes the leases of the keys still held under the gate and
// frees it, in one statement. It reports whether the gate was still the
// owner's under the token: false when an earlier attempt whose reply was
// lost freed it (the rows were written then) or when the owner lost it
// with its incarnation. A key a live other holder leases is not taken
// (none can be, while the gate holds); missing counts them.
func (g Group) ReleaseKeyGate(ctx context.Context, r KeyGateRelease) (freed bool, missing int, err error) {
	names, tokens := keyArrays(r.Keys)
	var written, n int
	if err := g.db().QueryRow(ctx, g.sql(releaseKeyGateSQL), g.GroupID, r.Token, r.Owner, r.Now, r.TTL, names, tokens, keyGateFree).
		Scan(&written, &n); err != nil {
		return false, 0, fmt.Errorf("release key gate: %w", err)
	}
	if n == 0 {
		return false, 0, nil
	}
	return true, len(r.Keys) - written, nil
}

// The gate row first, then the key rows in key order (locks.go): each step
// reads the one before, so they run in that order.
var releaseKeyGateSQL = perStream(`-- store.ReleaseKeyGate
WITH gl AS (
    SELECT message_key FROM {s}.{t}_key_lease
    WHERE group_id = $1 AND message_key = '' AND token = $2::uuid AND owner = $3::uuid
    FOR UPDATE
), ins AS (
    INSERT INTO {s}.{t}_key_lease AS l (group_id, message_key, token, owner, expires_at)
    SELECT $1, k.key, k.token, $3::uuid, coalesce($4, now()) + $5::interval
    FROM unnest($6::text[], $7::uuid[]) AS k(key, token)
    WHERE EXISTS (SELECT 1 FROM gl)
    ORDER BY k.key
    ON CONFLICT (group_id, message_key) DO UPDATE
        SET token = EXCLUDED.token, owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
        WHERE l.owner = EXCLUDED.owner
           OR NOT EXISTS (SELECT 1 FROM {s}.worker_instance i
                          WHERE i.id = l.owner AND i.expires_at > coalesce($4, now()))
    RETURNING 1
), fr AS (
    UPDATE {s}.{t}_key_lease SET token = $8::uuid, owner = $8::uuid, expires_at = '-infinity'
    WHERE group_id = $1 AND message_key IN (SELECT message_key FROM gl) AND (SELECT count(*) FROM ins) >= 0
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins)::int, (SELECT count(*) FROM fr)::int`)

// KeyGateWanted reports whether a held gate should be given up: another live
// instance of the owner's worker runs (a session of the group that would
// find every key busy), or a keyed message of the group waits in the
// exception table (its retry needs its key, and the exception claimer is
// another instance). A read of two indexes.
func (g Group) KeyGateWanted(ctx context.Context, owner string, workerConfigID int64, now Now) (bool, error) {
	var wanted bool
	if err := g.db().QueryRow(ctx, g.sql(keyGateWantedSQL), g.GroupID, owner, workerConfigID, now).Scan(&wanted); err != nil {
		return false, fmt.Errorf("key gate wanted: %w", err)
	}
	return wanted, nil
}

var keyGateWantedSQL = perStream(`-- store.KeyGateWanted
SELECT EXISTS (SELECT 1 FROM {s}.worker_instance i
               WHERE i.worker_config_id = $3 AND i.id <> $2::uuid AND i.expires_at > coalesce($4, now()))
    OR EXISTS (SELECT 1 FROM {s}.{t}_exception x
               WHERE x.group_id = $1 AND x.message_key IS NOT NULL AND x.status <> 'dead'
                 AND x.concurrency <> 'parallel')`)

// NewID returns a random UUID (version 4) as text: instance ids, and the
// tokens a claimer makes itself (a key gate's).
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
