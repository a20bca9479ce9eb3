package store

import (
	"context"
	"fmt"
	"time"
)

// ExceptionRun is an exception row leased for one attempt.
type ExceptionRun struct {
	Message
	Token       string
	Concurrency string
	Attempts    int  // failed attempts so far (including a lapsed lease just now)
	Delays      int  // delays used so far
	Expired     bool // the row was taken over from a lapsed lease
	// Queued marks a row leased behind its ordered key's head in the same
	// claim: it runs when the row before it resolves (see SettleException's
	// Next) and not before.
	Queued bool
	// Prefetched marks a row leased beyond the claim's free handler slots
	// (ClaimExceptions.Prefetch): 'queued' in the table, so that its lease
	// lapsing spends no attempt, and run when a slot frees.
	Prefetched bool
}

// QuarantinedPrefix starts the last_error of a row a quarantined range left
// (and no attempt has changed since): the status counts and the claim, which
// never prefetches such a row, read it.
const QuarantinedPrefix = "quarantined:"

// ClaimExceptions is an exception claim's inputs.
type ClaimExceptions struct {
	Owner string // the exception consumer's worker instance
	Limit int    // rows to start
	// Prefetch is how many more due rows, pending and of no key lease, to
	// lease beyond Limit, 'queued' (see ExceptionRun.Prefetched): a claim
	// costs about the same for 1 row as for 1,000, so a backlog of retries
	// is claimed in batches rather than a statement per free slot.
	Prefetch int
	Chain    int // rows of an ordered or exclusive key to lease behind its head
	Lease    time.Duration
	Now      Now
	// HoldTakeovers leaves running and queued rows whose lease expired
	// alone: only pending rows that are due are claimed.
	HoldTakeovers bool
}

// ClaimExceptions leases up to Limit due exception rows of the group, and
// behind each ordered or exclusive head up to Chain more rows of its key,
// queued, and up to Prefetch more due rows of no key lease, prefetched, in
// log order (rows come back in log order: a key's queued rows follow its
// head).
func (g Group) ClaimExceptions(ctx context.Context, c ClaimExceptions) ([]ExceptionRun, error) {
	rows, err := g.db().Query(ctx, g.sql(claimExceptionsSQL), g.GroupID, c.Now, c.Limit, c.Owner, c.Lease, c.Chain, c.HoldTakeovers, max(c.Prefetch, 0))
	if err != nil {
		return nil, fmt.Errorf("claim exceptions: %w", err)
	}
	defer rows.Close()
	var out []ExceptionRun
	for rows.Next() {
		var r ExceptionRun
		m := &r.Message
		if err := rows.Scan(&r.Token, &r.Concurrency, &r.Attempts, &r.Delays, &r.Expired, &r.Queued, &r.Prefetched,
			&m.Xid, &m.ID, &m.ProducedAt, &m.Version, &m.RoutingKey, &m.Key, &m.Payload, &m.Options, &m.Headers); err != nil {
			return nil, fmt.Errorf("claim exceptions: scan: %w", err)
		}
		m.Matched = true // routed to the group when its range was claimed
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim exceptions: %w", err)
	}
	return out, nil
}

// ExceptionsDue reports whether the group has an exception row a claim could
// take: pending and due, or (unless holdTakeovers) leased and lapsed; and
// how long until its earliest pending row falls due (wait, negative when it
// has none). An idle exception claimer asks this before its claim: the
// claim's statement costs about 3 ms to plan and is planned at nearly every
// call, while this one is cheap to plan and run (the idle sessions' server
// CPU was mostly the claim's planning); and a quiet one (decision 0038)
// looks again only when wait has passed.
func (g Group) ExceptionsDue(ctx context.Context, now Now, holdTakeovers bool) (due bool, wait time.Duration, err error) {
	var secs *float64
	if err := g.db().QueryRow(ctx, g.sql(exceptionsDueSQL), g.GroupID, now, holdTakeovers).Scan(&due, &secs); err != nil {
		return false, 0, fmt.Errorf("exceptions due: %w", err)
	}
	if secs == nil {
		return due, -1, nil
	}
	return due, max(time.Duration(*secs*float64(time.Second)), 0), nil
}

