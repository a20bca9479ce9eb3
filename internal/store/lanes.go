package store

import (
	"context"
	"hash/fnv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Engine lanes (decision 0048).
//
// Every PostgreSQL backend builds its own catalog caches, relation
// descriptors and plans, and a stream's dozen tables are new to a backend
// until it has run that stream's statements: the first claim of a stream on
// a backend cost about six times a warm one, in planning and in execution
// (BENCHMARKS.md at b9c6ba0). A process whose sessions took whatever
// connection the pool gave ran every stream on every backend of its pool,
// and over 1,000 streams nearly every claim was a first one.
//
// So a claimer's statements (claims, commits, key leases, exception claims
// and settlements, progress) and its heartbeat's lease renewals run in a
// lane: one of a few slots per Store, each running one statement at a time
// on a connection it keeps between statements while a consumer session runs
// and the pool has another connection idle or room to open one (or a
// statement of the lane waits). A claimer keeps to one lane, so its stream
// keeps to the lane's backend; the lanes bound the claim path's share of
// the pool; and when the last session ends every lane gives its connection
// back, so nothing outlives the pool (pgxpool's Close waits for acquired
// connections) and no goroutine is needed.

// Generic plans (decision 0052). A lane sets plan_cache_mode to
// force_generic_plan on a connection it keeps, and restores the
// connection's own value before it gives it back. PostgreSQL plans a
// prepared statement's first five executions for their parameters (custom
// plans) before it considers the generic one, and each stream's statements
// are texts of their own: over 1,000 streams a backend runs a stream's claim
// a few times a burst, so nearly every claim, read and commit was planned
// afresh (2.46 s of planning against 2.22 s of execution in a round,
// decision 0052), where one busy stream plans nothing after its fifth
// claim. The claim path's statements are written to plan the same whatever
// their parameters (their bounds reach the scans as InitPlan parameters,
// decision 0042), so the generic plan is the one they settle on anyway; a
// lane only stops paying for the five custom plans on the way. Only the
// range claimers' statements
// and the lease renewals ask for it: the exception claim is one statement
// whose parameters decide which of its parts run, and its generic plan was
// the slower (a lane puts the connection's own value back before an
// exception claimer's statement). The setting never reaches the
// application: a connection whose value could not be restored is closed,
// not given back.

// laneGenericSQL switches a kept connection to generic plans and returns the
// value it had, read first (the CTE is materialized before the projection).
const laneGenericSQL = `-- store.lane: the claim path's statements plan generically (decision 0052)
WITH was AS MATERIALIZED (SELECT pg_catalog.current_setting('plan_cache_mode') AS v)
SELECT was.v, pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', false) FROM was`

// laneRestoreSQL puts a connection's plan_cache_mode back before the lane
// gives it back.
const laneRestoreSQL = `-- store.lane: the connection's own plan_cache_mode, before the pool has it back
SELECT pg_catalog.set_config('plan_cache_mode', $1, false)`

// maxLaneUses is how many statements a lane runs on one connection before it
// gives it back anyway, so that the pool's MaxConnLifetime (checked on
// release) still ends it.
const maxLaneUses = 10_000

// laneSet is a Store's lanes.
type laneSet struct {
	lanes    []*lane
	sessions atomic.Int32     // running consumer sessions (Session)
	next     [2]atomic.Uint32 // InLane's turns: range claimers, exception claimers
}

// lane is one slot: turn is held while a statement runs.
type lane struct {
	pool    *pgxpool.Pool
	running *atomic.Int32 // the store's sessions (Session)
	turn    chan struct{}
	waiting atomic.Int32
	conn    *pgxpool.Conn // kept between statements (done's rule); guarded by turn
	uses    int           // statements on conn; guarded by turn
	// ctx is the turn's statement's context: done's setting and restoring
	// of plan_cache_mode run under it (bounded as the statement was).
	// Guarded by turn.
	ctx context.Context
	// was is conn's own plan_cache_mode, read when the lane first set
	// generic plans on it ("" before). Guarded by turn.
	was string
	// generic: conn runs generic plans now (the lane set them and has not
	// put was back). Guarded by turn.
	generic bool
	// want: the turn's statement asked for generic plans (done switches a
	// kept connection to them). Guarded by turn.
	want bool
}

// SetLanes makes the claimers' statements run in n lanes (n <= 0: none,
// each statement takes whatever connection the pool gives).
func (st *Store) SetLanes(n int) {
	if n <= 0 {
		st.lanes = nil
		return
	}
	ls := &laneSet{lanes: make([]*lane, n)}
	for i := range ls.lanes {
		ls.lanes[i] = &lane{pool: st.pool, running: &ls.sessions, turn: make(chan struct{}, 1)}
	}
	st.lanes = ls
}

// InLane returns the group's handle with its statements in a lane of their
// own kind's turn, when the store has lanes: range claimers take the lanes
// in turn from the first, and exception claimers from the last, so that a
// process's busy range claimers spread evenly whatever their number, and a
// session's two claimers share a lane only when there is one.
func (g Group) InLane(exceptions bool) Group {
	ls := g.st.lanes
	if ls == nil {
		return g
	}
	n := len(ls.lanes)
	if !exceptions {
		g.lane = ls.lanes[int(ls.next[0].Add(1)-1)%n]
		return g
	}
	g.lane = ls.lanes[n-1-int(ls.next[1].Add(1)-1)%n]
	g.custom = true // decision 0052: the exception claim's generic plan is not its custom one
	return g
}

// laneOf is key's lane (a heartbeat's instance id), nil when the store has
// none.
func (st *Store) laneOf(key string) *lane {
	if st.lanes == nil {
		return nil
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return st.lanes.lanes[h.Sum64()%uint64(len(st.lanes.lanes))]
}

// onLane is where a statement of the instance key runs: its lane, or the
// pool.
func (st *Store) onLane(key string) Querier {
	if l := st.laneOf(key); l != nil {
		return laneQ{l: l, generic: true}
	}
	return st.pool
}

// Session marks a consumer session running on the store until the returned
// func is called. Lanes keep their connections only while a session runs:
// when the last one ends, every lane not in a statement gives its
// connection back, so that the pool can close. end's context bounds the
// restores of plan_cache_mode on the way (the session's shutdown plan, so
// that Consume still returns within its budget): with time left the
// connections go back to the pool restored, and the next sessions find the
// backends warm (their caches, prepared statements and mapped shared
// buffers; decision 0052's amendment); with the context done they are closed.
func (st *Store) Session() (end func(ctx context.Context)) {
	ls := st.lanes
	if ls == nil {
		return func(context.Context) {}
	}
	ls.sessions.Add(1)
	return func(ctx context.Context) {
		if ls.sessions.Add(-1) > 0 {
			return
		}
		ls.endSession(ctx)
	}
}

// endSession gives back the connection of every lane not in a statement (a
// lane in one gives it back when the statement is done), restoring it under
// ctx or closing it when that fails.
func (ls *laneSet) endSession(ctx context.Context) {
	for _, l := range ls.lanes {
		select {
		case l.turn <- struct{}{}:
			l.ctx = ctx
			l.giveBack()
			l.ctx = nil
			<-l.turn
		default: // in a statement: its done gives the connection back
		}
	}
}

// db is where the group's engine statements run: its lane, or the pool.
func (g Group) db() Querier {
	var q Querier = g.st.pool
	switch {
	case g.tx != nil:
		q = g.tx
	case g.lane != nil:
		q = laneQ{l: g.lane, generic: !g.custom}
	}
	if g.answered != nil {
		return counted{q: q, n: g.answered}
	}
	return q
}

// laneQ runs statements in a lane, with its generic plans or without them.
type laneQ struct {
	l       *lane
	generic bool
}

// acquire waits for the lane's turn and returns its connection, acquiring
// one from the pool if it holds none; done ends the turn. A statement that
// must not run with generic plans (generic false) finds the connection's
// own plan_cache_mode put back first, or a connection the lane has not
// switched.
func (l *lane) acquire(ctx context.Context, generic bool) (*pgxpool.Conn, func(), error) {
	l.waiting.Add(1)
	select {
	case l.turn <- struct{}{}:
		l.waiting.Add(-1)
	case <-ctx.Done():
		l.waiting.Add(-1)
		return nil, nil, ctx.Err()
	}
	l.ctx = ctx
	if l.conn != nil && l.generic && !generic && !l.restore() {
		l.discard()
	}
	if l.conn == nil {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			l.ctx = nil
			<-l.turn
			return nil, nil, err
		}
		l.conn, l.uses, l.was, l.generic = c, 0, "", false
	}
	l.want = generic
	return l.conn, l.done, nil
}

// done ends a turn. The connection stays with the lane while a session runs
// and either the pool has another idle or room for one, or a statement of
// the lane waits, and only if it is fit to run one; otherwise it goes back
// to the pool (which closes a broken one).
func (l *lane) done() {
	l.uses++
	switch {
	case !l.keep():
		l.giveBack()
	case l.want && !l.generic:
		l.setGeneric()
	}
	l.ctx = nil
	<-l.turn
}

// setGeneric switches the kept connection to generic plans, remembering its
// own value the first time. A connection that fails to switch is discarded:
// whether the server applied the setting is not known.
func (l *lane) setGeneric() {
	var was, set string
	if err := l.conn.QueryRow(l.ctx, laneGenericSQL).Scan(&was, &set); err != nil || was == "" {
		l.discard()
		return
	}
	if l.was == "" {
		l.was = was
	}
	l.generic = true
}

// restore puts the connection's own plan_cache_mode back under the turn's
// context, reporting whether it did; false leaves the connection to be
// discarded. The caller holds the turn.
func (l *lane) restore() bool {
	pc := l.conn.Conn().PgConn()
	if l.ctx == nil || pc.IsClosed() || pc.IsBusy() || pc.TxStatus() != 'I' {
		return false
	}
	var v string
	if l.conn.QueryRow(l.ctx, laneRestoreSQL, l.was).Scan(&v) != nil || v != l.was {
		return false
	}
	l.generic = false
	return true
}

// keep is done's rule, the pool's statistics (a lock and a copy) read last.
// A connection the rest of the process may need goes back only when the
// pool can give it nothing else: none idle and none more to open. Giving it
// back whenever none was idle made lanes change connections under every
// burst of other statements (a thousand sessions starting), and each
// stream's claim path was prepared and planned afresh on the next one: 260
// of 1,000 streams' claims in the round after (decision 0057).
func (l *lane) keep() bool {
	pc := l.conn.Conn().PgConn()
	switch {
	case l.running.Load() == 0, l.uses >= maxLaneUses, pc.IsClosed(), pc.IsBusy(), pc.TxStatus() != 'I':
		return false
	}
	if l.waiting.Load() > 0 {
		return true
	}
	st := l.pool.Stat()
	return st.IdleConns() > 0 || st.TotalConns() < st.MaxConns()
}

// giveBack returns the lane's connection to the pool; the caller holds the
// turn. A connection the lane set generic plans on gets its own value back
// first, under the turn's context (the last session's end's, when that is
// what gives it back); without one, or when the restore fails, it is
// discarded instead: the setting never reaches an application query.
func (l *lane) giveBack() {
	if l.conn == nil {
		return
	}
	if l.generic && !l.restore() {
		l.discard()
		return
	}
	l.conn.Release()
	l.conn = nil
}

// discard takes the lane's connection out of the pool and closes it without
// waiting on the network (its context is done before it starts): the pool
// forgets it at once and opens another when it needs one. The caller holds
// the turn.
func (l *lane) discard() {
	c := l.conn.Hijack()
	l.conn, l.was, l.generic = nil, "", false
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = c.Close(ctx) //nolint:errcheck // closing is the point
}

func (q laneQ) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, done, err := q.l.acquire(ctx, q.generic)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer done()
	return c.Exec(ctx, sql, args...)
}

