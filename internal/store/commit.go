package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrLeaseLost reports a commit or release whose lease was taken over by a
// reclaimer; nothing of the range was written.
var ErrLeaseLost = errors.New("range lease lost")

// ErrRangeGone reports a commit that found no range row at all: the range
// is settled already, by a reclaimer that finished it, or by an earlier
// attempt of the same commit whose reply was lost. It wraps ErrLeaseLost
// (nothing was written by this attempt).
var ErrRangeGone = fmt.Errorf("%w: the range is settled already", ErrLeaseLost)

// ExceptionWrite is one exception row written when a range is settled: a
// message that failed, was delayed, was deferred behind its key, or was
// quarantined.
type ExceptionWrite struct {
	Position
	Key         string
	Concurrency string
	Status      string
	Attempts    int
	Delays      int
	Error       string
	After       time.Duration // can_run_after, from the database's now
}

// DeliveryWrite is one delivery-log row.
type DeliveryWrite struct {
	Position
	Attempt int
	Outcome string
	Error   string
}

// KeyLease names one key lease row by the token that acquired it.
type KeyLease struct {
	Key   string
	Token string
}

// RangeCommit is what a range leaves behind when it is committed.
type RangeCommit struct {
	RangeID    int64
	Token      string
	Exceptions []ExceptionWrite
	Deliveries []DeliveryWrite
	// Keys are the key leases to release. A key the instance's later range
	// still uses is left out: the lease passes to that range.
	Keys []KeyLease
	Now  Now
}

func keyArrays(keys []KeyLease) (names, tokens []string) {
	names, tokens = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		names[i], tokens[i] = k.Key, k.Token
	}
	return names, tokens
}

// CommitRange settles a range: deletes the lease by its token, releases the
// given key leases and writes the exception rows and delivery-log rows, in
// one statement. ErrLeaseLost: another instance holds the range now;
// ErrRangeGone: the range is settled already.
func (g Group) CommitRange(ctx context.Context, s RangeCommit) error {
	var deleted int
	var exists bool
	var row pgx.Row
	if len(s.Exceptions) == 0 && len(s.Deliveries) == 0 && len(s.Keys) == 0 {
		row = g.db().QueryRow(ctx, g.sql(commitPlainSQL), s.RangeID, s.Token)
	} else {
		xs := exceptionColumns(s.Exceptions)
		ds := deliveryColumns(s.Deliveries)
		knames, ktokens := keyArrays(s.Keys)
		row = g.db().QueryRow(ctx, g.sql(commitSQL), s.RangeID, s.Token, s.Now,
			xs.xids, xs.ids, xs.keys, xs.concs, xs.statuses, xs.attempts, xs.delays, xs.errs, xs.afters,
			ds.xids, ds.ids, ds.attempts, ds.outcomes, ds.errs, knames, ktokens, g.GroupID)
	}
	if err := row.Scan(&deleted, &exists); err != nil {
		return fmt.Errorf("commit range %d: %w", s.RangeID, err)
	}
	switch {
	case deleted > 0:
		return nil
	case exists:
		return fmt.Errorf("commit range %d: %w", s.RangeID, ErrLeaseLost)
	default:
		return fmt.Errorf("commit range %d: %w", s.RangeID, ErrRangeGone)
	}
}

// exceptionCols are exception writes as the commit's column arrays.
type exceptionCols struct {
	xids, ids, afters           []int64
	keys, concs, statuses, errs []string
	attempts, delays            []int32
}

func exceptionColumns(ws []ExceptionWrite) exceptionCols {
	n := len(ws)
	c := exceptionCols{xids: make([]int64, n), ids: make([]int64, n), afters: make([]int64, n),
		keys: make([]string, n), concs: make([]string, n), statuses: make([]string, n), errs: make([]string, n),
		attempts: make([]int32, n), delays: make([]int32, n)}
	for i, r := range ws {
		c.xids[i], c.ids[i], c.keys[i], c.concs[i], c.statuses[i] = r.Xid, r.ID, r.Key, r.Concurrency, r.Status
		c.attempts[i], c.delays[i], c.errs[i], c.afters[i] = int32(r.Attempts), int32(r.Delays), r.Error, r.After.Microseconds()
	}
	return c
}

// deliveryCols are delivery-log writes as the commit's column arrays.
type deliveryCols struct {
	xids, ids      []int64
	attempts       []int32
	outcomes, errs []string
}

