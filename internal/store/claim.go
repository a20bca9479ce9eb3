package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Position orders the log: the producing transaction's id first, then the
// row's id. Claims hand out only positions whose transaction has ended.
type Position struct {
	Xid int64
	ID  int64
}

// Less orders positions as the log does.
func (p Position) Less(q Position) bool {
	return p.Xid < q.Xid || (p.Xid == q.Xid && p.ID < q.ID)
}

// Message is a message read from the log.
type Message struct {
	Position
	ProducedAt time.Time
	Version    int
	RoutingKey string
	Key        string
	Payload    []byte // nil when the message does not match the group's bindings
	Options    []byte
	Headers    []byte // a JSON object of strings, or nil
	// Matched is false for a message the group's binding set does not
	// route to it: it is settled without being delivered.
	Matched bool
}

// payloadSlab copies a claim's payloads into a few shared arrays instead of
// one allocation per message (otherwise the claim's largest allocation). The log stores payloads as json, whose wire form in
// either format is the JSON text itself. A NULL payload (a message the
// group's bindings do not route to it) stays nil.
//
// A slab is sized for the rows still to come, each as large as the row that
// starts it, plus a sixteenth: uniform rows fit one slab with little to
// spare. (It was sized for twice the rows to come, so every claim of 1,000
// 1 KB messages allocated, zeroed and page-faulted 2 MB to hold 1 MB: 41% of
// the burn-down's allocated bytes, and the garbage collector's and the
// scavenger's work with them.)
type payloadSlab struct {
	buf       []byte
	allocated int // bytes of every slab started, for tests
	// pool, if set, gives the slabs (rounded up to its classes), and held
	// keeps them for the range's Recycle.
	pool *SlabPool
	held [][]byte
}

// row copies one claimed row's payload, options and headers; left is the
// number of rows still to copy, this one included.
func (s *payloadSlab) row(payload, options, headers []byte, left int) (p, o, h []byte) {
	need := len(payload) + len(options) + len(headers)
	if cap(s.buf)-len(s.buf) < need {
		size := need * max(left, 1)
		size = max(size+size/16, 4096)
		if s.pool != nil {
			s.buf = s.pool.get(size)
			s.held = append(s.held, s.buf)
		} else {
			s.buf = make([]byte, 0, size)
		}
		s.allocated += cap(s.buf)
	}
	return s.copy(payload), s.copy(options), s.copy(headers)
}

// copy returns a copy of raw in the slab, which has room for it; nil stays
// nil (a NULL column) and empty stays empty.
func (s *payloadSlab) copy(raw []byte) []byte {
	if len(raw) == 0 {
		if raw == nil {
			return nil
		}
		return []byte{}
	}
	start := len(s.buf)
	s.buf = append(s.buf, raw...)
	return s.buf[start:len(s.buf):len(s.buf)]
}

// Range is a leased slice of one group's log.
type Range struct {
	ID       int64
	Token    string
	Reclaims int
	Messages []Message
	// Bindings is the binding declaration whose set filtered this claim
	// (0: no bindings, the whole stream).
	Bindings int64
	// Drained: when the range was claimed, no claimable position followed
	// it (ClaimRange only). A claim right after it would find nothing.
	Drained bool
	// slabs hold the messages' payloads when the claim took them from a
	// SlabPool (Recycle).
	slabs [][]byte
}

// ClaimParams are the inputs of a claim.
type ClaimParams struct {
	Owner string // worker_instance id
	Limit int
	Lease time.Duration
	Now   Now
	// Slabs, if set, gives ClaimRange's payload slabs; the caller then
	// gives them back with the range's Recycle once nothing reads them.
	Slabs *SlabPool
}

