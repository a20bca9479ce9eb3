package store

import (
	"fmt"
	"strings"
	"sync"
)

// tables holds one stream's statements, built once: pgx caches prepared
// statements by text, so a stable text per stream is also a fast one.
type tables struct {
	insertCursor   string
	insertBatch    string
	insertKeyed    string
	claim          string
	reclaim        string
	commit         string
	release        string
	renewRanges    string
	gateProbe      string
	countLog       string
	countException string
	rangeLeases    string
}

var tablesCache sync.Map // key schema+"\x00"+streamID → *tables

func (st *Store) streamTables(streamID int64) *tables {
	key := fmt.Sprintf("%s\x00%d", st.schema, streamID)
	if t, ok := tablesCache.Load(key); ok {
		return t.(*tables)
	}
	t := buildTables(st.s, tablePrefix(streamID))
	actual, _ := tablesCache.LoadOrStore(key, t)
	return actual.(*tables)
}

func buildTables(schema, prefix string) *tables {
	r := strings.NewReplacer("{s}", schema, "{t}", prefix)
	return &tables{
		insertCursor: r.Replace(`-- store.RegisterGroup
INSERT INTO {s}.{t}_cursor (group_id, head_xid, head_id, updated_at)
SELECT $1,
       CASE WHEN $2 THEN pg_snapshot_xmin(pg_current_snapshot())::text::bigint ELSE 0 END,
       0, coalesce($3, now())
ON CONFLICT (group_id) DO NOTHING`),

		insertBatch: r.Replace(`-- store.Produce
INSERT INTO {s}.{t}_log (produced_at, version, routing_key, message_key, payload, options)
SELECT coalesce($1, now()), m.version, nullif(m.routing_key, ''), nullif(m.message_key, ''),
       m.payload::jsonb, nullif(m.options, '')::jsonb
FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[])
     WITH ORDINALITY AS m(version, routing_key, message_key, payload, options, n)
ORDER BY m.n
RETURNING id`),

		// The idempotency row takes the message's id from the log's identity
		// sequence first, so two producers racing on one key serialize on the
		// key's unique index and exactly one log row is written.
		insertKeyed: r.Replace(`-- store.Produce
WITH k AS (
    INSERT INTO {s}.{t}_idempotency (key, message_id, created_at)
    VALUES ($2, nextval(pg_get_serial_sequence('{s}.{t}_log', 'id')), coalesce($1, now()))
    ON CONFLICT (key) DO NOTHING
    RETURNING message_id
), ins AS (
    INSERT INTO {s}.{t}_log (id, produced_at, version, routing_key, message_key, payload, options)
    OVERRIDING SYSTEM VALUE
    SELECT k.message_id, coalesce($1, now()), $3, nullif($4, ''), nullif($5, ''), $6::text::jsonb, nullif($7, '')::jsonb
    FROM k
    RETURNING id
)
SELECT id, false FROM ins
UNION ALL
SELECT coalesce((SELECT message_id FROM {s}.{t}_idempotency WHERE key = $2), 0), true
WHERE NOT EXISTS (SELECT 1 FROM k)`),

		// One statement, one round trip: lock the cursor, read the next
		// positions that are final (xid below the snapshot's xmin), move the
		// head and write the lease.
		// The bounds reach the log scan as scalar subqueries (InitPlan
		// parameters) because only then does the planner use them as index
		// conditions; a join against cur would scan the log from its start.
		claim: r.Replace(`-- store.ClaimRange
WITH cur AS (
    SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1 FOR UPDATE
), batch AS (
    SELECT m.xid, m.id, m.produced_at, m.version, m.routing_key, m.message_key, m.payload, m.options
    FROM {s}.{t}_log m
    WHERE (m.xid, m.id) > ((SELECT head_xid FROM cur), (SELECT head_id FROM cur))
      AND m.xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
    ORDER BY m.xid, m.id
    LIMIT $2
), last AS (
    SELECT xid, id FROM batch ORDER BY xid DESC, id DESC LIMIT 1
), moved AS (
    UPDATE {s}.{t}_cursor c SET head_xid = last.xid, head_id = last.id, updated_at = coalesce($3, now())
    FROM last WHERE c.group_id = $1
    RETURNING c.group_id
), rng AS (
    INSERT INTO {s}.{t}_range (group_id, lo_xid, lo_id, hi_xid, hi_id, token, owner, claimed_at, expires_at)
    SELECT $1, cur.head_xid, cur.head_id, last.xid, last.id, gen_random_uuid(), $4,
           coalesce($3, now()), coalesce($3, now()) + $5::interval
    FROM cur, last, moved
    RETURNING id, token
)
SELECT rng.id, rng.token::text, b.xid, b.id, b.produced_at, b.version,
       coalesce(b.routing_key, ''), coalesce(b.message_key, ''), b.payload::text, coalesce(b.options::text, '')
FROM batch b, rng
ORDER BY b.xid, b.id`),

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
)
SELECT upd.id, upd.token::text, upd.reclaims, m.xid, m.id, m.produced_at, m.version,
       coalesce(m.routing_key, ''), coalesce(m.message_key, ''), m.payload::text, coalesce(m.options::text, '')
FROM upd
LEFT JOIN (
    SELECT l.xid, l.id, l.produced_at, l.version, l.routing_key, l.message_key, l.payload, l.options
    FROM {s}.{t}_log l
    WHERE (l.xid, l.id) > ((SELECT lo_xid FROM upd), (SELECT lo_id FROM upd))
      AND (l.xid, l.id) <= ((SELECT hi_xid FROM upd), (SELECT hi_id FROM upd))
) m ON true
ORDER BY m.xid, m.id`),

		// Deleting the lease by its token is the fence: zero rows means a
		// reclaimer owns the range now, and the exception rows are not written.
		commit: r.Replace(`-- store.CommitRange
WITH d AS (
    DELETE FROM {s}.{t}_range WHERE id = $1 AND token = $2::uuid RETURNING group_id
), e AS (
    INSERT INTO {s}.{t}_exception (group_id, message_xid, message_id, status, attempts, last_error,
                                    can_run_after, created_at, updated_at)
    SELECT d.group_id, x.xid, x.id, 'pending', 1, x.err,
           coalesce($3, now()) + $4::interval, coalesce($3, now()), coalesce($3, now())
    FROM d, unnest($5::bigint[], $6::bigint[], $7::text[]) AS x(xid, id, err)
    ON CONFLICT (group_id, message_xid, message_id) DO NOTHING
)
SELECT count(*) FROM d`),

		// Hand a range back at once: its settled prefix is dropped by moving
		// lo, and the lease expires now so any instance reclaims the rest.
		release: r.Replace(`-- store.ReleaseRange
UPDATE {s}.{t}_range
SET lo_xid = coalesce($3, lo_xid), lo_id = coalesce($4, lo_id), expires_at = coalesce($5, now()) - interval '1 millisecond'
WHERE id = $1 AND token = $2::uuid`),

		renewRanges: r.Replace(`-- store.RenewInstance
UPDATE {s}.{t}_range SET expires_at = coalesce($2, now()) + $3::interval WHERE owner = $1`),

		gateProbe: r.Replace(`-- store.GateProbe
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
       coalesce((SELECT true FROM {s}.{t}_log m
               WHERE (m.xid, m.id) > ((SELECT head_xid FROM {s}.{t}_cursor WHERE group_id = $1),
                                      (SELECT head_id FROM {s}.{t}_cursor WHERE group_id = $1))
               ORDER BY m.xid, m.id LIMIT 1), false)`),

		countLog: r.Replace(`-- store.CountLog
SELECT count(*) FROM {s}.{t}_log`),

		countException: r.Replace(`-- store.CountExceptions
SELECT count(*) FROM {s}.{t}_exception WHERE group_id = $1`),

		rangeLeases: r.Replace(`-- store.RangeLeases
SELECT id, token::text, owner::text, reclaims FROM {s}.{t}_range WHERE group_id = $1 ORDER BY id`),
	}
}