func deliveryColumns(ds []DeliveryWrite) deliveryCols {
	m := len(ds)
	c := deliveryCols{xids: make([]int64, m), ids: make([]int64, m), attempts: make([]int32, m), outcomes: make([]string, m), errs: make([]string, m)}
	for i, d := range ds {
		c.xids[i], c.ids[i], c.attempts[i], c.outcomes[i], c.errs[i] = d.Xid, d.ID, int32(d.Attempt), d.Outcome, d.Error
	}
	return c
}

// Release hands a range back for immediate reclaim.
type Release struct {
	RangeID int64
	Token   string
	// Keys are the key leases to release, as in RangeCommit.
	Keys []KeyLease
	Now  Now
}

// ReleaseRange hands a range back for immediate reclaim.
func (g Group) ReleaseRange(ctx context.Context, r Release) error {
	knames, ktokens := keyArrays(r.Keys)
	tag, err := g.db().Exec(ctx, g.sql(releaseSQL), r.RangeID, r.Token, r.Now, knames, ktokens, g.GroupID)
	if err != nil {
		return fmt.Errorf("release range %d: %w", r.RangeID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("release range %d: %w", r.RangeID, ErrLeaseLost)
	}
	return nil
}

// ReleaseKeys deletes the key leases named, each by the token that acquired
// it: the range claimer's keys it kept after their last range settled
// (decision 0045), let go once no range of the instance brought them again.
// It returns how many rows it deleted.
func (g Group) ReleaseKeys(ctx context.Context, keys []KeyLease) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	knames, ktokens := keyArrays(keys)
	tag, err := g.db().Exec(ctx, g.sql(releaseKeysSQL), g.GroupID, knames, ktokens)
	if err != nil {
		return 0, fmt.Errorf("release %d key leases: %w", len(keys), err)
	}
	return tag.RowsAffected(), nil
}

// ForgetRanges names what a claimer knows it holds: every other range lease
// and key lease of Owner is let go.
type ForgetRanges struct {
	Owner  string
	Ranges []int64
	Keys   []KeyLease
	Now    Now
}

// ForgetUnknownRanges expires the owner's range leases it does not know
// (claims whose reply was lost) and releases its key leases it does not
// know, so that nothing the claimer does not know of is kept alive by its
// heartbeat. It returns how many of each it let go.
//
// It looks first (forgetProbeSQL, the same conditions, no lock) and lets go
// only when the look finds something: nearly every reconcile tick finds
// nothing, and the statement that lets go, six CTEs with row locks and
// writes, planned for 1–2 ms a call where 1,000 streams each planned theirs
// afresh (BENCHMARKS.md at 0799be0). Something the look misses was written
// after it: the next tick lets it go, as it would had this tick run a moment
// earlier.
func (g Group) ForgetUnknownRanges(ctx context.Context, f ForgetRanges) (ranges, leases int64, err error) {
	known := f.Ranges
	if known == nil {
		known = []int64{}
	}
	names, tokens := keyArrays(f.Keys)
	var found bool
	if err := g.db().QueryRow(ctx, g.sql(forgetProbeSQL), oneShot, g.GroupID, f.Owner, known, f.Now, names, tokens).Scan(&found); err != nil {
		return 0, 0, fmt.Errorf("forget unknown ranges: look: %w", err)
	}
	if !found {
		return 0, 0, nil
	}
	err = g.db().QueryRow(ctx, g.sql(forgetRangesSQL), oneShot, g.GroupID, f.Owner, known, f.Now, names, tokens, keyGateFree).Scan(&ranges, &leases)
	if err != nil {
		return 0, 0, fmt.Errorf("forget unknown ranges: %w", err)
	}
	return ranges, leases, nil
}

// The settling statements.

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
var commitSQL = perStream(`-- store.CommitRange
WITH d AS (
    DELETE FROM {s}.{t}_range WHERE id = $1 AND token = $2::uuid RETURNING group_id
), kl AS (` + keyLocks("$20", "$18", "$19") + `
), k AS (
    DELETE FROM {s}.{t}_key_lease l WHERE l.group_id = $20 AND l.message_key IN (SELECT message_key FROM kl)
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
SELECT (SELECT count(*) FROM d), EXISTS (SELECT 1 FROM {s}.{t}_range WHERE id = $1)`)