// ClaimRange hands out the next range of final positions, or ok=false when
// none is available. It takes two statements: the first moves the cursor
// and writes the lease (and commits: the cursor's lock is held for one
// short statement, not while a megabyte of messages goes out), the second
// reads the range's messages by its bounds. The claim used to be one
// statement, whose data-modifying CTEs made PostgreSQL run it to completion
// into a tuplestore before sending a row: every claimed message was copied
// (and its memory zeroed) once more on the server, a fifth of the server's
// CPU in the burn-down (perf; decision 0047). If the second
// statement fails, the range stays leased to this owner, unread, as when a
// claim's reply is lost: the claimer's reconcile lets go of a lease it does
// not know, and a sweep reclaims it (TestALostClaimReplyIsLetGo).
func (g Group) ClaimRange(ctx context.Context, a ClaimParams) (r Range, ok bool, err error) {
	var loXid, loID, hiXid, hiID int64
	var more bool
	var n int // the range's positions: its messages, short of a manual delete
	err = g.db().QueryRow(ctx, g.sql(claimSQL), g.GroupID, a.Limit, a.Now, a.Owner, a.Lease).
		Scan(&r.ID, &r.Token, &loXid, &loID, &hiXid, &hiID, &more, &n)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("claim range: %w", err)
	}
	rows, err := g.db().Query(ctx, g.sql(claimMessagesSQL), g.GroupID, loXid, loID, hiXid, hiID, a.Limit)
	if err != nil {
		return r, false, fmt.Errorf("claim range %d: read its messages: %w", r.ID, err)
	}
	defer rows.Close()
	// Sized for the range's positions, not for a.Limit: over many streams
	// a range holds a stream's few messages, and buffers sized for a full
	// batch allocated (and zeroed, and the collector swept) five times the
	// bytes they held (BENCHMARKS.md at af43cd7).
	n = max(min(n, a.Limit), 1)
	r.Messages = make([]Message, 0, n)
	slab := payloadSlab{pool: a.Slabs}
	var m Message
	// The binding declaration repeats on every row: scanned from the first
	// only. Payload, options and headers are copied into the slab.
	first := []any{&m.Xid, &m.ID, &m.ProducedAt, &m.Version, &m.RoutingKey, &m.Key, nil, nil, &m.Matched, &r.Bindings, nil}
	rest := []any{&m.Xid, &m.ID, &m.ProducedAt, &m.Version, &m.RoutingKey, &m.Key, nil, nil, &m.Matched, nil, nil}
	for rows.Next() {
		m = Message{}
		dst := rest
		if len(r.Messages) == 0 {
			dst = first
		}
		if err := rows.Scan(dst...); err != nil {
			return r, false, fmt.Errorf("claim range %d: scan: %w", r.ID, err)
		}
		raw := rows.RawValues()
		var options, headers []byte
		if len(raw[7]) > 0 {
			options = raw[7]
		}
		if len(raw[10]) > 0 {
			headers = raw[10]
		}
		m.Payload, m.Options, m.Headers = slab.row(raw[6], options, headers, n-len(r.Messages))
		r.Messages = append(r.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return r, false, fmt.Errorf("claim range %d: read its messages: %w", r.ID, err)
	}
	// A range whose positions are gone (never, short of a manual delete)
	// comes back empty: the claimer settles it at once.
	r.Drained = !more
	r.slabs = slab.held
	return r, true, nil
}

// reclaimSlabRows is the rows a reclaim's slab is sized for: the range's
// size is not known before its rows arrive, and a slab per row cost 4 KB a
// 1 KB message.
const reclaimSlabRows = 64