// Settlement is an exception row's next state after an attempt, written
// under the row's lease token.
type Settlement struct {
	Position // the row's message
	Token    string
	Now      Now

	Delete   bool
	Status   string
	Attempts int
	Delays   int
	Error    string
	After    time.Duration
	// Outcome, when set, writes a delivery-log row for attempt Attempt.
	Outcome string
	Attempt int
	// Next, when set, is the next row of the settled row's ordered chain:
	// the key lease passes to it and it starts running, in the settling
	// statement.
	Next *ExceptionRun
}

// SettleException writes an attempt's result under the row's lease token
// and reports whether s.Next started (false: its lease was lost meanwhile).
func (g Group) SettleException(ctx context.Context, s Settlement) (nextStarted bool, err error) {
	pos := s.Position
	var n, started int
	next, nxid, nid := "", int64(0), int64(0)
	if s.Next != nil {
		next, nxid, nid = s.Next.Token, s.Next.Xid, s.Next.ID
	}
	if err := g.db().QueryRow(ctx, g.sql(settleExceptionSQL), g.GroupID, pos.Xid, pos.ID, s.Token, s.Delete,
		s.Status, s.Attempts, s.Delays, s.Error, s.Now, s.After.Microseconds(), s.Outcome, s.Attempt,
		next, nxid, nid).Scan(&n, &started); err != nil {
		return false, fmt.Errorf("settle exception %d: %w", pos.ID, err)
	}
	if n == 0 {
		return false, fmt.Errorf("settle exception %d: %w", pos.ID, ErrLeaseLost)
	}
	return started > 0, nil
}

// SettleExceptions writes several attempts' results, each as
// SettleException does, in one statement (settleExceptionsSQL): one plan and
// one commit for them all. A statement each paid a commit each, which held
// the exception path to a few hundred rows a second; then, pipelined, a
// plan each (0.3 ms: each call's parameters prune the statement's branches,
// so the custom plan always wins and is made again), most of the cost of a
// burst of retries. None may carry Next, and none may hold a key lease
// (exclusive or ordered with a key): the statement locks nothing but their
// exception rows, in position order (locks.go). lost[i] reports that
// settlement i found its lease gone. On an error none of them applied, or
// (a reply lost) all of them did: a retry of one that had applied finds its
// lease gone.
func (g Group) SettleExceptions(ctx context.Context, ss []Settlement) (lost []bool, err error) {
	n := len(ss)
	xids, ids := make([]int64, n), make([]int64, n)
	tokens, statuses, errs, outcomes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	dels := make([]bool, n)
	attempts, delays, attempt := make([]int32, n), make([]int32, n), make([]int32, n)
	after := make([]int64, n)
	var now Now
	for i, s := range ss {
		if s.Next != nil {
			return nil, fmt.Errorf("settle exceptions: %d has a next row: settle it alone", s.ID)
		}
		xids[i], ids[i], tokens[i], dels[i], statuses[i] = s.Xid, s.ID, s.Token, s.Delete, s.Status
		attempts[i], delays[i], errs[i], after[i] = int32(s.Attempts), int32(s.Delays), s.Error, s.After.Microseconds()
		outcomes[i], attempt[i] = s.Outcome, int32(s.Attempt)
		if s.Status == "" {
			statuses[i] = "pending" // unused: the row is deleted
		}
		now = s.Now
	}
	rows, err := g.db().Query(ctx, g.sql(settleExceptionsSQL), g.GroupID, xids, ids, tokens, dels, statuses,
		attempts, delays, errs, after, outcomes, attempt, now)
	if err != nil {
		return nil, fmt.Errorf("settle %d exceptions: %w", n, err)
	}
	defer rows.Close()
	gone := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("settle %d exceptions: scan: %w", n, err)
		}
		gone[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("settle %d exceptions: %w", n, err)
	}
	lost = make([]bool, n)
	for i, s := range ss {
		lost[i] = gone[s.ID]
	}
	return lost, nil
}

// ReturnRuns gives the rows leased under tokens back to pending without
// spending an attempt, and releases their key leases.
func (g Group) ReturnRuns(ctx context.Context, runs []ExceptionRun, now Now) error {
	tokens := make([]string, len(runs))
	xids, ids := make([]int64, len(runs)), make([]int64, len(runs))
	for i, r := range runs {
		tokens[i], xids[i], ids[i] = r.Token, r.Xid, r.ID
	}
	if _, err := g.db().Exec(ctx, g.sql(returnRunsSQL), g.GroupID, tokens, now, xids, ids); err != nil {
		return fmt.Errorf("return queued exception rows: %w", err)
	}
	return nil
}