// A range whose every message succeeded, with no key lease and no delivery
// history to write (nearly every commit), is committed by its lease row
// alone. commitSQL touches four tables: planned afresh, as a stream's
// statements mostly are when there are 1,000 streams, it took 7 ms on a
// connection new to the stream and 0.9 ms after, this one 1.3 ms and 0.2 ms
// (decision 0042).
var commitPlainSQL = perStream(`-- store.CommitRange
WITH d AS (
    DELETE FROM {s}.{t}_range WHERE id = $1 AND token = $2::uuid RETURNING 1
)
SELECT (SELECT count(*) FROM d), EXISTS (SELECT 1 FROM {s}.{t}_range WHERE id = $1)`)

// Hand a range back at once: its settled prefix is dropped by moving
// lo, and the lease expires now so any instance reclaims the rest.
var releaseSQL = perStream(`-- store.ReleaseRange
WITH kl AS (` + keyLocks("$6", "$4", "$5") + `
), k AS (
    DELETE FROM {s}.{t}_key_lease l WHERE l.group_id = $6 AND l.message_key IN (SELECT message_key FROM kl)
)
UPDATE {s}.{t}_range SET expires_at = coalesce($3, now()) - interval '1 millisecond'
WHERE id = $1 AND token = $2::uuid`)

// Key leases a claimer kept past their last range, let go by token.
var releaseKeysSQL = perStream(`-- store.ReleaseKeys
WITH kl AS (` + keyLocks("$1", "$2", "$3") + `
)
DELETE FROM {s}.{t}_key_lease l WHERE l.group_id = $1 AND l.message_key IN (SELECT message_key FROM kl)`)

// A claim whose reply was lost (the connection died after the
// commit) leaves a lease the claimer never learned of, which its
// heartbeat would renew forever. Expire those, and release key
// leases the claimer does not hold.
// forgetProbeSQL is forgetRangesSQL's look: whether it would let anything
// go (its rl and kl conditions).
var forgetProbeSQL = perStream(`-- store.ForgetUnknownRanges: anything to let go
SELECT EXISTS (
    SELECT 1 FROM {s}.{t}_range
    WHERE group_id = $1 AND owner = $2::uuid AND id <> ALL ($3::bigint[]) AND expires_at >= coalesce($4, now())
) OR EXISTS (
    SELECT 1 FROM {s}.{t}_key_lease l
    WHERE l.group_id = $1 AND l.owner = $2::uuid
      AND NOT EXISTS (SELECT 1 FROM unnest($5::text[], $6::uuid[]) AS h(key, token)
                      WHERE h.key = l.message_key AND h.token = l.token)
)`)

var forgetRangesSQL = perStream(`-- store.ForgetUnknownRanges
WITH rl AS (
    SELECT id FROM {s}.{t}_range
    WHERE group_id = $1 AND owner = $2::uuid AND id <> ALL ($3::bigint[]) AND expires_at >= coalesce($4, now())
    ORDER BY id FOR UPDATE
), r AS (
    UPDATE {s}.{t}_range SET expires_at = coalesce($4, now()) - interval '1 millisecond'
    WHERE id IN (SELECT id FROM rl) AND owner = $2::uuid
    RETURNING id
), kl AS (
    SELECT l.message_key FROM {s}.{t}_key_lease l
    WHERE l.group_id = $1 AND l.owner = $2::uuid AND (SELECT count(*) FROM r) >= 0
      AND NOT EXISTS (SELECT 1 FROM unnest($5::text[], $6::uuid[]) AS h(key, token)
                      WHERE h.key = l.message_key AND h.token = l.token)
    ORDER BY l.message_key FOR UPDATE
), k AS (
    DELETE FROM {s}.{t}_key_lease l
    WHERE l.group_id = $1 AND l.message_key <> '' AND l.message_key IN (SELECT message_key FROM kl)
    RETURNING 1
), gf AS ( -- a key gate is freed, not deleted (KeyGateKey)
    UPDATE {s}.{t}_key_lease l SET token = $7::uuid, owner = $7::uuid, expires_at = '-infinity'
    WHERE l.group_id = $1 AND l.message_key = '' AND l.message_key IN (SELECT message_key FROM kl)
    RETURNING 1
)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM k) + (SELECT count(*) FROM gf)`)
