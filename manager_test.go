package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/manager"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// Under a RetentionTTL, a stream produced to for a simulated day holds a
// bounded number of rows and chunks: whole chunks go once every group has
// committed past them and every row in them is past the TTL, so the log
// tables carry no dead tuples; a group that lags holds every message it has
// not committed, and gets all of them when it catches up.
func TestRetentionKeepsTheLogBounded(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	require.NoError(t, s.Register(ctx, &StreamConfig{RetentionTTL: time.Hour}))
	require.NoError(t, st.e.client.Manager().Declare(ctx, WorkerRetention, WorkerConfig{Batch: 20, MaxBatches: 10, ChunkInterval: 30 * time.Minute}))
	mgr := st.e.client.Manager().actor(30*time.Second, nil, nil)
	ret := retention(t, mgr)
	slow, err := s.Consumer("slow").Register(ctx, nil)
	require.NoError(t, err)
	slowHandled := 0
	slowSt := newStepperFor(t, st.e, slow, st.mock, slow.adapt(func(context.Context, *order) error {
		slowHandled++
		return nil
	}))
	streamID := st.c.group.StreamID

	const step, perStep = 10 * time.Minute, 30
	produced, mostRows, mostChunks := 0, int64(0), 0
	for i := range 6 * 24 { // a simulated day in 10-minute steps
		for j := range perStep { // one transaction each, so xids move as in a real stream
			_, err := s.Produce(ctx, order{OrderID: fmt.Sprintf("s%d-%d", i, j)}, nil)
			require.NoError(t, err)
		}
		produced += perStep
		for st.claimRange() > 0 {
		}
		if i >= 6*12 { // group slow lags for half a day, then catches up and keeps up
			require.GreaterOrEqual(t, st.e.count(s), int64(produced-slowHandled), "step %d: the log holds what group slow has not committed", i)
			for slowSt.claimRange() > 0 {
			}
			require.Equal(t, produced, slowHandled, "step %d: group slow handled every message once it caught up", i)
		}
		st.mock.Add(step)
		require.NoError(t, mgr.Step(ctx))
		n := st.e.count(s)
		cs, err := st.e.client.store.Chunks(ctx, streamID)
		require.NoError(t, err)
		if i < 6*12 {
			require.Equal(t, int64(produced), n, "step %d: group slow has committed nothing, so nothing goes", i)
		}
		if i >= 6*12+3 { // slow caught up (retention drops MaxBatches chunks a round)
			mostRows, mostChunks = max(mostRows, n), max(mostChunks, len(cs))
			require.LessOrEqual(t, n, int64(15*perStep), "step %d: only about a TTL, a chunk's span and a step of messages remain (11 steps' worth, and slack for the rate's noise)", i)
		}
	}
	require.LessOrEqual(t, mostChunks, 7, "chunks stay bounded: TTL / interval + the one filling + the one ahead, and slack")
	require.Len(t, st.calls, produced, "group g handled every message")
	require.GreaterOrEqual(t, ret.ChunksDropped.Load(), int64(10), "retention drops whole chunks")
	require.Less(t, ret.Deleted.Load(), int64(10*perStep), "row-by-row deletes only the rows before the first chunk")
	var dead, chunkDead int64
	require.NoError(t, st.e.pool.QueryRow(ctx, "SELECT pg_stat_force_next_flush()").Scan(new(any)))
	require.NoError(t, st.e.pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_dead_tup) FILTER (WHERE relname NOT LIKE '%\_default'), 0)
FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE $2`, st.e.client.Schema(), fmt.Sprintf("stream\\_%d\\_log%%", streamID)).Scan(&dead, &chunkDead))
	t.Logf("retention over a simulated day: %d produced, at most %d rows and %d chunks held; %d chunks added, %d dropped with %d rows; %d rows deleted one by one; %d dead tuples in the log tables (%d in chunks)",
		produced, mostRows, mostChunks, ret.ChunksAdded.Load(), ret.ChunksDropped.Load(), ret.ChunkRows.Load(), ret.Deleted.Load(), dead, chunkDead)
	require.Zero(t, chunkDead, "dropping chunks leaves no dead tuples")
}

func retention(t *testing.T, a *manager.Actor) *manager.Retention {
	t.Helper()
	for _, w := range a.Workers() {
		if r, ok := w.(*manager.Retention); ok {
			return r
		}
	}
	t.Fatal("no retention worker")
	return nil
}

// Retention never drops a message some group has not committed, nor a dead
// letter's message.
func TestRetentionNeverDropsWhatAGroupHasNotCommitted(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 3}}}, func(o *order, attempt int) error {
		switch {
		case o.OrderID == "m-3":
			return Terminal(errors.New("poison"))
		case o.OrderID == "m-5" && attempt == 1:
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	require.NoError(t, s.Register(ctx, &StreamConfig{RetentionTTL: time.Hour}))
	st.e.produceN(s, "m", 10)
	require.Equal(t, 10, st.claimRange())
	mgr := st.e.client.Manager().actor(30*time.Second, nil, nil)
	survivors := func() []string {
		rows, err := st.e.pool.Query(ctx, fmt.Sprintf("SELECT payload->>'order_id' FROM %s.stream_%d_log ORDER BY id", st.e.client.Schema(), st.c.group.StreamID))
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			out = append(out, id)
		}
		require.NoError(t, rows.Err())
		return out
	}

	st.mock.Add(2 * time.Hour)
	require.NoError(t, mgr.Step(ctx))
	require.Equal(t, []string{"m-3", "m-5", "m-6", "m-7", "m-8", "m-9"}, survivors(),
		"m-5 is unresolved, so the group has committed only up to m-4; m-3 is a dead letter")

	// A group that has consumed nothing holds everything back.
	late, err := s.Consumer("late").Register(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, st.retry(), "m-5 succeeds on retry")
	st.mock.Add(time.Hour)
	require.NoError(t, mgr.Step(ctx))
	require.Equal(t, []string{"m-3", "m-5", "m-6", "m-7", "m-8", "m-9"}, survivors(), "group late has committed nothing")

	lateSt := newStepperFor(t, st.e, late, st.mock, late.adapt(func(context.Context, *order) error { return nil }))
	require.Equal(t, 6, lateSt.claimRange(), "a group created later starts at what the log still holds")
	st.mock.Add(time.Hour)
	require.NoError(t, mgr.Step(ctx))
	require.Equal(t, []string{"m-3"}, survivors(), "both groups committed; the dead letter stays")
}

// A chunk is dropped whole once every group has committed past it, but the
// messages of its dead letters move to the default partition first: the
// dead letter stays listable with its message and can be redriven.
func TestRetentionKeepsDeadLettersOfDroppedChunks(t *testing.T) {
	fail := true
	st, s := newStepper(t, nil, func(o *order, _ int) error {
		if fail && o.OrderID == "m-3" {
			return Terminal(errors.New("poison"))
		}
		return nil
	})
	ctx := context.Background()
	require.NoError(t, s.Register(ctx, &StreamConfig{RetentionTTL: time.Hour}))
	require.NoError(t, st.e.client.Manager().Declare(ctx, WorkerRetention, WorkerConfig{ChunkInterval: time.Minute}))
	mgr := st.e.client.Manager().actor(30*time.Second, nil, nil)
	ret := retention(t, mgr)
	streamID := st.c.group.StreamID
	chunks := func() []store.Chunk {
		cs, err := st.e.client.store.Chunks(ctx, streamID)
		require.NoError(t, err)
		return cs
	}
	// burn moves the cluster's xids past a chunk: each autocommitted call
	// is a transaction with its own xid.
	burn := func(n int) {
		for range n {
			_, err := st.e.pool.Exec(ctx, "SELECT pg_current_xact_id()")
			require.NoError(t, err)
		}
	}
	require.NoError(t, mgr.Step(ctx)) // first sample of the xid rate
	st.mock.Add(time.Minute)
	require.NoError(t, mgr.Step(ctx))
	first := chunks()
	require.Len(t, first, 1, "the second round knows a rate and attaches a chunk ahead")

	var ids []int64
	for i := range 5 {
		p, err := s.Produce(ctx, order{OrderID: fmt.Sprintf("m-%d", i)}, nil)
		require.NoError(t, err)
		ids = append(ids, p.ID)
	}
	require.Equal(t, 5, st.claimRange())
	dead, err := st.c.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, ids[3], dead[0].MessageID)

	burn(int(first[0].Hi - first[0].Lo)) // every xid of the chunk is spent
	st.mock.Add(2 * time.Hour)
	require.NoError(t, mgr.Step(ctx))
	require.NoError(t, mgr.Step(ctx))
	require.GreaterOrEqual(t, ret.ChunksDropped.Load(), int64(1), "the expired, committed chunk is dropped")
	for _, c := range chunks() {
		require.NotEqual(t, first[0].Lo, c.Lo, "the first chunk is gone")
	}
	require.Equal(t, int64(1), st.e.count(s), "only the dead letter's message remains")

	after, err := st.c.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Equal(t, dead, after, "the dead letter is listed as before")
	fail = false
	ok, err := st.c.Redrive(ctx, ids[3])
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, st.retry(), "the redriven message runs with its payload")
	require.Equal(t, "m-3", st.calls[len(st.calls)-1].id)
}

// With target 1 and three managers, exactly one runs the worker; when it
// dies another takes over within one heartbeat TTL; Instances and Suspend
// move the count on the next heartbeat.
func TestManagerRunsEachWorkerOnItsTargetCount(t *testing.T) {
	st, _ := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	const ttl = 3 * time.Second
	ms := []*manager.Actor{st.e.client.Manager().actor(ttl, nil, nil), st.e.client.Manager().actor(ttl, nil, nil), st.e.client.Manager().actor(ttl, nil, nil)}
	holders := func(ms []*manager.Actor) int {
		n := 0
		for _, m := range ms {
			if m.Holds(WorkerRetention) {
				n++
			}
		}
		return n
	}
	step := func(ms []*manager.Actor) {
		for _, m := range ms {
			require.NoError(t, m.Step(ctx))
		}
	}
	step(ms)
	require.Equal(t, 1, holders(ms))
	step(ms)
	require.Equal(t, 1, holders(ms), "renewing does not add holders")

	var dead *manager.Actor
	var rest []*manager.Actor
	for _, m := range ms {
		if m.Holds(WorkerRetention) && dead == nil {
			dead = m // killed: it never steps again
		} else {
			rest = append(rest, m)
		}
	}
	st.mock.Add(ttl / 3)
	step(rest)
	require.Zero(t, holders(rest), "the dead holder's slot is still live")
	st.mock.Add(ttl - ttl/3)
	step(rest)
	require.Equal(t, 1, holders(rest), "taken over one TTL after the holder's last heartbeat")

	require.NoError(t, st.e.client.Manager().Declare(ctx, WorkerRetention, WorkerConfig{Instances: 2}))
	step(rest)
	require.Equal(t, 2, holders(rest))
	step(rest)
	require.Equal(t, 2, holders(rest), "renewing two does not evict either")
	require.NoError(t, st.e.client.Manager().Declare(ctx, WorkerRetention, WorkerConfig{Instances: 1}))
	step(rest)
	require.Equal(t, 1, holders(rest), "a lowered target evicts the newer holder at its next heartbeat")
	step(rest)
	require.Equal(t, 1, holders(rest), "and it does not come back")
	require.NoError(t, st.e.client.Manager().Declare(ctx, WorkerRetention, WorkerConfig{Suspend: true}))
	step(rest)
	require.Zero(t, holders(rest), "suspended")
}

// A worker's interval is the fleet's cadence: a process that takes a slot
// over, after a graceful stop (a rolling deploy) or a crash, starts its
// first round when the fleet's last one is an interval old, not at once.
// Over thousands of streams a prune round is seconds of server CPU, and
// every restart of the holder had run one.
func TestATakenOverWorkerWaitsOutTheFleetsInterval(t *testing.T) {
	st, _ := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	m := st.e.client.Manager()
	require.NoError(t, m.Declare(ctx, WorkerPrune, WorkerConfig{Interval: 10 * time.Minute}))
	const ttl = 30 * time.Second
	// run steps a at every heartbeat (TTL/3) for d of mock time.
	run := func(a *manager.Actor, d time.Duration) {
		t.Helper()
		for end := st.mock.Now().Add(d); st.mock.Now().Before(end); {
			st.mock.Add(ttl / 3)
			require.NoError(t, a.Step(ctx))
		}
	}
	first := m.actor(ttl, nil, nil)
	require.NoError(t, first.Step(ctx))
	require.True(t, first.Holds(WorkerPrune))
	require.Equal(t, 1, first.Rounds(WorkerPrune), "the fleet's first round runs at once")
	run(first, time.Minute)

	// A rolling deploy: the holder gives its slot back, a new process takes it.
	require.NoError(t, first.Release(ctx))
	second := m.actor(ttl, nil, nil)
	require.NoError(t, second.Step(ctx))
	require.True(t, second.Holds(WorkerPrune))
	require.Zero(t, second.Rounds(WorkerPrune), "a round ran a minute ago: the new holder waits")
	run(second, 8*time.Minute+50*time.Second)
	require.Zero(t, second.Rounds(WorkerPrune), "9m50s after the fleet's round")
	run(second, 10*time.Second)
	require.Equal(t, 1, second.Rounds(WorkerPrune), "ten minutes after the fleet's round")
	run(second, 5*time.Minute)
	require.Equal(t, 1, second.Rounds(WorkerPrune))

	// A crash: the holder stops heartbeating; the next process takes its
	// slot over a TTL later and waits for the rest of the interval.
	third := m.actor(ttl, nil, nil)
	require.NoError(t, third.Step(ctx))
	require.False(t, third.Holds(WorkerPrune), "the slot is held")
	run(third, ttl)
	require.True(t, third.Holds(WorkerPrune), "taken over once the holder's row lapsed")
	require.Zero(t, third.Rounds(WorkerPrune), "5m30s after the fleet's round")
	run(third, 4*time.Minute)
	require.Zero(t, third.Rounds(WorkerPrune), "9m30s after it")
	run(third, 30*time.Second)
	require.Equal(t, 1, third.Rounds(WorkerPrune), "ten minutes after it")
}

// A worker's knobs change by redeclaring its worker_config row; the running
// worker follows at its next heartbeat.
func TestWorkerKnobsFollowRedeclaration(t *testing.T) {
	st, _ := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	m := st.e.client.Manager()
	require.NoError(t, m.Declare(ctx, WorkerRetention, WorkerConfig{Interval: time.Hour}))
	a := m.actor(time.Hour, nil, nil) // a TTL longer than the test's steps: the slot never lapses
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 1, a.Rounds(WorkerRetention))
	st.mock.Add(10 * time.Minute)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 1, a.Rounds(WorkerRetention), "an hour between rounds")
	require.NoError(t, m.Declare(ctx, WorkerRetention, WorkerConfig{Interval: 5 * time.Minute}))
	st.mock.Add(10 * time.Second)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 2, a.Rounds(WorkerRetention), "the redeclared 5m interval applies at the next heartbeat")
	require.ErrorIs(t, m.Declare(ctx, "nope", WorkerConfig{}), ErrInvalidConfig)
}

// While an instance waits for days of mock time (a waiting row every 10
// minutes), the prune worker keeps the binding ledger bounded, and the
// listing and the wait's start stay correct; old config snapshots are
// pruned to the declared count.
func TestLedgersStayBoundedWhileAnInstanceWaitsForDays(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, _, c := setup(t, &ClientConfig{Clock: mock}, "g", 0)
	ctx := context.Background()
	inc, _ := e.incumbentTTL(t, c, mock, []string{"a.*"}, time.Hour)
	set, rx := compileBindings([]string{"b.*"})
	waiter := registrar.New(registrar.Config{Store: e.client.store, StreamID: c.group.StreamID, GroupID: c.group.ID,
		GroupName: c.group.Name, Patterns: set, Regexes: rx, DeclaredBy: "waiter",
		Instances: []store.InstanceInsert{{ID: engine.NewID(), WorkerConfigID: c.group.Workers[store.WorkerMessageConsumer], TTL: time.Hour}},
		Interval:  10 * time.Minute, Clock: mock, Logger: e.client.cfg.Logger, DBNow: engine.DBNow(mock)})
	m := e.client.Manager()
	require.NoError(t, m.Declare(ctx, WorkerPrune, WorkerConfig{Interval: time.Hour, Batch: 50, ConfigLogKeep: 3}))
	a := m.actor(2*time.Hour, nil, nil)
	prune := func() *manager.Prune {
		for _, w := range a.Workers() {
			if p, ok := w.(*manager.Prune); ok {
				return p
			}
		}
		t.Fatal("no prune worker")
		return nil
	}()
	start := mock.Now()
	// Processes that ran once and went away: their rows stay listed for
	// InstanceKeep (default 24h) after they expire, then go.
	var gone []string
	for range 3 {
		id := engine.NewID()
		require.NoError(t, e.client.store.InsertInstance(ctx, store.InsertInstanceParams{ID: id, WorkerConfigID: c.group.Workers[store.WorkerMessageConsumer], DeclaredBy: "gone", TTL: time.Minute, Now: engine.DBNow(mock)()}))
		gone = append(gone, id)
	}
	instances := func() (stale, all int) {
		require.NoError(t, e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE id::text = ANY ($1)), count(*) FROM %s.worker_instance`,
			e.client.Schema()), gone).Scan(&stale, &all))
		return stale, all
	}
	most := 0
	for i := range 3 * 24 * 6 { // three days, an attempt every 10 minutes
		if i == 6*12 {
			stale, _ := instances()
			require.Equal(t, 3, stale, "12 hours after they expired, the gone instances are still listed")
		}
		res, err := waiter.Step(ctx)
		require.NoError(t, err)
		require.Equal(t, store.BindingWaiting, res.Outcome)
		require.NoError(t, inc.hb.Step(ctx))
		require.NoError(t, a.Step(ctx))
		_, waits := e.ledger(c)
		most = max(most, waits)
		require.LessOrEqual(t, waits, 7, "at most an hour of attempts between prune rounds")
		mock.Add(10 * time.Minute)
	}
	require.Positive(t, prune.Pruned.Load())
	stale, all := instances()
	require.Zero(t, stale, "a day after they expired, the gone instances are pruned")
	require.Positive(t, all, "live instances stay")
	listing, err := c.Bindings(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, []string{"a.*"}, listing.Installed.Patterns)
	require.Len(t, listing.Waiting, 1)
	require.Equal(t, []string{"b.*"}, listing.Waiting[0].Patterns)
	require.True(t, listing.Waiting[0].DeclaredAt.Equal(start), "the wait began at %s, listed %s", start, listing.Waiting[0].DeclaredAt)

	for i := range 6 { // config snapshots beyond ConfigLogKeep go
		require.NoError(t, m.Declare(ctx, WorkerPrune, WorkerConfig{Interval: time.Hour, Batch: 50, ConfigLogKeep: 3, MaxBatches: 10 + i}))
	}
	mock.Add(time.Hour)
	require.NoError(t, a.Step(ctx))
	var snapshots int
	require.NoError(t, e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.worker_config_log l
JOIN %[1]s.worker_config w ON w.id = l.worker_config_id WHERE w.name = 'prune' AND w.consumer_group_id IS NULL`, e.client.Schema())).Scan(&snapshots))
	require.Equal(t, 3, snapshots)
	t.Logf("prune: at most %d waiting rows held over three days of attempts; %d rows pruned", most, prune.Pruned.Load())
}

// worker_config_log keeps every earlier document by default (seed 001): a
// prune round with default knobs drops no config snapshot, however many a
// group has; ConfigLogKeep bounds them only when set.
func TestPruneKeepsEveryConfigDocumentByDefault(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	s := e.stream("orders")
	const declarations = 120 // past the old default cap of 100
	for i := range declarations {
		_, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: i + 1}}})
		require.NoError(t, err)
	}
	m := e.client.Manager()
	require.NoError(t, m.Declare(ctx, WorkerPrune, WorkerConfig{Interval: time.Hour}))
	a := m.actor(2*time.Hour, nil, nil)
	mock.Add(2 * time.Hour)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, declarations, configSnapshots(t, e, "g"), "every earlier document stays")
	require.NoError(t, m.Declare(ctx, WorkerPrune, WorkerConfig{Interval: time.Hour, ConfigLogKeep: 10}))
	mock.Add(2 * time.Hour)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 10, configSnapshots(t, e, "g"), "the knob still bounds them")
}

// configSnapshots counts the message consumer's worker_config_log rows of
// group.
func configSnapshots(t *testing.T, e *env, group string) (n int) {
	t.Helper()
	require.NoError(t, e.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %[1]s.worker_config_log l
JOIN %[1]s.worker_config w ON w.id = l.worker_config_id
JOIN %[1]s.consumer_group_config g ON g.id = w.consumer_group_id
WHERE g.name = $1 AND w.name = 'message_consumer'`, e.client.Schema()), group).Scan(&n))
	return n
}