// ForgetUnknownRuns returns the owner's running exception rows other than
// those leased under tokens to pending (no attempt spent: they never ran)
// and releases its key leases under other tokens.
func (g Group) ForgetUnknownRuns(ctx context.Context, owner string, tokens []string, now Now) (runs, leases int64, err error) {
	if tokens == nil {
		tokens = []string{}
	}
	err = g.db().QueryRow(ctx, g.sql(forgetRunsSQL), g.GroupID, owner, tokens, now).Scan(&runs, &leases)
	if err != nil {
		return 0, 0, fmt.Errorf("forget unknown runs: %w", err)
	}
	return runs, leases, nil
}

// The exception statements.

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
var claimExceptionsSQL = perStream(`-- store.ClaimExceptions
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
), head_candidates AS (
    SELECT h.message_xid, h.message_id, h.can_run_after FROM heads h
    WHERE h.concurrency = 'ordered'
      AND ((h.status = 'pending' AND h.can_run_after <= coalesce($2, now()))
        OR (NOT $7::boolean AND h.status IN ('running', 'queued') AND h.expires_at < coalesce($2, now())))
      AND NOT EXISTS (` + keyHeldLive("h.message_key") + `)
      AND NOT EXISTS (` + rangeHoldsEarlier("h.message_key", "h.message_xid", "h.message_id", "") + `)
    ORDER BY h.can_run_after
    LIMIT $3
), head_due AS (
    -- Each head locked by its primary key (a join of the candidates with
    -- the table planned, on stale statistics, as a bitmap scan of every
    -- row of the group: the claim's cost then followed the table, not the
    -- claim). A locked row is checked again on its newest version: one
    -- another claimer took meanwhile is no longer due and is skipped.
    SELECT x.tid, x.message_xid, x.message_id, x.message_key, x.concurrency, x.was, x.can_run_after, x.alone
    FROM head_candidates c
    CROSS JOIN LATERAL (
        SELECT e.ctid AS tid, e.message_xid, e.message_id, e.message_key, e.concurrency, e.status AS was, e.can_run_after,
               true AS alone
        FROM {s}.{t}_exception e
        WHERE e.group_id = $1 AND e.message_xid = c.message_xid AND e.message_id = c.message_id
          AND ((e.status = 'pending' AND e.can_run_after <= coalesce($2, now()))
            OR (NOT $7::boolean AND e.status IN ('running', 'queued') AND e.expires_at < coalesce($2, now())))
        FOR UPDATE SKIP LOCKED) x
), pending_due AS (
    -- Due rows of no ordered key, locked as the pending index yields them
    -- (a row another claimer locked is skipped; one it changed meanwhile
    -- is checked again on its newest version): up to $3 start now, and up
    -- to $8 more of no key lease are prefetched (see prefetched).
    SELECT x.ctid AS tid, x.message_xid, x.message_id, x.message_key, x.concurrency, x.status AS was, x.can_run_after,
           x.last_error LIKE 'quarantined:%' AS alone
    FROM {s}.{t}_exception x
    WHERE x.group_id = $1 AND x.status = 'pending' AND x.can_run_after <= coalesce($2, now())
      AND x.concurrency <> 'ordered'
      -- A row whose key a live holder has would only be parked again.
      AND (x.concurrency = 'parallel' OR x.message_key IS NULL OR NOT EXISTS (` + keyHeldLive("x.message_key") + `))
    ORDER BY x.can_run_after
    LIMIT $3 + $8
    FOR UPDATE OF x SKIP LOCKED
), takeover_due AS (
    -- Rows of no ordered key whose holder's lease lapsed, the longest
    -- lapsed first, through the index of leased rows: at most $3, each in a
    -- slot of its own.
    SELECT x.ctid AS tid, x.message_xid, x.message_id, x.message_key, x.concurrency, x.status AS was, x.can_run_after,
           x.last_error LIKE 'quarantined:%' AS alone
    FROM {s}.{t}_exception x
    WHERE NOT $7::boolean AND x.group_id = $1
      AND x.status IN ('running', 'queued') AND x.expires_at < coalesce($2, now())
      AND x.concurrency <> 'ordered'
      AND (x.concurrency = 'parallel' OR x.message_key IS NULL OR NOT EXISTS (` + keyHeldLive("x.message_key") + `))
    ORDER BY x.expires_at
    LIMIT $3
    FOR UPDATE OF x SKIP LOCKED
), keyed AS (
    -- An exclusive key's pending rows in log order (kn): the first starts
    -- and the next ones queue behind it as a chain (xfollowers), run one
    -- after another under its key lease; each would otherwise find the key
    -- busy (its head's) and park again for KeyBusyDelay, one row of a key
    -- a claim, however long the key's backlog.
    SELECT u.*, CASE WHEN u.concurrency = 'exclusive' AND u.message_key IS NOT NULL AND u.was = 'pending'
                     THEN row_number() OVER (PARTITION BY u.message_key, u.concurrency = 'exclusive' AND u.was = 'pending'
                                             ORDER BY u.message_xid, u.message_id) END AS kn
    FROM (SELECT * FROM head_due UNION ALL SELECT * FROM takeover_due UNION ALL SELECT * FROM pending_due) u
), ranked AS (
    SELECT k.*, row_number() OVER (ORDER BY k.can_run_after, k.message_xid, k.message_id) AS n
    FROM keyed k WHERE k.kn IS NULL OR k.kn = 1
), due AS (
    -- The rows that start now.
    SELECT r.tid, r.message_xid, r.message_id, r.message_key, r.concurrency, r.was FROM ranked r WHERE r.n <= $3
), prefetched AS (
    -- Leased beyond the free handler slots, 'queued' until a slot frees:
    -- pending rows that need no key lease, never a takeover (a row whose
    -- holder lapsed starts in a slot of its own, 'running', so that a
    -- message that kills its process spends its retries), nor a row of a
    -- quarantined range not yet tried (retried one by one: one of them
    -- kills its holders).
    SELECT r.tid FROM ranked r
    WHERE r.n > $3 AND r.was = 'pending' AND NOT r.alone AND (r.concurrency = 'parallel' OR r.message_key IS NULL)
), xfollowers AS (
    -- Up to $6 rows queued behind each exclusive head that starts now.
    SELECT k.tid FROM keyed k
    WHERE k.kn > 1 AND k.kn <= 1 + $6
      AND EXISTS (SELECT 1 FROM due d WHERE d.message_key = k.message_key AND d.concurrency = 'exclusive' AND d.was = 'pending')
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
    SELECT x.tid, x.message_xid, x.message_id
    FROM chain c
    CROSS JOIN LATERAL (
        SELECT e.ctid AS tid, e.message_xid, e.message_id
        FROM {s}.{t}_exception e
        WHERE e.group_id = $1 AND e.message_xid = c.message_xid AND e.message_id = c.message_id
          AND ((e.status = 'pending' AND e.can_run_after <= coalesce($2, now()))
            OR (e.status = 'queued' AND e.expires_at < coalesce($2, now())))
        FOR UPDATE SKIP LOCKED) x
    WHERE c.ok
), followers AS (
    SELECT c.tid FROM (
        SELECT l.tid,
               bool_and(l.message_id IS NOT NULL) OVER (PARTITION BY c.message_key ORDER BY c.n) AS kept
        FROM chain c LEFT JOIN locked l ON l.message_xid = c.message_xid AND l.message_id = c.message_id
        WHERE c.ok) c
    WHERE c.kept
), upd_expired AS (
    -- Each set is updated by the row versions locked above (ctid), with
    -- what it sets fixed per set, so that no update joins its rows with
    -- a set: joined on the primary key, the update was planned as a hash
    -- join over the whole table once the claim took a thousand rows; joined
    -- on ctid, on a freshly filled table's stale statistics, as a nested
    -- loop comparing every row with every row (900 rows: 810,000
    -- comparisons, a quarter of a second; decision 0036, "Later").
    -- Due rows whose holder's lease lapsed while they ran: the attempt is
    -- spent.` + leaseSet("d.tid FROM due d WHERE d.was = 'running'", "running", "running", true) + `
), upd_due AS (
    -- The other due rows: pending, or queued by a holder that lapsed.` +
	leaseSet("d.tid FROM due d WHERE d.was <> 'running'", "running", "running", false) + `
), upd_followers AS (` + leaseSet("f.tid FROM followers f UNION ALL SELECT x.tid FROM xfollowers x", "queued", "queued", false) + `
), upd_prefetched AS (` + leaseSet("p.tid FROM prefetched p", "queued", "prefetched", false) + `
), upd AS (
    SELECT message_xid, message_id, token, concurrency, attempts, delays, expired, status FROM upd_expired
    UNION ALL SELECT message_xid, message_id, token, concurrency, attempts, delays, expired, status FROM upd_due
    UNION ALL SELECT message_xid, message_id, token, concurrency, attempts, delays, expired, status FROM upd_followers
    UNION ALL SELECT message_xid, message_id, token, concurrency, attempts, delays, expired, status FROM upd_prefetched
)
SELECT upd.token::text, upd.concurrency, upd.attempts, upd.delays, upd.expired, upd.status = 'queued', upd.status = 'prefetched',
       m.xid, m.id, m.produced_at, m.version, coalesce(m.routing_key, ''), coalesce(m.message_key, ''),
       m.payload::text, coalesce(m.options::text, ''), coalesce(m.headers::text, '')
FROM upd JOIN {s}.{t}_log m ON m.xid = upd.message_xid AND m.id = upd.message_id
ORDER BY m.xid, m.id`)