// ReclaimRange takes over one expired lease of the group with a new token.
func (g Group) ReclaimRange(ctx context.Context, a ClaimParams) (r Range, ok bool, err error) {
	rows, err := g.db().Query(ctx, g.sql(reclaimSQL), g.GroupID, a.Now, a.Owner, a.Lease)
	if err != nil {
		return r, false, fmt.Errorf("reclaim range: %w", err)
	}
	defer rows.Close()
	var slab payloadSlab
	for rows.Next() {
		var (
			m         Message
			ver       *int32
			rk, key   *string
			mxid, mid *int64
			at        *time.Time
		)
		if err := rows.Scan(&r.ID, &r.Token, &r.Reclaims, &mxid, &mid, &at, &ver, &rk, &key, nil, &m.Options, &m.Matched, &r.Bindings, &m.Headers); err != nil {
			return r, false, fmt.Errorf("reclaim range: scan: %w", err)
		}
		ok = true
		if mid == nil { // a lease over positions that no longer exist
			continue
		}
		m.Payload, _, _ = slab.row(rows.RawValues()[9], nil, nil, reclaimSlabRows)
		m.Xid, m.ID, m.ProducedAt, m.Version, m.RoutingKey, m.Key = *mxid, *mid, *at, int(*ver), *rk, *key
		r.Messages = append(r.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return r, false, fmt.Errorf("reclaim range: %w", err)
	}
	return r, ok, nil
}

// Gate reports, for a claim that found nothing, whether committed rows wait
// behind an open transaction (the gate's xmin): Pending, rows after the
// cursor's head. Expired: a range lease of the group has lapsed (a sweep
// reclaims it).
type Gate struct {
	Xmin    int64
	Pending bool
	Expired bool
}

// GateProbe tells an empty claim apart from a stalled one, and tells an idle
// claimer's sweep whether it has anything to claim.
func (g Group) GateProbe(ctx context.Context, now Now) (Gate, error) {
	var gate Gate
	if err := g.db().QueryRow(ctx, g.sql(gateProbeSQL), g.GroupID, now).Scan(&gate.Xmin, &gate.Pending, &gate.Expired); err != nil {
		return gate, fmt.Errorf("gate probe: %w", err)
	}
	return gate, nil
}

// LeasesExpired reports whether a range lease of the group has lapsed: a
// busy claimer's sweep asks it before ReclaimRange. The reclaim is the
// claim's size to plan (its plan cost 4.8 ms a call against 0.35 ms to run
// when 1,000 streams each planned theirs afresh, decision 0042);
// this look, one index probe, plans in a tenth of that, and nearly every
// sweep finds nothing.
func (g Group) LeasesExpired(ctx context.Context, now Now) (bool, error) {
	var expired bool
	if err := g.db().QueryRow(ctx, g.sql(leasesExpiredSQL), oneShot, g.GroupID, now).Scan(&expired); err != nil {
		return false, fmt.Errorf("look for expired leases: %w", err)
	}
	return expired, nil
}

var leasesExpiredSQL = perStream(`-- store.LeasesExpired
SELECT EXISTS (SELECT 1 FROM {s}.{t}_range g WHERE g.group_id = $1 AND g.expires_at < coalesce($2, now()))`)

// Blocker is a session holding the oldest open transaction.
type Blocker struct {
	PID             int
	ApplicationName string
	XactStart       time.Time
	State           string
}

// GateBlockers lists sessions whose transaction id is the gate's xmin: the
// transactions a stalled claim waits for. Query text is never read.
func (st *Store) GateBlockers(ctx context.Context, xmin int64) ([]Blocker, error) {
	rows, err := st.pool.Query(ctx, `-- store.GateBlockers
SELECT pid, coalesce(application_name, ''), coalesce(xact_start, now()), coalesce(state, '')
FROM pg_catalog.pg_stat_activity
WHERE backend_xid IS NOT NULL AND backend_xid::text::bigint = ($1::bigint & 4294967295)`, xmin)
	if err != nil {
		return nil, fmt.Errorf("gate blockers: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Blocker, error) {
		var b Blocker
		err := r.Scan(&b.PID, &b.ApplicationName, &b.XactStart, &b.State)
		return b, err
	})
}

// The claim statements.

// The claim: lock the cursor, find the next positions that are final
// (xid below the snapshot's xmin), move the head and write the lease,
// returning the range's bounds (its messages are the next statement's).
// The bounds reach the log scans as scalar subqueries (InitPlan
// parameters) because only then does the planner use them as index
// conditions; a join against cur would scan the log from its start.
// The planner cannot see those bounds, so it must not be able to see
// the limit either: with a constant limit above its row estimate
// (always, before the log is analyzed) it read everything after the
// head with a bitmap scan and sorted it, on every custom-planned
// execution. As a subquery, the limit makes it plan for the first
// rows, an ordered index scan. The upper bound comes from the index
// alone. The scan reads one position more than the range takes: whether
// a claimable position follows the range (beyond), so that a claimer that
// took the last one probes before it claims again (Range.Drained). A second
// scan from the upper bound would open every chunk of the log once more.
//
// The claim commits without waiting for its WAL to reach the disk
// (synchronous_commit off for this statement's transaction, decision 0090):
// it is on every message's path from produce to handler, and losing it in a
// crash or a failover only delivers its messages again. The range's
// settlement commits durably, which makes the claim before it durable too
// (the WAL is flushed and replicated in order); key leases are taken by
// statements of their own, durably.
var claimSQL = perStream(`-- store.ClaimRange
WITH cur AS (
    SELECT head_xid, head_id FROM {s}.{t}_cursor
    WHERE group_id = $1
      AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL -- this transaction's commit only
    FOR UPDATE
), ahead AS (
    -- The next positions, one more than a range holds: that one only says
    -- whether a claimable position follows the range (beyond).
    SELECT m.xid, m.id
    FROM {s}.{t}_log m
    WHERE (m.xid, m.id) > ((SELECT head_xid FROM cur), (SELECT head_id FROM cur))
      AND m.xid >= (SELECT head_xid FROM cur) -- lets the executor skip chunks below the head
      AND m.xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
    ORDER BY m.xid, m.id
    LIMIT (SELECT $2::int + 1)
), beyond AS (
    SELECT count(*) > $2::int AS more, least(count(*), $2::int) AS n FROM ahead
), last AS (
    SELECT a.xid, a.id FROM ahead a
    ORDER BY a.xid DESC, a.id DESC
    LIMIT 1 OFFSET (SELECT CASE WHEN more THEN 1 ELSE 0 END FROM beyond)
), moved AS (
    UPDATE {s}.{t}_cursor c SET head_xid = last.xid, head_id = last.id, updated_at = coalesce($3, now())
    FROM last WHERE c.group_id = $1
    RETURNING c.group_id
)
INSERT INTO {s}.{t}_range (group_id, lo_xid, lo_id, hi_xid, hi_id, token, owner, claimed_at, expires_at)
SELECT $1, cur.head_xid, cur.head_id, last.xid, last.id, gen_random_uuid(), $4,
       coalesce($3, now()), coalesce($3, now()) + $5::interval
FROM cur, last, moved
RETURNING id, token::text, lo_xid, lo_id, hi_xid, hi_id, (SELECT more FROM beyond), (SELECT n FROM beyond)::int`)

// The range's messages, by its bounds ($2–$5), after the claim above has
// committed: its positions are final, so every later snapshot sees them. A
// plain SELECT streams its rows as it reads them. The bounds reach the scan
// through a CTE referenced more than once (materialized, so its values are
// InitPlan parameters the planner cannot see) and the limit as a subquery,
// for the reasons the claim's comment gives: the plan is an ordered scan of
// the log's (xid, id) index between the bounds, whatever the statistics.
var claimMessagesSQL = perStream(`-- store.ClaimRange: the range's messages
WITH rng AS (
    SELECT $2::bigint AS lo_xid, $3::bigint AS lo_id, $4::bigint AS hi_xid, $5::bigint AS hi_id
), binds AS (
    -- The group's binding set, read in this statement's snapshot: every
    -- claim filters by exactly one declared set.
    SELECT array_agg(regex) AS rx, coalesce(max(declaration_id), 0) AS decl
    FROM {s}.{t}_binding WHERE group_id = $1
)
SELECT b.xid, b.id, b.produced_at, b.version,
       coalesce(b.routing_key, ''), coalesce(b.message_key, ''),
       CASE WHEN mt.matched THEN b.payload::text END, coalesce(b.options::text, ''), mt.matched, (SELECT decl FROM binds),
       CASE WHEN mt.matched THEN b.headers::text END
FROM {s}.{t}_log b,
     LATERAL (SELECT (SELECT rx FROM binds) IS NULL
                  OR (b.routing_key IS NOT NULL
                      AND EXISTS (SELECT 1 FROM unnest((SELECT rx FROM binds)) AS r(x) WHERE ('.' || b.routing_key) ~ r.x)) AS matched) mt
WHERE (b.xid, b.id) > ((SELECT lo_xid FROM rng), (SELECT lo_id FROM rng))
  AND (b.xid, b.id) <= ((SELECT hi_xid FROM rng), (SELECT hi_id FROM rng))
  AND b.xid >= (SELECT lo_xid FROM rng) AND b.xid <= (SELECT hi_xid FROM rng) -- chunk pruning
ORDER BY b.xid, b.id
LIMIT (SELECT $6::int)`)

var reclaimSQL = perStream(`-- store.ReclaimRange
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
    RETURNING g.id, g.token, g.reclaims, g.lo_xid, g.lo_id, g.hi_xid, g.hi_id, g.settled
), binds AS (
    SELECT array_agg(regex) AS rx, coalesce(max(declaration_id), 0) AS decl
    FROM {s}.{t}_binding WHERE group_id = $1
)
SELECT upd.id, upd.token::text, upd.reclaims, m.xid, m.id, m.produced_at, m.version,
       coalesce(m.routing_key, ''), coalesce(m.message_key, ''),
       CASE WHEN mt.matched THEN m.payload::text END, coalesce(m.options::text, ''), coalesce(mt.matched, false), binds.decl,
       CASE WHEN mt.matched THEN m.headers::text END
FROM upd
CROSS JOIN binds
LEFT JOIN (
    SELECT l.xid, l.id, l.produced_at, l.version, l.routing_key, l.message_key, l.payload, l.options, l.headers
    FROM {s}.{t}_log l
    WHERE (l.xid, l.id) > ((SELECT lo_xid FROM upd), (SELECT lo_id FROM upd))
      AND (l.xid, l.id) <= ((SELECT hi_xid FROM upd), (SELECT hi_id FROM upd))
      AND l.xid >= (SELECT lo_xid FROM upd) AND l.xid <= (SELECT hi_xid FROM upd) -- chunk pruning
      AND l.id <> ALL (coalesce((SELECT settled FROM upd), '{}')) -- settled beyond the prefix by an earlier holder
) m ON true
LEFT JOIN LATERAL (SELECT binds.rx IS NULL
                       OR (m.routing_key IS NOT NULL
                           AND EXISTS (SELECT 1 FROM unnest(binds.rx) AS r(x) WHERE ('.' || m.routing_key) ~ r.x)) AS matched) mt ON true
ORDER BY m.xid, m.id`)

// The probe's Pending looks for a committed row after the head between the
// xids still in progress: the snapshot's xip at or above the head, and
// everything from its xmax (where an open transaction's xid is when none
// finished after it began). It makes one ordered index probe per gap, in a
// lateral subquery with a limit, which the planner cannot turn into a join
// that scans the log. So an open transaction's rows, which no snapshot sees,
// are skipped rather than visited one heap tuple at a time (behind an open
// 200,000-row produce a probe took a second and more,
// TestTheGateProbeSkipsAnOpenTransactionsRows). The log's xid is the
// producing transaction's top-level id, as the xip's are. Each gap's scalar
// lower bound (the head's xid, or one past an open xid) lets the executor
// skip the chunks below it; past an open xid it is the row bound's equal.
var gateProbeSQL = perStream(`-- store.GateProbe
WITH h AS MATERIALIZED (
    SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1
), snap AS MATERIALIZED (
    SELECT pg_current_snapshot() AS s
), open AS MATERIALIZED (
    SELECT x::text::bigint AS x FROM pg_snapshot_xip((SELECT s FROM snap)) AS x
    WHERE x::text::bigint >= (SELECT head_xid FROM h)
), top AS (
    SELECT pg_snapshot_xmax(s)::text::bigint AS x FROM snap
), gaps AS (
    -- From the head to the first xid in progress, then from past each to
    -- the next, and from past the last to the snapshot's xmax (no xid at or
    -- above it is visible, and none is listed): (lo, lo_id) and hi exclusive.
    SELECT (SELECT head_xid FROM h) AS lo, (SELECT head_id FROM h) AS lo_id, (SELECT head_xid FROM h) AS lo_min,
           coalesce(min(x), (SELECT x FROM top)) AS hi FROM open
    UNION ALL
    SELECT x, 9223372036854775807, x + 1, coalesce(lead(x) OVER (ORDER BY x), (SELECT x FROM top)) FROM open
)
SELECT (SELECT pg_snapshot_xmin(s)::text::bigint FROM snap),
       coalesce((SELECT true FROM gaps g,
                 LATERAL (SELECT 1 FROM {s}.{t}_log m
                          WHERE (m.xid, m.id) > (g.lo, g.lo_id) AND m.xid >= g.lo_min AND m.xid < g.hi
                          ORDER BY m.xid, m.id LIMIT 1) f
                 WHERE g.lo < g.hi
                 LIMIT 1), false),
       EXISTS (SELECT 1 FROM {s}.{t}_range g WHERE g.group_id = $1 AND g.expires_at < coalesce($2, now()))`)