// A client runs one manager, however many Consume sessions it has: the
// workers are the fleet's, and a process of 500 sessions ran 500 managers
// asking for the same slots every TTL/3. Each session's manager (consume
// wraps it in oneManagerAProcess on the client's turn) waits for the turn;
// when the session whose manager runs stops, another takes it.
func TestAClientRunsOneManagerForAllItsSessions(t *testing.T) {
	client, err := NewClient(context.Background(), pgtest.Pool(t), &ClientConfig{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	turn := client.managerTurn
	newSession := func() (chan struct{}, oneManagerAProcess) {
		started := make(chan struct{})
		return started, oneManagerAProcess{turn: turn, svc: serveUntilDone{started: started}}
	}
	aStarted, am := newSession()
	actx, stopA := context.WithCancel(context.Background())
	aDone := make(chan error, 1)
	go func() { aDone <- am.Serve(actx) }()
	within(t, aStarted, "a's manager to start")
	require.Len(t, turn, 1, "a's manager holds the turn")

	// While a's runs, another session's manager does not start: one whose
	// session is already stopping returns without having run.
	cStarted, cm := newSession()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, cm.Serve(stopped), context.Canceled)
	select {
	case <-cStarted:
		t.Fatal("a second manager ran while the first held the turn")
	default:
	}

	// One that waits takes the turn when a's session stops.
	bStarted, bm := newSession()
	bctx, stopB := context.WithCancel(context.Background())
	bDone := make(chan error, 1)
	go func() { bDone <- bm.Serve(bctx) }()
	stopA()
	require.ErrorIs(t, within(t, aDone, "a's manager to stop"), context.Canceled)
	within(t, bStarted, "b's manager to take the turn")
	stopB()
	require.ErrorIs(t, within(t, bDone, "b's manager to stop"), context.Canceled)
	require.Empty(t, turn, "the turn is free once every session stopped")
}

// serveUntilDone is a manager stand-in: it reports its start and serves
// until its context ends.
type serveUntilDone struct{ started chan struct{} }

func (s serveUntilDone) Serve(ctx context.Context) error {
	close(s.started)
	<-ctx.Done()
	return ctx.Err()
}

// A slot's provisioning whose end the manager did not see (its context
// ended while the insert committed: the CI's TestGracefulShutdownDrains
// found a scheduler row left after a graceful stop) is neither left behind
// at a stop nor provisioned a second time: the manager takes the row up at
// its next step if it is there, and gives it back at the stop.
func TestAManagerKeepsTrackOfAProvisionWhoseOutcomeItDidNotSee(t *testing.T) {
	ctx := context.Background()
	client, counter := countingClient(t, "", 0)
	var ids []string
	mgr := manager.Standard(manager.Config{Store: client.store, DeclaredBy: "test", TTL: 30 * time.Second,
		NewID: func() string {
			ids = append(ids, engine.NewID())
			return ids[len(ids)-1]
		},
		Clock: clock.New(), DBNow: engine.DBNow(clock.New())})
	rows := func(worker string) (n int) {
		t.Helper()
		require.NoError(t, client.store.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.worker_instance i
JOIN %[1]s.worker_config w ON w.id = i.worker_config_id WHERE w.name = $1`, client.Schema()), worker).Scan(&n))
		return n
	}

	// The first worker's provisioning fails as if its context had ended,
	// and its row is written as if the insert had committed all the same.
	counter.FailNext("store.ProvisionSlot")
	require.Error(t, mgr.Step(ctx))
	require.False(t, mgr.Holds(manager.RetentionWorker))
	_, err := client.store.Pool().Exec(ctx, fmt.Sprintf(`INSERT INTO %s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
SELECT $1::uuid, w.id, 'test', now(), now(), now() + interval '30 seconds' FROM %[1]s.worker_config w WHERE w.name = $2`, client.Schema()),
		ids[0], manager.RetentionWorker)
	require.NoError(t, err)

	require.NoError(t, mgr.Step(ctx))
	require.True(t, mgr.Holds(manager.RetentionWorker))
	require.Equal(t, 1, rows(manager.RetentionWorker), "the row taken up, not a second one provisioned")

	require.NoError(t, mgr.Release(ctx))
	for _, w := range mgr.Workers() {
		require.Zero(t, rows(w.Name()), "%s: every slot given back", w.Name())
	}

	// At a stop before any later step, the row is given back too.
	mgr2 := manager.Standard(manager.Config{Store: client.store, DeclaredBy: "test", TTL: 30 * time.Second,
		NewID: func() string {
			ids = append(ids, engine.NewID())
			return ids[len(ids)-1]
		},
		Clock: clock.New(), DBNow: engine.DBNow(clock.New())})
	counter.FailNext("store.ProvisionSlot")
	require.Error(t, mgr2.Step(ctx))
	_, err = client.store.Pool().Exec(ctx, fmt.Sprintf(`INSERT INTO %s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
SELECT $1::uuid, w.id, 'test', now(), now(), now() + interval '30 seconds' FROM %[1]s.worker_config w WHERE w.name = $2`, client.Schema()),
		ids[len(ids)-3], manager.RetentionWorker)
	require.NoError(t, err)
	require.NoError(t, mgr2.Release(ctx))
	for _, w := range mgr2.Workers() {
		require.Zero(t, rows(w.Name()), "%s: every slot given back, the unseen one too", w.Name())
	}
}
