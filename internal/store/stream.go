package store

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// tables holds one stream's statements, built once: pgx caches prepared
// statements by text, so a stable text per stream is also a fast one.
type tables struct {
	notify          string
	insertCursor    string
	insertBatch     string
	insertBatchWake string
	insertKeyed     string
	// The two inserts' names as prepared statements (wire.go).
	insertBatchName, insertBatchWakeName string
	claim                                string
	reclaim                              string
	commit                               string
	release                              string
	renewRanges                          string
	gateProbe                            string
	countLog                             string
	countException                       string
	rangeLeases                          string

	acquireKeys      string
	releaseOwnedKeys string
	blockOrdered     string
	claimExceptions  string
	settleException  string
	returnRuns       string
	listDead         string
	redrive          string
	exceptionState   string
	deliveries       string
	committed        string
	unaccounted      string
	forgetRanges     string
	forgetRuns       string
	deleteExpired    string
	pruneLedger      string
	pruneDeliveries  string
	pruneIdempotency string

	currentBindings   string
	appendDeclaration string
	installBindings   string
	swapBindings      string
	ledger            string
	bindingSet        string
	bindingsInForce   string
	ledgerAll         string
}

var tablesCache sync.Map // key schema+"\x00"+streamID → *tables

func (st *Store) streamTables(streamID int64) *tables {
	key := fmt.Sprintf("%s\x00%d", st.schema, streamID)
	if t, ok := tablesCache.Load(key); ok {
		return t.(*tables)
	}
	t := buildTables(st.s, streamID)
	actual, _ := tablesCache.LoadOrStore(key, t)
	return actual.(*tables)
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
func keyHeldLive(key string) string {
	return fmt.Sprintf(`
        SELECT 1 FROM {s}.{t}_key_lease l JOIN {s}.worker_instance i ON i.id = l.owner
        WHERE l.group_id = $1 AND l.message_key = %s AND i.expires_at > coalesce($2, now())`, key)
}

func buildTables(schema string, streamID int64) *tables {
	prefix := tablePrefix(streamID)
	r := strings.NewReplacer("{s}", schema, "{t}", prefix, "{id}", strconv.FormatInt(streamID, 10))
	t := &tables{
		insertCursor: r.Replace(`-- store.RegisterGroup
INSERT INTO {s}.{t}_cursor (group_id, head_xid, head_id, updated_at)
SELECT $1,
       CASE WHEN $2 THEN pg_snapshot_xmin(pg_current_snapshot())::text::bigint ELSE 0 END,
       0, coalesce($3, now())
ON CONFLICT (group_id) DO NOTHING`),

		// One notification per produce (PostgreSQL folds identical ones
		// within a transaction and delivers them at commit), so idle
		// consumers wake without tight polling: in the insert's statement
		// inside a caller's transaction, after it on the pool (see
		// store.Produce).
		insertBatch: r.Replace(`-- store.Produce
` + insertBatchSQL),
		insertBatchWake: r.Replace(`-- store.Produce
WITH ins AS (
` + insertBatchSQL + `
)
SELECT ins.id FROM ins, (SELECT pg_notify($8, $9)) AS wake(x)`),

		notify: `-- store.Produce
SELECT pg_notify($1, $2)`,

		// The idempotency row takes the message's id from the log's identity
		// sequence first, so two producers racing on one key serialize on the
		// key's unique index and exactly one log row is written.
		insertKeyed: r.Replace(`-- store.Produce
WITH g AS (
    SELECT coalesce($8 = '' OR (SELECT s.name FROM {s}.stream_config s WHERE s.id = {id}) = $8, false) AS ok
), k AS (
    INSERT INTO {s}.{t}_idempotency (key, message_id, created_at)
    SELECT $2, nextval(pg_get_serial_sequence('{s}.{t}_log', 'id')), coalesce($1, now())
    WHERE (SELECT ok FROM g)
    ON CONFLICT (key) DO NOTHING
    RETURNING message_id
), ins AS (
    INSERT INTO {s}.{t}_log (id, produced_at, version, routing_key, message_key, payload, options)
    OVERRIDING SYSTEM VALUE
    SELECT k.message_id, coalesce($1, now()), $3, nullif($4, ''), nullif($5, ''), $6::text::json, nullif($7, '')::jsonb
    FROM k
    RETURNING id
)
SELECT id, false, true FROM ins
UNION ALL
SELECT coalesce((SELECT message_id FROM {s}.{t}_idempotency WHERE key = $2), 0), true, (SELECT ok FROM g)
WHERE NOT EXISTS (SELECT 1 FROM k)`),

		// One statement, one round trip: lock the cursor, find the next
		// positions that are final (xid below the snapshot's xmin), move the
		// head, write the lease and return the range's messages.
		// The bounds reach the log scans as scalar subqueries (InitPlan
		// parameters) because only then does the planner use them as index
		// conditions; a join against cur would scan the log from its start.
		// The planner cannot see those bounds, so it must not be able to see
		// the limit either: with a constant limit above its row estimate
		// (always, before the log is analyzed) it read everything after the
		// head with a bitmap scan and sorted it, on every custom-planned
		// execution. As a subquery, the limit makes it plan for the first
		// rows, an ordered index scan. The upper bound comes from the index
		// alone; the messages are then read by both bounds, in order, without
		// materializing them in a CTE.
		claim: r.Replace(`-- store.ClaimRange
WITH cur AS (
    SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1 FOR UPDATE
), last AS (
    SELECT p.xid, p.id FROM (
        SELECT m.xid, m.id
        FROM {s}.{t}_log m
        WHERE (m.xid, m.id) > ((SELECT head_xid FROM cur), (SELECT head_id FROM cur))
          AND m.xid >= (SELECT head_xid FROM cur) -- lets the executor skip chunks below the head
          AND m.xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
        ORDER BY m.xid, m.id
        LIMIT (SELECT $2::int)
    ) p
    ORDER BY p.xid DESC, p.id DESC LIMIT 1
), moved AS (
    UPDATE {s}.{t}_cursor c SET head_xid = last.xid, head_id = last.id, updated_at = coalesce($3, now())
    FROM last WHERE c.group_id = $1
    RETURNING c.group_id
), rng AS (
    INSERT INTO {s}.{t}_range (group_id, lo_xid, lo_id, hi_xid, hi_id, token, owner, claimed_at, expires_at)
    SELECT $1, cur.head_xid, cur.head_id, last.xid, last.id, gen_random_uuid(), $4,
           coalesce($3, now()), coalesce($3, now()) + $5::interval
    FROM cur, last, moved
    RETURNING id, token, lo_xid, lo_id, hi_xid, hi_id
), binds AS (
    -- The group's binding set, read in this statement's snapshot: every
    -- claim filters by exactly one declared set.
    SELECT array_agg(regex) AS rx, coalesce(max(declaration_id), 0) AS decl
    FROM {s}.{t}_binding WHERE group_id = $1
)
SELECT (SELECT id FROM rng), (SELECT token::text FROM rng), b.xid, b.id, b.produced_at, b.version,
       coalesce(b.routing_key, ''), coalesce(b.message_key, ''),
       CASE WHEN mt.matched THEN b.payload::text END, coalesce(b.options::text, ''), mt.matched, (SELECT decl FROM binds)
FROM {s}.{t}_log b,
     LATERAL (SELECT (SELECT rx FROM binds) IS NULL
                  OR (b.routing_key IS NOT NULL
                      AND EXISTS (SELECT 1 FROM unnest((SELECT rx FROM binds)) AS r(x) WHERE ('.' || b.routing_key) ~ r.x)) AS matched) mt
WHERE (b.xid, b.id) > ((SELECT lo_xid FROM rng), (SELECT lo_id FROM rng))
  AND (b.xid, b.id) <= ((SELECT hi_xid FROM rng), (SELECT hi_id FROM rng))
  AND b.xid >= (SELECT lo_xid FROM rng) AND b.xid <= (SELECT hi_xid FROM rng) -- chunk pruning
ORDER BY b.xid, b.id
LIMIT (SELECT $2::int)`),

		reclaim: r.Replace(`-- store.ReclaimRange
WITH r AS (
    SELECT id FROM {s}.{t}_range
    WHERE group_id = $1 AND expires_at < coalesce($2, now())
    ORDER BY id LIMIT 1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE {s}.{t}_range g
    SET token = gen_random_uuid(), owner = $3, claimed_at = coalesce($2, now()),
        expires_at = coalesce($2, now()) + $4::interval, reclaims = g.reclaims + 1
    FROM r WHERE g.id = r.id
    RETURNING g.id, g.token, g.reclaims, g.lo_xid, g.lo_id, g.hi_xid, g.hi_id
), binds AS (
    SELECT array_agg(regex) AS rx, coalesce(max(declaration_id), 0) AS decl
    FROM {s}.{t}_binding WHERE group_id = $1
)
SELECT upd.id, upd.token::text, upd.reclaims, m.xid, m.id, m.produced_at, m.version,
       coalesce(m.routing_key, ''), coalesce(m.message_key, ''),
       CASE WHEN mt.matched THEN m.payload::text END, coalesce(m.options::text, ''), coalesce(mt.matched, false), binds.decl
FROM upd
CROSS JOIN binds
LEFT JOIN (
    SELECT l.xid, l.id, l.produced_at, l.version, l.routing_key, l.message_key, l.payload, l.options
    FROM {s}.{t}_log l
    WHERE (l.xid, l.id) > ((SELECT lo_xid FROM upd), (SELECT lo_id FROM upd))
      AND (l.xid, l.id) <= ((SELECT hi_xid FROM upd), (SELECT hi_id FROM upd))
      AND l.xid >= (SELECT lo_xid FROM upd) AND l.xid <= (SELECT hi_xid FROM upd) -- chunk pruning
) m ON true
LEFT JOIN LATERAL (SELECT binds.rx IS NULL
                       OR (m.routing_key IS NOT NULL
                           AND EXISTS (SELECT 1 FROM unnest(binds.rx) AS r(x) WHERE ('.' || m.routing_key) ~ r.x)) AS matched) mt ON true
ORDER BY m.xid, m.id`),

		// Deleting the lease by its token is the fence: zero rows means a
		// reclaimer owns the range now (the row is there under another
		// token), or the range is settled already (no row: a reclaimer
		// finished it, or an earlier attempt of this commit whose reply was
		// lost applied), and no exception or delivery row is written. The key leases the caller no longer needs go in the same
		// statement as the exception rows, so an ordered key's next message
		// sees its predecessor's exception row the moment the key is free.
		// They go even when the fence fails (the caller is done with them),
		// each by the token that acquired it, so a retried statement cannot
		// release a later acquisition of the same key.
		commit: r.Replace(`-- store.CommitRange
WITH d AS (
    DELETE FROM {s}.{t}_range WHERE id = $1 AND token = $2::uuid RETURNING group_id
), k AS (
    DELETE FROM {s}.{t}_key_lease l USING unnest($18::text[], $19::uuid[]) AS r(key, token)
    WHERE l.group_id = $20 AND l.message_key = r.key AND l.token = r.token
), e AS (
    INSERT INTO {s}.{t}_exception (group_id, message_xid, message_id, message_key, concurrency, status,
                                    attempts, delays, last_error, can_run_after, created_at, updated_at)
    SELECT d.group_id, x.xid, x.id, nullif(x.key, ''), x.conc, x.status, x.attempts, x.delays, x.err,
           coalesce($3, now()) + x.after_us * interval '1 microsecond', coalesce($3, now()), coalesce($3, now())
    FROM d, unnest($4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::int[], $10::int[],
                   $11::text[], $12::bigint[]) AS x(xid, id, key, conc, status, attempts, delays, err, after_us)
    ON CONFLICT (group_id, message_xid, message_id) DO NOTHING
), l AS (
    INSERT INTO {s}.{t}_delivery (group_id, message_xid, message_id, attempt, outcome, error, at)
    SELECT d.group_id, x.xid, x.id, x.attempt, x.outcome, x.err, coalesce($3, now())
    FROM d, unnest($13::bigint[], $14::bigint[], $15::int[], $16::text[], $17::text[]) AS x(xid, id, attempt, outcome, err)
)
SELECT (SELECT count(*) FROM d), EXISTS (SELECT 1 FROM {s}.{t}_range WHERE id = $1)`),

		// Hand a range back at once: its settled prefix is dropped by moving
		// lo, and the lease expires now so any instance reclaims the rest.
		release: r.Replace(`-- store.ReleaseRange
WITH k AS (
    DELETE FROM {s}.{t}_key_lease l USING unnest($6::text[], $7::uuid[]) AS r(key, token)
    WHERE l.group_id = $8 AND l.message_key = r.key AND l.token = r.token
)
UPDATE {s}.{t}_range
SET lo_xid = coalesce($3, lo_xid), lo_id = coalesce($4, lo_id), expires_at = coalesce($5, now()) - interval '1 millisecond'
WHERE id = $1 AND token = $2::uuid`),

		// Everything an instance holds lives exactly as long as its heartbeat.
		// Key leases are not renewed here: a key is held while its owner's
		// worker_instance is live (see acquireKeys), so a beat never locks
		// the key rows a commit is deleting (the two used to deadlock).
		renewRanges: r.Replace(`-- store.RenewInstance
WITH r AS (
    UPDATE {s}.{t}_range SET expires_at = coalesce($2, now()) + $3::interval WHERE owner = $1::uuid
)
UPDATE {s}.{t}_exception SET expires_at = coalesce($2, now()) + $3::interval
WHERE owner = $1::uuid AND status IN ('running', 'queued')`),

		releaseOwnedKeys: r.Replace(`-- store.ExpireOwnedRanges
DELETE FROM {s}.{t}_key_lease WHERE owner = $1::uuid`),

		gateProbe: r.Replace(`-- store.GateProbe
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
       coalesce((SELECT true FROM {s}.{t}_log m
               WHERE (m.xid, m.id) > ((SELECT head_xid FROM {s}.{t}_cursor WHERE group_id = $1),
                                      (SELECT head_id FROM {s}.{t}_cursor WHERE group_id = $1))
                 AND m.xid >= (SELECT head_xid FROM {s}.{t}_cursor WHERE group_id = $1)
               ORDER BY m.xid, m.id LIMIT 1), false)`),

		// Row by row only in the default partition (rows no chunk covered;
		// whole chunks go by DropChunk). The victims are read through the
		// (xid, id) index from its start, never above the floor (floorCTE).
		deleteExpired: r.Replace(`-- store.DeleteExpired
WITH ` + floorCTE + `, victims AS (
    SELECT m.xid, m.id FROM {s}.{t}_log_default m
    WHERE m.produced_at < coalesce($1, now()) - $2::interval
      AND (NOT EXISTS (SELECT 1 FROM floor) OR (m.xid, m.id) <= (SELECT f.xid, f.id FROM floor f))
      AND NOT EXISTS (SELECT 1 FROM {s}.{t}_exception x WHERE x.message_xid = m.xid AND x.message_id = m.id)
    ORDER BY m.xid, m.id
    LIMIT $3
)
DELETE FROM {s}.{t}_log_default l USING victims v WHERE l.xid = v.xid AND l.id = v.id`),

		// The binding ledger's deferred cleanup (seed 0511): installed rows
		// stay (the set-change audit); a waiting row goes once it is
		// superseded, that is, when a newer installed row closed its wait or
		// its declarer appended a newer waiting row. Rows are
		// self-contained (declared_at rides on every attempt), so dropping
		// older attempts loses neither the listing nor a wait's start.
		pruneLedger: r.Replace(`-- store.PruneBindingLedger
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
DELETE FROM {s}.{t}_binding_declaration b USING victims v WHERE b.id = v.id AND b.status = 'waiting'`),

		pruneDeliveries: r.Replace(`-- store.PruneDeliveries
WITH victims AS (
    SELECT id FROM {s}.{t}_delivery WHERE at < coalesce($1, now()) - $2::interval ORDER BY at LIMIT $3
)
DELETE FROM {s}.{t}_delivery d USING victims v WHERE d.id = v.id`),

		pruneIdempotency: r.Replace(`-- store.PruneIdempotency
WITH victims AS (
    SELECT key FROM {s}.{t}_idempotency WHERE created_at < coalesce($1, now()) - $2::interval LIMIT $3
)
DELETE FROM {s}.{t}_idempotency i USING victims v WHERE i.key = v.key`),

		// A claim whose reply was lost (the connection died after the
		// commit) leaves a lease the claimer never learned of, which its
		// heartbeat would renew forever. Expire those, and release key
		// leases the claimer does not hold.
		forgetRanges: r.Replace(`-- store.ForgetUnknownRanges
WITH r AS (
    UPDATE {s}.{t}_range SET expires_at = coalesce($4, now()) - interval '1 millisecond'
    WHERE group_id = $1 AND owner = $2::uuid AND id <> ALL ($3::bigint[]) AND expires_at >= coalesce($4, now())
    RETURNING id
), k AS (
    DELETE FROM {s}.{t}_key_lease l
    WHERE l.group_id = $1 AND l.owner = $2::uuid
      AND NOT EXISTS (SELECT 1 FROM unnest($5::text[], $6::uuid[]) AS h(key, token)
                      WHERE h.key = l.message_key AND h.token = l.token)
    RETURNING 1
)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM k)`),

		forgetRuns: r.Replace(`-- store.ForgetUnknownRuns
WITH k AS (
    DELETE FROM {s}.{t}_key_lease l
    WHERE l.group_id = $1 AND l.owner = $2::uuid AND l.token <> ALL ($3::uuid[])
    RETURNING 1
), x AS (
    UPDATE {s}.{t}_exception
    SET status = 'pending', token = NULL, owner = NULL, expires_at = NULL, updated_at = coalesce($4, now())
    WHERE group_id = $1 AND owner = $2::uuid AND status IN ('running', 'queued') AND token <> ALL ($3::uuid[])
    RETURNING 1
)
SELECT (SELECT count(*) FROM x), (SELECT count(*) FROM k)`),

		unaccounted: r.Replace(`-- store.Unaccounted
SELECT m.id FROM {s}.{t}_log m
WHERE m.id = ANY($2::bigint[])
  AND NOT EXISTS (SELECT 1 FROM {s}.{t}_exception x
                  WHERE x.group_id = $1 AND x.message_xid = m.xid AND x.message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM {s}.{t}_range g
                  WHERE g.group_id = $1 AND (m.xid, m.id) > (g.lo_xid, g.lo_id) AND (m.xid, m.id) <= (g.hi_xid, g.hi_id))
  AND (m.xid, m.id) <= (SELECT c.head_xid, c.head_id FROM {s}.{t}_cursor c WHERE c.group_id = $1)
ORDER BY m.id`),

		countLog: r.Replace(`-- store.CountLog
SELECT count(*) FROM {s}.{t}_log`),

		countException: r.Replace(`-- store.CountExceptions
SELECT count(*) FROM {s}.{t}_exception WHERE group_id = $1`),

		// Keys are leased unless another live holder has them. A deleted
		// lease row does not conflict, so this may take a key the moment its
		// holder commits; whether an ordered key must still wait is decided
		// by the next statement, under a newer snapshot.
		acquireKeys: r.Replace(`-- store.AcquireKeys
INSERT INTO {s}.{t}_key_lease AS l (group_id, message_key, token, owner, expires_at)
SELECT $1, k.key, $3::uuid, $4::uuid, coalesce($5, now()) + $6::interval
FROM unnest($2::text[]) AS k(key)
ON CONFLICT (group_id, message_key) DO UPDATE
    SET token = EXCLUDED.token, owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
    WHERE NOT EXISTS (SELECT 1 FROM {s}.worker_instance i
                      WHERE i.id = l.owner AND i.expires_at > coalesce($5, now()))
RETURNING l.message_key`),

		// An ordered key held by us is blocked, and given back, while an
		// earlier message of the key is unresolved: a non-dead exception
		// row, or a message inside another outstanding range of the group.
		// A holder settles its range (range row deleted, exception rows
		// written, key released) in one transaction, so this statement's
		// snapshot, taken after the key was seen free, sees one or the
		// other.
		blockOrdered: r.Replace(`-- store.AcquireKeys
WITH req AS (
    SELECT k.key, k.xid, k.id FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS k(key, xid, id)
), blocked AS (
    SELECT req.key FROM req
    WHERE EXISTS (
        SELECT 1 FROM {s}.{t}_exception x
        WHERE x.group_id = $1 AND x.message_key = req.key AND x.status <> 'dead'
          AND (x.message_xid, x.message_id) < (req.xid, req.id))
    OR EXISTS (` + rangeHoldsEarlier("req.key", "req.xid", "req.id", "AND g.id <> $5") + `)
)
DELETE FROM {s}.{t}_key_lease
WHERE group_id = $1 AND token = $6::uuid AND message_key IN (SELECT key FROM blocked)
RETURNING message_key`),

		// Due rows, and running rows whose lease lapsed (their holder died
		// or hung: that counts as a failed attempt). An ordered row runs only
		// when no earlier row of its key is unresolved.
		// Rows whose key a live holder leases are passed over: they would
		// only be parked again (the claimer still asks for the key: the
		// holder may have been a moment ago).
		// Each claimed ordered head brings the key's next rows with it, up
		// to $6, as a chain the claimer runs in order within one claim: the
		// head 'running', the rest 'queued' (leased, not started, so a lapse
		// spends no attempt on them). A chain is cut before its first row
		// that is not due, not locked by this claim, or behind a message of
		// the key that an outstanding range still holds.
		claimExceptions: r.Replace(`-- store.ClaimExceptions
WITH RECURSIVE keys AS (
    -- The group's keys with unresolved rows, one index probe each (a loose
    -- index scan): the cost follows the number of keys, not of rows.
    (SELECT e.message_key FROM {s}.{t}_exception e
     WHERE e.group_id = $1 AND e.message_key IS NOT NULL AND e.status <> 'dead'
     ORDER BY e.message_key LIMIT 1)
    UNION ALL
    SELECT (SELECT e.message_key FROM {s}.{t}_exception e
            WHERE e.group_id = $1 AND e.message_key IS NOT NULL AND e.status <> 'dead' AND e.message_key > k.message_key
            ORDER BY e.message_key LIMIT 1)
    FROM keys k WHERE k.message_key IS NOT NULL
), heads AS (
    -- The earliest unresolved row of each key: of an ordered key's rows only
    -- this one may run, so a long blocked chain is never scanned.
    SELECT h.* FROM keys k
    CROSS JOIN LATERAL (
        SELECT e.message_xid, e.message_id, e.message_key, e.concurrency, e.status, e.can_run_after, e.expires_at
        FROM {s}.{t}_exception e
        WHERE e.group_id = $1 AND e.message_key = k.message_key AND e.status <> 'dead'
        ORDER BY e.message_xid, e.message_id LIMIT 1) h
    WHERE k.message_key IS NOT NULL
), candidates AS (
    SELECT h.message_xid, h.message_id, h.can_run_after FROM heads h
    WHERE h.concurrency = 'ordered'
      AND ((h.status = 'pending' AND h.can_run_after <= coalesce($2, now()))
        OR (h.status IN ('running', 'queued') AND h.expires_at < coalesce($2, now())))
      AND NOT EXISTS (` + keyHeldLive("h.message_key") + `)
      AND NOT EXISTS (` + rangeHoldsEarlier("h.message_key", "h.message_xid", "h.message_id", "") + `)
    UNION ALL
    (SELECT x.message_xid, x.message_id, x.can_run_after FROM {s}.{t}_exception x
     WHERE x.group_id = $1 AND x.status <> 'dead' AND x.concurrency <> 'ordered'
       AND ((x.status = 'pending' AND x.can_run_after <= coalesce($2, now()))
         OR (x.status IN ('running', 'queued') AND x.expires_at < coalesce($2, now())))
       -- A row whose key a live holder has would only be parked again.
       AND (x.concurrency = 'parallel' OR x.message_key IS NULL OR NOT EXISTS (` + keyHeldLive("x.message_key") + `))
     ORDER BY x.can_run_after
     LIMIT $3 * 4)
), due AS (
    -- Locked rows are checked again on their newest version: one another
    -- claimer took meanwhile is no longer due and is skipped.
    SELECT x.message_xid, x.message_id, x.message_key, x.concurrency, x.status AS was
    FROM candidates c
    JOIN {s}.{t}_exception x ON x.group_id = $1 AND x.message_xid = c.message_xid AND x.message_id = c.message_id
    WHERE x.status <> 'dead'
      AND ((x.status = 'pending' AND x.can_run_after <= coalesce($2, now()))
        OR (x.status IN ('running', 'queued') AND x.expires_at < coalesce($2, now())))
    ORDER BY c.can_run_after
    LIMIT $3
    FOR UPDATE OF x SKIP LOCKED
), bounds AS (
    -- Per ordered head, the key's earliest message after it that an
    -- outstanding range holds: each range is scanned within its own bounds.
    SELECT d.message_xid, d.message_id, d.message_key, b.xid AS bound_xid, b.id AS bound_id
    FROM due d
    LEFT JOIN LATERAL (
        SELECT r.xid, r.id FROM {s}.{t}_range g
        CROSS JOIN LATERAL (
            SELECT m.xid, m.id FROM {s}.{t}_log m
            WHERE m.xid >= g.lo_xid AND m.xid <= g.hi_xid
              AND (m.xid, m.id) > (g.lo_xid, g.lo_id) AND (m.xid, m.id) <= (g.hi_xid, g.hi_id)
              AND (m.xid, m.id) > (d.message_xid, d.message_id) AND m.message_key = d.message_key
            ORDER BY m.xid, m.id LIMIT 1) r
        WHERE g.group_id = $1 AND (g.hi_xid, g.hi_id) > (d.message_xid, d.message_id)
        ORDER BY r.xid, r.id LIMIT 1) b ON true
    WHERE d.concurrency = 'ordered' AND d.message_key IS NOT NULL AND $6 > 0
), chain AS (
    SELECT d.message_key, f.message_xid, f.message_id, f.n,
           bool_and(((f.status = 'pending' AND f.can_run_after <= coalesce($2, now()))
                     OR (f.status = 'queued' AND f.expires_at < coalesce($2, now())))
                    AND (d.bound_xid IS NULL OR (f.message_xid, f.message_id) < (d.bound_xid, d.bound_id)))
               OVER (PARTITION BY d.message_key ORDER BY f.n) AS ok
    FROM bounds d
    CROSS JOIN LATERAL (
        SELECT e.message_xid, e.message_id, e.status, e.can_run_after, e.expires_at,
               row_number() OVER (ORDER BY e.message_xid, e.message_id) AS n
        FROM {s}.{t}_exception e
        WHERE e.group_id = $1 AND e.message_key = d.message_key AND e.status <> 'dead'
          AND (e.message_xid, e.message_id) > (d.message_xid, d.message_id)
        ORDER BY e.message_xid, e.message_id
        LIMIT $6) f
), locked AS (
    SELECT x.message_xid, x.message_id
    FROM chain c
    JOIN {s}.{t}_exception x ON x.group_id = $1 AND x.message_xid = c.message_xid AND x.message_id = c.message_id
    WHERE c.ok AND ((x.status = 'pending' AND x.can_run_after <= coalesce($2, now()))
                    OR (x.status = 'queued' AND x.expires_at < coalesce($2, now())))
    FOR UPDATE OF x SKIP LOCKED
), followers AS (
    SELECT c.message_xid, c.message_id FROM (
        SELECT c.message_xid, c.message_id,
               bool_and(l.message_id IS NOT NULL) OVER (PARTITION BY c.message_key ORDER BY c.n) AS kept
        FROM chain c LEFT JOIN locked l ON l.message_xid = c.message_xid AND l.message_id = c.message_id
        WHERE c.ok) c
    WHERE c.kept
), picked AS (
    SELECT due.message_xid, due.message_id, due.was, 'running' AS status FROM due
    UNION ALL
    SELECT f.message_xid, f.message_id, 'pending', 'queued' FROM followers f
), upd AS (
    UPDATE {s}.{t}_exception x
    SET status = p.status, token = gen_random_uuid(), owner = $4::uuid,
        expires_at = coalesce($2, now()) + $5::interval, updated_at = coalesce($2, now()),
        attempts = x.attempts + CASE WHEN p.was = 'running' THEN 1 ELSE 0 END,
        last_error = CASE WHEN p.was = 'running'
                          THEN 'lease expired: the instance running it died or stopped renewing'
                          ELSE x.last_error END
    FROM picked p
    WHERE x.group_id = $1 AND x.message_xid = p.message_xid AND x.message_id = p.message_id
    RETURNING x.message_xid, x.message_id, x.token, x.concurrency, x.attempts, x.delays, p.was = 'running' AS expired, x.status
)
SELECT upd.token::text, upd.concurrency, upd.attempts, upd.delays, upd.expired, upd.status = 'queued',
       m.xid, m.id, m.produced_at, m.version, coalesce(m.routing_key, ''), coalesce(m.message_key, ''),
       m.payload::text, coalesce(m.options::text, '')
FROM upd JOIN {s}.{t}_log m ON m.xid = upd.message_xid AND m.id = upd.message_id
ORDER BY m.xid, m.id`),

		// Settle one exception attempt under its lease token: delete on
		// success, else write the next state; release the row's key lease.
		// Settle one exception attempt under its lease token: delete on
		// success, else write the next state. The row's key lease is
		// released, or, when $14 names the next row of its ordered chain,
		// handed to that row, which starts running.
		settleException: r.Replace(`-- store.SettleException
WITH k AS (
    DELETE FROM {s}.{t}_key_lease WHERE group_id = $1 AND token = $4::uuid AND $14 = ''
), kh AS (
    UPDATE {s}.{t}_key_lease SET token = nullif($14, '')::uuid
    WHERE group_id = $1 AND token = $4::uuid AND $14 <> ''
), del AS (
    DELETE FROM {s}.{t}_exception
    WHERE $5 AND group_id = $1 AND message_xid = $2 AND message_id = $3 AND token = $4::uuid
    RETURNING 1
), upd AS (
    UPDATE {s}.{t}_exception
    SET status = $6, attempts = $7, delays = $8, last_error = $9,
        can_run_after = coalesce($10, now()) + $11 * interval '1 microsecond',
        token = NULL, owner = NULL, expires_at = NULL, updated_at = coalesce($10, now())
    WHERE NOT $5 AND group_id = $1 AND message_xid = $2 AND message_id = $3 AND token = $4::uuid
    RETURNING 1
), l AS (
    INSERT INTO {s}.{t}_delivery (group_id, message_xid, message_id, attempt, outcome, error, at)
    SELECT $1, $2, $3, $13, $12, $9, coalesce($10, now())
    WHERE $12 <> '' AND (EXISTS (SELECT 1 FROM del) OR EXISTS (SELECT 1 FROM upd))
), nxt AS (
    UPDATE {s}.{t}_exception SET status = 'running', updated_at = coalesce($10, now())
    WHERE group_id = $1 AND message_xid = $15 AND message_id = $16
      AND token = nullif($14, '')::uuid AND status = 'queued'
      AND (EXISTS (SELECT 1 FROM del) OR EXISTS (SELECT 1 FROM upd))
    RETURNING 1
)
SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM upd), (SELECT count(*) FROM nxt)`),

		// Give queued (and not yet settled) rows back to pending without
		// spending an attempt: the chain they waited in broke.
		returnRuns: r.Replace(`-- store.ReturnRuns
WITH k AS (
    DELETE FROM {s}.{t}_key_lease WHERE group_id = $1 AND token = ANY ($2::uuid[])
)
UPDATE {s}.{t}_exception x
SET status = 'pending', token = NULL, owner = NULL, expires_at = NULL, updated_at = coalesce($3, now())
FROM unnest($4::bigint[], $5::bigint[]) AS r(xid, id)
WHERE x.group_id = $1 AND x.message_xid = r.xid AND x.message_id = r.id
  AND x.token = ANY ($2::uuid[]) AND x.status IN ('running', 'queued')`),

		currentBindings: r.Replace(`-- store.DeclareBindings
SELECT id, patterns FROM {s}.{t}_binding_declaration
WHERE group_id = $1 AND status = 'installed'
ORDER BY id DESC LIMIT 1`),

		// The ledger is append-only: these two statements are the only ones
		// that write it, and both only insert.
		appendDeclaration: r.Replace(`-- store.DeclareBindings
INSERT INTO {s}.{t}_binding_declaration (group_id, status, patterns, declared_by, declared_at, attempt_at)
VALUES ($1, $2, $3, $4, $5, coalesce($6, now()))`),

		installBindings: r.Replace(`-- store.DeclareBindings
INSERT INTO {s}.{t}_binding_declaration (group_id, status, patterns, declared_by, declared_at, attempt_at)
VALUES ($1, 'installed', $2, $3, $4, coalesce($5, now()))
RETURNING id`),

		// Swap the binding rows to the installed declaration $4, in the
		// transaction that appended it. Sibling CTEs do not see each other's
		// deletes, so the rows of patterns both sets share are updated in
		// place, never deleted and inserted again (which collided on the
		// primary key: the simulator's rolling-deploy scenario found it).
		swapBindings: r.Replace(`-- store.DeclareBindings
WITH gone AS (
    DELETE FROM {s}.{t}_binding WHERE group_id = $1 AND pattern <> ALL ($2::text[])
)
INSERT INTO {s}.{t}_binding AS b (group_id, pattern, regex, declaration_id)
SELECT $1, p.pattern, p.regex, $4 FROM unnest($2::text[], $3::text[]) AS p(pattern, regex)
ON CONFLICT (group_id, pattern) DO UPDATE SET regex = EXCLUDED.regex, declaration_id = EXCLUDED.declaration_id`),

		// The newest installed row, and each declarer's newest waiting row
		// after it.
		ledger: r.Replace(`-- store.BindingLedger
WITH inst AS (
    SELECT id, status, patterns, declared_by, declared_at, attempt_at
    FROM {s}.{t}_binding_declaration
    WHERE group_id = $1 AND status = 'installed'
    ORDER BY id DESC LIMIT 1
), waits AS (
    SELECT DISTINCT ON (declared_by) id, status, patterns, declared_by, declared_at, attempt_at
    FROM {s}.{t}_binding_declaration
    WHERE group_id = $1 AND status = 'waiting' AND id > coalesce((SELECT id FROM inst), 0)
    ORDER BY declared_by, id DESC
)
SELECT id, status, patterns, declared_by, declared_at, attempt_at FROM inst
UNION ALL
SELECT id, status, patterns, declared_by, declared_at, attempt_at FROM waits
ORDER BY id`),

		bindingsInForce: r.Replace(`-- store.BindingsInForce
SELECT coalesce(max(declaration_id), 0), coalesce(array_agg(pattern ORDER BY pattern), '{}')
FROM {s}.{t}_binding WHERE group_id = $1`),

		ledgerAll: r.Replace(`-- store.LedgerRows
SELECT id, status, patterns, declared_by, declared_at, attempt_at
FROM {s}.{t}_binding_declaration WHERE group_id = $1 ORDER BY id`),

		bindingSet: r.Replace(`-- store.BindingSet
SELECT coalesce(array_agg(pattern ORDER BY pattern), '{}') FROM {s}.{t}_binding WHERE group_id = $1`),

		deliveries: r.Replace(`-- store.Deliveries
SELECT message_id, attempt, outcome, error, at FROM {s}.{t}_delivery
WHERE group_id = $1 AND ($2::bigint IS NULL OR message_id = $2)
ORDER BY id`),

		// The committed position: everything at or below it is settled.
		// Outstanding ranges and unresolved (non-dead) exception rows pin
		// it; dead letters never do.
		committed: r.Replace(`-- store.Committed
SELECT p.xid, p.id FROM (
    SELECT lo_xid AS xid, lo_id AS id FROM {s}.{t}_range WHERE group_id = $1
    UNION ALL
    SELECT x.message_xid, x.message_id - 1 FROM {s}.{t}_exception x WHERE x.group_id = $1 AND x.status <> 'dead'
    UNION ALL
    SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1
) p ORDER BY p.xid, p.id LIMIT 1`),

		listDead: r.Replace(`-- store.ListDead
SELECT x.message_id, x.attempts, x.last_error, x.updated_at, coalesce(x.message_key, ''),
       coalesce(m.routing_key, ''), m.version, m.produced_at
FROM {s}.{t}_exception x JOIN {s}.{t}_log m ON m.xid = x.message_xid AND m.id = x.message_id
WHERE x.group_id = $1 AND x.status = 'dead' AND x.message_id > $2
ORDER BY x.message_id
LIMIT $3`),

		// A redrive puts dead letters back on the curve from attempt zero.
		redrive: r.Replace(`-- store.Redrive
UPDATE {s}.{t}_exception
SET status = 'pending', attempts = 0, delays = 0, can_run_after = coalesce($3, now()),
    last_error = 'redriven after: ' || last_error, updated_at = coalesce($3, now())
WHERE group_id = $1 AND status = 'dead' AND ($2::bigint IS NULL OR message_id = $2)`),

		exceptionState: r.Replace(`-- store.ExceptionStates
SELECT x.message_id, x.status, x.attempts, x.delays, x.last_error, x.can_run_after, x.concurrency
FROM {s}.{t}_exception x WHERE x.group_id = $1 ORDER BY x.message_xid, x.message_id`),

		rangeLeases: r.Replace(`-- store.RangeLeases
SELECT id, token::text, owner::text, reclaims FROM {s}.{t}_range WHERE group_id = $1 ORDER BY id`),
	}
	t.insertBatchName, t.insertBatchWakeName = statementName(t.insertBatch), statementName(t.insertBatchWake)
	return t
}

// insertBatchSQL writes a produce call's unkeyed messages, ids in item order.
// The guard ($7, the stream's name, or ” for none) is a one-time filter:
// when the stream's row no longer carries that name, nothing is written.
const insertBatchSQL = `INSERT INTO {s}.{t}_log (produced_at, version, routing_key, message_key, payload, options)
SELECT coalesce($1, now()), m.version, nullif(m.routing_key, ''), nullif(m.message_key, ''),
       m.payload::json, nullif(m.options, '')::jsonb
FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[])
     WITH ORDINALITY AS m(version, routing_key, message_key, payload, options, n)
WHERE $7::text = '' OR (SELECT s.name FROM {s}.stream_config s WHERE s.id = {id}) = $7::text
ORDER BY m.n
RETURNING id`
