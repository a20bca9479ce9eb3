package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// NewMessage is a message about to be written.
type NewMessage struct {
	Version        int
	RoutingKey     string
	Key            string
	IdempotencyKey string
	Payload        []byte // JSON
	Options        []byte // JSON or empty
}

// StreamRef names the stream a produce writes to: its id, and its name for
// the guard that refuses to write when the id no longer names that stream
// ("" skips the guard, for callers that read the id in the same database
// transaction).
type StreamRef struct {
	ID   int64
	Name string
}

// Produced reports what happened to one NewMessage.
type Produced struct {
	ID        int64
	Duplicate bool // an earlier message holds the idempotency key; nothing was written
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
	// Matched is false for a message the group's binding set does not
	// route to it: it is settled without being delivered.
	Matched bool
}

// Produce writes msgs atomically, in the order given: unkeyed messages in
// one multi-row insert; with idempotent messages among them, one statement
// per idempotent message and per run of unkeyed ones between them, in one
// batch (one implicit transaction on the pool). On a caller's transaction
// the messages exist exactly when it commits.
//
// The wake-up notification goes out in the caller's transaction when there is
// one. On the pool it is a statement of its own after the insert has
// committed: PostgreSQL serializes the commits of notifying transactions
// under one database-wide lock, held across the commit's WAL flush, so
// notifying inside the insert made concurrent producers flush one at a time
// (decision 0014). A wake-up that fails after the messages committed is
// reported as a *WakeError with the results: the messages are written, and
// consumers see them at their next poll.
//
// Every insert is guarded by the stream's row: when stream.Name is set and
// the stream_config row of stream.ID no longer carries that name (the schema
// was dropped and recreated, and the id may now be another stream's), the
// insert writes nothing and Produce returns ErrStreamChanged. On a caller's
// transaction every statement runs on that transaction, and a finished one
// is refused with pgx.ErrTxClosed before anything is sent.
func (st *Store) Produce(ctx context.Context, q Querier, stream StreamRef, msgs []NewMessage, now Now) ([]Produced, error) {
	streamID := stream.ID
	own := q == nil
	if own {
		q = st.pool
	}
	t := st.streamTables(streamID)
	out := make([]Produced, len(msgs))
	var channel, wake string // the in-transaction notification, on a caller's transaction
	if !own {
		channel, wake = st.NotifyChannel(), WakePayload(streamID, msgs)
	}
	keyed := false
	for i := range msgs {
		keyed = keyed || msgs[i].IdempotencyKey != ""
	}
	if !keyed {
		idx := make([]int, len(msgs))
		for i := range idx {
			idx[i] = i
		}
		err := st.produceUnkeyed(ctx, q, own, t, stream, now, msgs, idx, out, channel, wake)
		if wakeErr := (*WakeError)(nil); err != nil && !errors.As(err, &wakeErr) {
			return nil, err
		}
		return out, err
	}
	// Idempotent messages among them: one statement per idempotent message
	// and one per run of unkeyed messages between them, in item order, so
	// the log holds the batch in the order given.
	var (
		batch pgx.Batch
		runs  [][]int // a run of unkeyed messages, or one idempotent message
	)
	for i := 0; i < len(msgs); {
		if msgs[i].IdempotencyKey != "" {
			m := &msgs[i]
			batch.Queue(t.insertKeyed, now, m.IdempotencyKey, m.Version, m.RoutingKey, m.Key, m.Payload, m.Options, stream.Name)
			runs = append(runs, []int{i})
			i++
			continue
		}
		j := i
		for j < len(msgs) && msgs[j].IdempotencyKey == "" {
			j++
		}
		idx := make([]int, 0, j-i)
		for k := i; k < j; k++ {
			idx = append(idx, k)
		}
		batch.Queue(t.insertBatch, now, versions(msgs, idx), texts(msgs, idx, 2), texts(msgs, idx, 3), texts(msgs, idx, 4), texts(msgs, idx, 5), stream.Name)
		runs = append(runs, idx)
		i = j
	}
	if !own {
		batch.Queue(t.notify, channel, wake)
	}
	br := q.SendBatch(ctx, &batch)
	fail := func(err error) ([]Produced, error) {
		_ = br.Close()
		return nil, err
	}
	for _, idx := range runs {
		if msgs[idx[0]].IdempotencyKey != "" {
			i := idx[0]
			var ok bool
			if err := br.QueryRow().Scan(&out[i].ID, &out[i].Duplicate, &ok); err != nil {
				return fail(fmt.Errorf("produce idempotent message: %w", err))
			}
			if !ok {
				return fail(streamChanged(stream.Name, stream.ID))
			}
			continue
		}
		rows, err := br.Query()
		if err != nil {
			return fail(fmt.Errorf("produce: %w", err))
		}
		if err := scanIDs(rows, idx, out); err != nil {
			if errors.Is(err, errGuard) {
				err = streamChanged(stream.Name, stream.ID)
			}
			return fail(err)
		}
	}
	if !own {
		if _, err := br.Exec(); err != nil {
			return fail(fmt.Errorf("produce: notify: %w", err))
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("produce: %w", err)
	}
	return out, st.wakeAfter(ctx, own, streamID, msgs)
}

// versions and texts are the insert's array parameters for pgx to encode,
// on the paths that do not use wire.go's (idempotent messages, a Querier
// without a connection): texts(k) is routing keys (2), message keys (3),
// payloads (4) or options (5), as produceParams numbers them.
func versions(msgs []NewMessage, idx []int) []int32 {
	out := make([]int32, len(idx))
	for j, i := range idx {
		out[j] = int32(msgs[i].Version)
	}
	return out
}

func texts(msgs []NewMessage, idx []int, k int) [][]byte {
	out := make([][]byte, len(idx))
	for j, i := range idx {
		m := &msgs[i]
		switch k {
		case 2:
			out[j] = []byte(m.RoutingKey)
		case 3:
			out[j] = []byte(m.Key)
		case 4:
			out[j] = m.Payload
		case 5:
			out[j] = m.Options
		}
	}
	return out
}

// WakeError reports that a produce on the pool committed its messages but
// could not send the wake-up notification after it.
type WakeError struct{ Err error }

func (e *WakeError) Error() string { return "produce: wake-up after commit: " + e.Err.Error() }
func (e *WakeError) Unwrap() error { return e.Err }

// wakeAfter sends the wake-up of a produce that committed on its own,
// merged with those of produces committing at the same time (wakes.go).
func (st *Store) wakeAfter(ctx context.Context, own bool, streamID int64, msgs []NewMessage) error {
	if !own {
		return nil
	}
	return st.wakes.wake(ctx, streamID, msgs, st.sendWakes)
}

// sendWakes sends one round of merged wake-ups: one notification per
// stream, in one statement and one transaction.
func (st *Store) sendWakes(ctx context.Context, payloads []string) error {
	_, err := st.pool.Exec(ctx, `-- store.Produce (wake-ups)
SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, st.NotifyChannel(), payloads)
	return err
}

// produceUnkeyed is the common case: one prepared insert whose parameters
// wire.go encodes, then, on the pool, the wake-up. On a caller's transaction
// the statement is prepared through the transaction, which refuses a
// finished one (pgx.ErrTxClosed): only then is its connection used, so a
// produce never writes on a connection the transaction gave back to the
// pool, where another caller's transaction may run by now.
func (st *Store) produceUnkeyed(ctx context.Context, q Querier, own bool, t *tables, stream StreamRef, now Now, msgs []NewMessage, idx []int, out []Produced, channel, wake string) error {
	guarded := func(err error) error {
		if errors.Is(err, errGuard) {
			return streamChanged(stream.Name, stream.ID)
		}
		return err
	}
	if own {
		c, err := st.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		conn := c.Conn()
		err = insertPrepared(ctx, conn, conn.Prepare, t.insertBatchName, t.insertBatch, now, msgs, idx, out, stream.Name)
		c.Release()
		if err != nil {
			return guarded(err)
		}
		return st.wakeAfter(ctx, own, stream.ID, msgs)
	}
	if tx, ok := q.(txConn); ok {
		return guarded(insertPrepared(ctx, tx.Conn(), tx.Prepare, t.insertBatchWakeName, t.insertBatchWake, now, msgs, idx, out, stream.Name, channel, wake))
	}
	return guarded(st.insertPlain(ctx, q, t.insertBatchWake, []any{now, versions(msgs, idx), texts(msgs, idx, 2), texts(msgs, idx, 3), texts(msgs, idx, 4), texts(msgs, idx, 5), stream.Name, channel, wake}, idx, out))
}

// txConn is what a pgx.Tx offers: its connection, and a Prepare that
// refuses a finished transaction.
type txConn interface {
	Conn() *pgx.Conn
	Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)
}

func (st *Store) insertPlain(ctx context.Context, q Querier, insert string, args []any, idx []int, out []Produced) error {
	rows, err := q.Query(ctx, insert, args...)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	return scanIDs(rows, idx, out)
}

// scanIDs reads the ids an insert returned and assigns them (assignIDs).
func scanIDs(rows pgx.Rows, idx []int, out []Produced) error {
	defer rows.Close()
	ids := make([]int64, 0, len(idx))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return fmt.Errorf("produce: scan id: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	return assignIDs(ids, idx, out)
}

// errGuard is an insert that wrote nothing because its stream guard failed.
var errGuard = errors.New("stream guard")

// assignIDs assigns returned ids in ascending order: identity values follow
// the insert's ORDER BY, so the i-th smallest id belongs to the i-th message.
func assignIDs(ids []int64, idx []int, out []Produced) error {
	if len(ids) == 0 && len(idx) > 0 {
		return errGuard // the insert's stream guard held it back: nothing was written
	}
	if len(ids) != len(idx) {
		return fmt.Errorf("produce: %d ids returned for %d messages", len(ids), len(idx))
	}
	slices.Sort(ids)
	for j, i := range idx {
		out[i].ID = ids[j]
	}
	return nil
}

// payloadSlab copies a claim's payloads into a few shared arrays instead of
// one allocation per message (the claim's largest allocation in the
// burn-down profile). The log stores payloads as json, whose wire form in
// either format is the JSON text itself. A NULL payload (a message the
// group's bindings do not route to it) stays nil.
type payloadSlab struct{ buf []byte }

// copy returns a copy of raw; when the slab is full it starts a new one
// sized for the expected more payloads of about this size.
func (s *payloadSlab) copy(raw []byte, more int) []byte {
	if raw == nil {
		return nil
	}
	if cap(s.buf)-len(s.buf) < len(raw) {
		s.buf = make([]byte, 0, max(len(raw)*max(more, 1), 4096))
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
}

// ClaimArgs are the inputs of a claim.
type ClaimArgs struct {
	StreamID int64
	GroupID  int64
	Owner    string // worker_instance id
	Limit    int
	Lease    time.Duration
	Now      Now
}

// ClaimRange hands out the next range of final positions, or ok=false when
// none is available.
func (st *Store) ClaimRange(ctx context.Context, a ClaimArgs) (r Range, ok bool, err error) {
	t := st.streamTables(a.StreamID)
	rows, err := st.pool.Query(ctx, t.claim, a.GroupID, a.Limit, a.Now, a.Owner, a.Lease)
	if err != nil {
		return r, false, fmt.Errorf("claim range: %w", err)
	}
	defer rows.Close()
	r.Messages = make([]Message, 0, a.Limit)
	var slab payloadSlab
	var m Message
	// The range's columns repeat on every row: scanned from the first only
	// (a token string per row was the claim's largest allocation). Payload
	// and options are copied into the slab.
	first := []any{&r.ID, &r.Token, &m.Xid, &m.ID, &m.ProducedAt, &m.Version, &m.RoutingKey, &m.Key, nil, nil, &m.Matched, &r.Bindings}
	rest := []any{nil, nil, &m.Xid, &m.ID, &m.ProducedAt, &m.Version, &m.RoutingKey, &m.Key, nil, nil, &m.Matched, nil}
	for rows.Next() {
		m = Message{}
		dst := rest
		if len(r.Messages) == 0 {
			dst = first
		}
		if err := rows.Scan(dst...); err != nil {
			return r, false, fmt.Errorf("claim range: scan: %w", err)
		}
		raw := rows.RawValues()
		m.Payload = slab.copy(raw[8], 2*(a.Limit-len(r.Messages)))
		if len(raw[9]) > 0 {
			m.Options = slab.copy(raw[9], 2*(a.Limit-len(r.Messages)))
		}
		r.Messages = append(r.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return r, false, fmt.Errorf("claim range: %w", err)
	}
	return r, len(r.Messages) > 0, nil
}

// ReclaimRange takes over one expired lease of the group with a new token.
func (st *Store) ReclaimRange(ctx context.Context, a ClaimArgs) (r Range, ok bool, err error) {
	t := st.streamTables(a.StreamID)
	rows, err := st.pool.Query(ctx, t.reclaim, a.GroupID, a.Now, a.Owner, a.Lease)
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
		if err := rows.Scan(&r.ID, &r.Token, &r.Reclaims, &mxid, &mid, &at, &ver, &rk, &key, nil, &m.Options, &m.Matched, &r.Bindings); err != nil {
			return r, false, fmt.Errorf("reclaim range: scan: %w", err)
		}
		ok = true
		if mid == nil { // a lease over positions that no longer exist
			continue
		}
		m.Payload = slab.copy(rows.RawValues()[9], 1)
		m.Xid, m.ID, m.ProducedAt, m.Version, m.RoutingKey, m.Key = *mxid, *mid, *at, int(*ver), *rk, *key
		r.Messages = append(r.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return r, false, fmt.Errorf("reclaim range: %w", err)
	}
	return r, ok, nil
}

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
	GroupID    int64
	RangeID    int64
	Token      string
	Exceptions []ExceptionWrite
	Deliveries []DeliveryWrite
	// Keys are the key leases to release. A key the instance's later range
	// still uses is left out: the lease passes to that range.
	Keys []KeyLease
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
// one statement.
func (st *Store) CommitRange(ctx context.Context, streamID int64, s RangeCommit, now Now) error {
	t := st.streamTables(streamID)
	n := len(s.Exceptions)
	xids, ids, afters := make([]int64, n), make([]int64, n), make([]int64, n)
	keys, concs, statuses, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	attempts, delays := make([]int32, n), make([]int32, n)
	for i, r := range s.Exceptions {
		xids[i], ids[i], keys[i], concs[i], statuses[i] = r.Xid, r.ID, r.Key, r.Concurrency, r.Status
		attempts[i], delays[i], errs[i], afters[i] = int32(r.Attempts), int32(r.Delays), r.Error, r.After.Microseconds()
	}
	m := len(s.Deliveries)
	lxids, lids, lattempts, loutcomes, lerrs := make([]int64, m), make([]int64, m), make([]int32, m), make([]string, m), make([]string, m)
	for i, d := range s.Deliveries {
		lxids[i], lids[i], lattempts[i], loutcomes[i], lerrs[i] = d.Xid, d.ID, int32(d.Attempt), d.Outcome, d.Error
	}
	knames, ktokens := keyArrays(s.Keys)
	var deleted int
	var exists bool
	if err := st.pool.QueryRow(ctx, t.commit, s.RangeID, s.Token, now, xids, ids, keys, concs, statuses, attempts, delays, errs, afters,
		lxids, lids, lattempts, loutcomes, lerrs, knames, ktokens, s.GroupID).Scan(&deleted, &exists); err != nil {
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

// Release hands a range back for immediate reclaim.
type Release struct {
	GroupID int64
	RangeID int64
	Token   string
	// Lo drops the settled prefix: everything up to and including it (nil
	// keeps the bound).
	Lo *Position
	// Keys are the key leases to release, as in RangeCommit.
	Keys []KeyLease
}

// ReleaseRange hands a range back for immediate reclaim.
func (st *Store) ReleaseRange(ctx context.Context, streamID int64, r Release, now Now) error {
	t := st.streamTables(streamID)
	var xid, id *int64
	if r.Lo != nil {
		xid, id = &r.Lo.Xid, &r.Lo.ID
	}
	knames, ktokens := keyArrays(r.Keys)
	tag, err := st.pool.Exec(ctx, t.release, r.RangeID, r.Token, xid, id, now, knames, ktokens, r.GroupID)
	if err != nil {
		return fmt.Errorf("release range %d: %w", r.RangeID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("release range %d: %w", r.RangeID, ErrLeaseLost)
	}
	return nil
}

// Gate reports, for a claim that found nothing, whether committed rows wait
// behind an open transaction (the gate's xmin).
type Gate struct {
	Xmin    int64
	Pending bool
}

// GateProbe tells an empty claim apart from a stalled one.
func (st *Store) GateProbe(ctx context.Context, streamID, groupID int64) (Gate, error) {
	t := st.streamTables(streamID)
	var g Gate
	if err := st.pool.QueryRow(ctx, t.gateProbe, groupID).Scan(&g.Xmin, &g.Pending); err != nil {
		return g, fmt.Errorf("gate probe: %w", err)
	}
	return g, nil
}

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

// Committed is the group's committed position: every message at or below
// it is settled. Dead letters do not hold it back.
func (st *Store) Committed(ctx context.Context, streamID, groupID int64) (Position, error) {
	var p Position
	err := st.pool.QueryRow(ctx, st.streamTables(streamID).committed, groupID).Scan(&p.Xid, &p.ID)
	if err != nil {
		return p, fmt.Errorf("committed position: %w", err)
	}
	return p, nil
}

// CountLog counts a stream's messages (tests, demo and inspect only).
func (st *Store) CountLog(ctx context.Context, streamID int64) (int64, error) {
	var n int64
	err := st.pool.QueryRow(ctx, st.streamTables(streamID).countLog).Scan(&n)
	return n, err
}

// CountExceptions counts a group's exception rows.
func (st *Store) CountExceptions(ctx context.Context, streamID, groupID int64) (int64, error) {
	var n int64
	err := st.pool.QueryRow(ctx, st.streamTables(streamID).countException, groupID).Scan(&n)
	return n, err
}

// Lease is one outstanding range lease, for inspection and tests.
type Lease struct {
	ID       int64
	Token    string
	Owner    string
	Reclaims int
}

// RangeLeases lists a group's outstanding leases.
func (st *Store) RangeLeases(ctx context.Context, streamID, groupID int64) ([]Lease, error) {
	rows, err := st.pool.Query(ctx, st.streamTables(streamID).rangeLeases, groupID)
	if err != nil {
		return nil, fmt.Errorf("range leases: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
		var l Lease
		err := r.Scan(&l.ID, &l.Token, &l.Owner, &l.Reclaims)
		return l, err
	})
}

// Unaccounted returns those of ids (messages the caller has not seen
// settled) that the group no longer holds anywhere: below the cursor head,
// in no outstanding range, with no exception row. The simulator's
// no-message-lost invariant; it must always be empty.
func (st *Store) Unaccounted(ctx context.Context, streamID, groupID int64, ids []int64) ([]int64, error) {
	rows, err := st.pool.Query(ctx, st.streamTables(streamID).unaccounted, groupID, ids)
	if err != nil {
		return nil, fmt.Errorf("unaccounted: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ForgetUnknownRanges expires the owner's range leases other than known
// (claims whose reply was lost) and releases its key leases other than
// keys, so that nothing the claimer does not know of is kept alive by its
// heartbeat. It returns how many of each it let go.
func (st *Store) ForgetUnknownRanges(ctx context.Context, streamID, groupID int64, owner string, known []int64, keys []KeyLease, now Now) (ranges, leases int64, err error) {
	if known == nil {
		known = []int64{}
	}
	names, tokens := keyArrays(keys)
	err = st.pool.QueryRow(ctx, st.streamTables(streamID).forgetRanges, groupID, owner, known, now, names, tokens).Scan(&ranges, &leases)
	if err != nil {
		return 0, 0, fmt.Errorf("forget unknown ranges: %w", err)
	}
	return ranges, leases, nil
}

// ForgetUnknownRuns returns the owner's running exception rows other than
// those leased under tokens to pending (no attempt spent: they never ran)
// and releases its key leases under other tokens.
func (st *Store) ForgetUnknownRuns(ctx context.Context, streamID, groupID int64, owner string, tokens []string, now Now) (runs, leases int64, err error) {
	if tokens == nil {
		tokens = []string{}
	}
	err = st.pool.QueryRow(ctx, st.streamTables(streamID).forgetRuns, groupID, owner, tokens, now).Scan(&runs, &leases)
	if err != nil {
		return 0, 0, fmt.Errorf("forget unknown runs: %w", err)
	}
	return runs, leases, nil
}