// leaseSet is one of the exception claim's updates: the rows whose locked
// versions set names (what a SELECT of their ctids reads), leased with
// status, returned with label; spent: their holder lapsed while they ran,
// and the attempt counts. Every argument is a constant of this file.
func leaseSet(set, status, label string, spent bool) string {
	attempt := ""
	if spent {
		attempt = `,
        attempts = x.attempts + 1,
        last_error = 'lease expired: the instance running it died or stopped renewing'`
	}
	return fmt.Sprintf(`
    UPDATE {s}.{t}_exception x
    SET status = '%s', token = gen_random_uuid(), owner = $4::uuid,
        expires_at = coalesce($2, now()) + $5::interval, updated_at = coalesce($2, now())%s
    WHERE x.ctid = ANY (ARRAY(SELECT %s)) AND x.group_id = $1
    RETURNING x.message_xid, x.message_id, x.token, x.concurrency, x.attempts, x.delays, %t AS expired, '%s' AS status`,
		status, attempt, set, spent, label)
}

// Through the claim's own indexes (pending, leased).
// The earliest pending row is the first entry of the pending index.
var exceptionsDueSQL = perStream(`-- store.ExceptionsDue
WITH nxt AS (
    SELECT min(x.can_run_after) AS at FROM {s}.{t}_exception x
    WHERE x.group_id = $1 AND x.status = 'pending'
)
SELECT coalesce((SELECT at <= coalesce($2, now()) FROM nxt), false)
    OR (NOT $3::boolean AND EXISTS (SELECT 1 FROM {s}.{t}_exception x
               WHERE x.group_id = $1 AND x.status IN ('running', 'queued') AND x.expires_at < coalesce($2, now()))),
       (SELECT extract(epoch FROM at - coalesce($2, now()))::float8 FROM nxt)`)