func (q laneQ) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, done, err := q.l.acquire(ctx, q.generic)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		done()
		return nil, err
	}
	return &laneRows{Rows: rows, done: done}, nil
}

func (q laneQ) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := q.Query(ctx, sql, args...)
	return laneRow{rows: rows, err: err}
}

func (q laneQ) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, done, err := q.l.acquire(ctx, q.generic)
	if err != nil {
		return failedBatch{err: err}
	}
	return &laneBatch{BatchResults: c.SendBatch(ctx, b), done: done}
}

// laneRows ends the lane's turn once its rows are read or closed.
type laneRows struct {
	pgx.Rows
	done func()
}

func (r *laneRows) end() {
	if r.done != nil {
		r.done()
		r.done = nil
	}
}

func (r *laneRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.end()
	return false
}

func (r *laneRows) Close() {
	r.Rows.Close()
	r.end()
}

// laneRow is QueryRow's row, as pgx's: the first row scanned, the rest
// discarded, pgx.ErrNoRows when there is none.
type laneRow struct {
	rows pgx.Rows
	err  error
}

func (r laneRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// laneBatch ends the lane's turn when the batch is closed.
type laneBatch struct {
	pgx.BatchResults
	done func()
}

func (b *laneBatch) Close() error {
	err := b.BatchResults.Close()
	if b.done != nil {
		b.done()
		b.done = nil
	}
	return err
}

// failedBatch is a batch that could not start: every result is err. (The
// embedded interface, nil, only completes the method set.)
type failedBatch struct {
	pgx.BatchResults
	err error
}

func (b failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b failedBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b failedBatch) QueryRow() pgx.Row                { return laneRow{err: b.err} }
func (b failedBatch) Close() error                     { return b.err }