// Settle one exception attempt under its lease token: delete on
// success, else write the next state. The row's key lease is
// released, or, when $14 names the next row of its ordered chain,
// handed to that row, which starts running.
var settleExceptionSQL = perStream(`-- store.SettleException
WITH del AS (
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
), k AS (
    DELETE FROM {s}.{t}_key_lease WHERE group_id = $1 AND token = $4::uuid AND $14 = ''
      AND (SELECT count(*) FROM nxt) >= 0 -- the key row after the exception rows (locks.go)
), kh AS (
    UPDATE {s}.{t}_key_lease SET token = nullif($14, '')::uuid
    WHERE group_id = $1 AND token = $4::uuid AND $14 <> ''
      AND (SELECT count(*) FROM nxt) >= 0
)
SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM upd), (SELECT count(*) FROM nxt)`)

// Settle several exception attempts, each under its lease token, as
// settleExceptionSQL does one (no chain, no key lease). The rows still
// under their tokens are locked first, in position order; the ids whose
// lease was gone come back.
var settleExceptionsSQL = perStream(`-- store.SettleExceptions
WITH s AS (
    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::uuid[], $5::boolean[], $6::text[], $7::int[], $8::int[],
                         $9::text[], $10::bigint[], $11::text[], $12::int[])
        AS s(xid, id, token, del, status, attempts, delays, err, after_us, outcome, attempt)
), xl AS (
    SELECT x.message_xid, x.message_id FROM {s}.{t}_exception x
    JOIN s ON x.message_xid = s.xid AND x.message_id = s.id AND x.token = s.token
    WHERE x.group_id = $1
    ORDER BY x.message_xid, x.message_id
    FOR UPDATE OF x
), del AS (
    DELETE FROM {s}.{t}_exception x USING s, xl
    WHERE x.group_id = $1 AND s.del AND x.message_xid = s.xid AND x.message_id = s.id AND x.token = s.token
      AND xl.message_xid = s.xid AND xl.message_id = s.id
    RETURNING x.message_xid, x.message_id
), upd AS (
    UPDATE {s}.{t}_exception x
    SET status = s.status, attempts = s.attempts, delays = s.delays, last_error = s.err,
        can_run_after = coalesce($13, now()) + s.after_us * interval '1 microsecond',
        token = NULL, owner = NULL, expires_at = NULL, updated_at = coalesce($13, now())
    FROM s, xl
    WHERE x.group_id = $1 AND NOT s.del AND x.message_xid = s.xid AND x.message_id = s.id AND x.token = s.token
      AND xl.message_xid = s.xid AND xl.message_id = s.id
    RETURNING x.message_xid, x.message_id
), done AS (
    SELECT message_xid, message_id FROM del UNION ALL SELECT message_xid, message_id FROM upd
), l AS (
    INSERT INTO {s}.{t}_delivery (group_id, message_xid, message_id, attempt, outcome, error, at)
    SELECT $1, s.xid, s.id, s.attempt, s.outcome, s.err, coalesce($13, now())
    FROM s JOIN done d ON d.message_xid = s.xid AND d.message_id = s.id
    WHERE s.outcome <> ''
)
SELECT s.id FROM s
WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.message_xid = s.xid AND d.message_id = s.id)`)

// Give queued (and not yet settled) rows back to pending without
// spending an attempt: the chain they waited in broke.
var returnRunsSQL = perStream(`-- store.ReturnRuns
WITH xl AS (
    SELECT x.message_xid, x.message_id FROM {s}.{t}_exception x
    JOIN unnest($4::bigint[], $5::bigint[]) AS r(xid, id) ON x.message_xid = r.xid AND x.message_id = r.id
    WHERE x.group_id = $1 AND x.token = ANY ($2::uuid[]) AND x.status IN ('running', 'queued')
    ORDER BY x.message_xid, x.message_id FOR UPDATE OF x
), u AS (
    UPDATE {s}.{t}_exception x
    SET status = 'pending', token = NULL, owner = NULL, expires_at = NULL, updated_at = coalesce($3, now())
    FROM xl
    WHERE x.group_id = $1 AND x.message_xid = xl.message_xid AND x.message_id = xl.message_id
      AND x.token = ANY ($2::uuid[]) AND x.status IN ('running', 'queued')
    RETURNING 1
), kl AS (
    SELECT message_key FROM {s}.{t}_key_lease
    WHERE group_id = $1 AND token = ANY ($2::uuid[]) AND (SELECT count(*) FROM u) >= 0
    ORDER BY message_key FOR UPDATE
), k AS (
    DELETE FROM {s}.{t}_key_lease WHERE group_id = $1 AND message_key IN (SELECT message_key FROM kl)
    RETURNING 1
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM k)`)

var forgetRunsSQL = perStream(`-- store.ForgetUnknownRuns
WITH xl AS (
    SELECT message_xid, message_id FROM {s}.{t}_exception
    WHERE group_id = $1 AND owner = $2::uuid AND status IN ('running', 'queued') AND token <> ALL ($3::uuid[])
    ORDER BY message_xid, message_id FOR UPDATE
), x AS (
    UPDATE {s}.{t}_exception e
    SET status = 'pending', token = NULL, owner = NULL, expires_at = NULL, updated_at = coalesce($4, now())
    FROM xl
    WHERE e.group_id = $1 AND e.message_xid = xl.message_xid AND e.message_id = xl.message_id
      AND e.owner = $2::uuid AND e.status IN ('running', 'queued') AND e.token <> ALL ($3::uuid[])
    RETURNING 1
), kl AS (
    SELECT l.message_key FROM {s}.{t}_key_lease l
    WHERE l.group_id = $1 AND l.owner = $2::uuid AND l.token <> ALL ($3::uuid[]) AND (SELECT count(*) FROM x) >= 0
    ORDER BY l.message_key FOR UPDATE
), k AS (
    DELETE FROM {s}.{t}_key_lease l WHERE l.group_id = $1 AND l.message_key IN (SELECT message_key FROM kl)
    RETURNING 1
)
SELECT (SELECT count(*) FROM x), (SELECT count(*) FROM k)`)
