package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/manager"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/schedule"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// instances is a worker's declared Instances (0 suspends it).
func instances(n int) *int { return &n }

// newIncumbent stands for a live instance of another process holding the
// group's binding set patterns: its binding attempt (which inserts its
// instance row) is made, and its heartbeat, stepped by the test, returned.
func newIncumbent(t *testing.T, e *actortest.Env, g *actortest.Group, patterns []string, ttl time.Duration) *heartbeat.Actor {
	t.Helper()
	set, rx := actortest.Bindings(patterns...)
	id := store.NewID()
	wid := g.Worker(store.WorkerMessageConsumer)
	reg := registrar.New(registrar.Config{Store: e.Store, StreamID: g.StreamID(), GroupID: g.ID(),
		GroupName: g.Row.Name, Patterns: set, Regexes: rx, DeclaredBy: "incumbent:" + id[:8],
		Instances: []store.InstanceInsert{{ID: id, WorkerConfigID: wid, TTL: ttl}},
		Interval:  10 * time.Second, Clock: e.Clock, Logger: e.Logger, DBNow: e.DBNow()})
	_, err := reg.Step(context.Background())
	require.NoError(t, err)
	return heartbeat.New(heartbeat.Config{Store: e.Store, StreamID: g.StreamID(), WorkerConfigID: wid,
		InstanceID: id, DeclaredBy: "incumbent", TTL: ttl, Clock: e.Clock, Logger: e.Logger,
		DBNow: e.DBNow(), Graceful: func() bool { return true }, Registered: true})
}

// waitingRows counts the waiting rows of g's binding-declaration ledger.
func waitingRows(t *testing.T, e *actortest.Env, g *actortest.Group) (n int) {
	t.Helper()
	require.NoError(t, e.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+g.Stream.Table("binding_declaration")+" WHERE group_id = $1 AND status <> 'installed'", g.ID()).Scan(&n))
	return n
}

// registerSchedule registers a schedule on s as Scheduler.Register does
// (zone UTC), its first due time the next after the clock's now.
func registerSchedule(t *testing.T, e *actortest.Env, s *actortest.Stream, name, expression string, payload any, missed string) {
	t.Helper()
	spec, err := schedule.Parse(expression, "UTC")
	require.NoError(t, err)
	doc, err := json.Marshal(payload)
	require.NoError(t, err)
	require.NoError(t, e.Store.RegisterSchedule(context.Background(), store.Schedule{Name: name, StreamID: s.ID(), Expression: expression,
		Zone: "UTC", Missed: missed, Version: 1, Payload: doc, NextDue: spec.Next(e.Clock.Now())}, e.Now()))
}

// With target 1 and three managers, exactly one runs the worker; when it
// dies another takes over within one heartbeat TTL; Instances and Suspend
// move the count on the next heartbeat.
func TestManagerRunsEachWorkerOnItsTargetCount(t *testing.T) {
	e := actortest.New(t, nil)
	ctx := context.Background()
	const ttl = 3 * time.Second
	ms := []*manager.Actor{newManager(e, ttl), newManager(e, ttl), newManager(e, ttl)}
	holders := func(ms []*manager.Actor) int {
		n := 0
		for _, m := range ms {
			if m.Holds(manager.RetentionWorker) {
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
		if m.Holds(manager.RetentionWorker) && dead == nil {
			dead = m // killed: it never steps again
		} else {
			rest = append(rest, m)
		}
	}
	e.Mock.Add(ttl / 3)
	step(rest)
	require.Zero(t, holders(rest), "the dead holder's slot is still live")
	e.Mock.Add(ttl - ttl/3)
	step(rest)
	require.Equal(t, 1, holders(rest), "taken over one TTL after the holder's last heartbeat")

	declareWorker(t, e, manager.RetentionWorker, settings.Worker{Instances: instances(2)})
	step(rest)
	require.Equal(t, 2, holders(rest))
	step(rest)
	require.Equal(t, 2, holders(rest), "renewing two does not evict either")
	declareWorker(t, e, manager.RetentionWorker, settings.Worker{Instances: instances(1)})
	step(rest)
	require.Equal(t, 1, holders(rest), "a lowered target evicts the newer holder at its next heartbeat")
	step(rest)
	require.Equal(t, 1, holders(rest), "and it does not come back")
	declareWorker(t, e, manager.RetentionWorker, settings.Worker{Instances: instances(0)}) // suspended
	step(rest)
	require.Zero(t, holders(rest), "suspended")
}

// A worker's interval is the fleet's cadence: a process that takes a slot
// over, after a graceful stop (a rolling deploy) or a crash, starts its
// first round when the fleet's last one is an interval old, not at once.
// Over thousands of streams a prune round is seconds of server CPU, and
// every restart of the holder had run one.
func TestATakenOverWorkerWaitsOutTheFleetsInterval(t *testing.T) {
	e := actortest.New(t, nil)
	ctx := context.Background()
	declareWorker(t, e, manager.PruneWorker, settings.Worker{Interval: settings.Of(10 * time.Minute)})
	const ttl = 30 * time.Second
	// run steps a at every heartbeat (TTL/3) for d of mock time.
	run := func(a *manager.Actor, d time.Duration) {
		t.Helper()
		for end := e.Mock.Now().Add(d); e.Mock.Now().Before(end); {
			e.Mock.Add(ttl / 3)
			require.NoError(t, a.Step(ctx))
		}
	}
	first := newManager(e, ttl)
	require.NoError(t, first.Step(ctx))
	require.True(t, first.Holds(manager.PruneWorker))
	require.Equal(t, 1, first.Rounds(manager.PruneWorker), "the fleet's first round runs at once")
	run(first, time.Minute)

	// A rolling deploy: the holder gives its slot back, a new process takes it.
	require.NoError(t, first.Release(ctx))
	second := newManager(e, ttl)
	require.NoError(t, second.Step(ctx))
	require.True(t, second.Holds(manager.PruneWorker))
	require.Zero(t, second.Rounds(manager.PruneWorker), "a round ran a minute ago: the new holder waits")
	run(second, 8*time.Minute+50*time.Second)
	require.Zero(t, second.Rounds(manager.PruneWorker), "9m50s after the fleet's round")
	run(second, 10*time.Second)
	require.Equal(t, 1, second.Rounds(manager.PruneWorker), "ten minutes after the fleet's round")
	run(second, 5*time.Minute)
	require.Equal(t, 1, second.Rounds(manager.PruneWorker))

	// A crash: the holder stops heartbeating; the next process takes its
	// slot over a TTL later and waits for the rest of the interval.
	third := newManager(e, ttl)
	require.NoError(t, third.Step(ctx))
	require.False(t, third.Holds(manager.PruneWorker), "the slot is held")
	run(third, ttl)
	require.True(t, third.Holds(manager.PruneWorker), "taken over once the holder's row lapsed")
	require.Zero(t, third.Rounds(manager.PruneWorker), "5m30s after the fleet's round")
	run(third, 4*time.Minute)
	require.Zero(t, third.Rounds(manager.PruneWorker), "9m30s after it")
	run(third, 30*time.Second)
	require.Equal(t, 1, third.Rounds(manager.PruneWorker), "ten minutes after it")
}

// A worker's knobs change by redeclaring its worker_config row; the running
// worker follows at its next heartbeat.
func TestWorkerKnobsFollowRedeclaration(t *testing.T) {
	e := actortest.New(t, nil)
	ctx := context.Background()
	declareWorker(t, e, manager.RetentionWorker, settings.Worker{Interval: settings.Of(time.Hour)})
	a := newManager(e, time.Hour) // a TTL longer than the test's steps: the slot never lapses
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 1, a.Rounds(manager.RetentionWorker))
	e.Mock.Add(10 * time.Minute)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 1, a.Rounds(manager.RetentionWorker), "an hour between rounds")
	declareWorker(t, e, manager.RetentionWorker, settings.Worker{Interval: settings.Of(5 * time.Minute)})
	e.Mock.Add(10 * time.Second)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 2, a.Rounds(manager.RetentionWorker), "the redeclared 5m interval applies at the next heartbeat")
}

// While an instance waits for days of mock time (a waiting row every 10
// minutes), the prune worker keeps the binding ledger bounded, and the
// listing and the wait's start stay correct; old config snapshots are
// pruned to the declared count.
func TestLedgersStayBoundedWhileAnInstanceWaitsForDays(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := actortest.New(t, &actortest.Options{Clock: mock})
	c := e.Stream("orders", settings.Stream{}).Group("g", groupconfig.Declared{})
	ctx := context.Background()
	inc := newIncumbent(t, e, c, []string{"a.*"}, time.Hour) // its heartbeat
	set, rx := actortest.Bindings("b.*")
	waiter := registrar.New(registrar.Config{Store: e.Store, StreamID: c.StreamID(), GroupID: c.ID(),
		GroupName: c.Row.Name, Patterns: set, Regexes: rx, DeclaredBy: "waiter",
		Instances: []store.InstanceInsert{{ID: store.NewID(), WorkerConfigID: c.Worker(store.WorkerMessageConsumer), TTL: time.Hour}},
		Interval:  10 * time.Minute, Clock: mock, Logger: e.Logger, DBNow: e.DBNow()})
	declareWorker(t, e, manager.PruneWorker, settings.Worker{Interval: settings.Of(time.Hour), Batch: 50, ConfigLogKeep: 3})
	a := newManager(e, 2*time.Hour)
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
		id := store.NewID()
		require.NoError(t, e.Store.InsertInstance(ctx, store.InsertInstanceParams{ID: id, WorkerConfigID: c.Worker(store.WorkerMessageConsumer), DeclaredBy: "gone", TTL: time.Minute, Now: e.Now()}))
		gone = append(gone, id)
	}
	instances := func() (stale, all int) {
		require.NoError(t, e.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE id::text = ANY ($1)), count(*) FROM %s.worker_instance`,
			e.Schema()), gone).Scan(&stale, &all))
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
		require.NoError(t, inc.Step(ctx))
		require.NoError(t, a.Step(ctx))
		waits := waitingRows(t, e, c)
		most = max(most, waits)
		require.LessOrEqual(t, waits, 7, "at most an hour of attempts between prune rounds")
		mock.Add(10 * time.Minute)
	}
	require.Positive(t, prune.Pruned.Load())
	stale, all := instances()
	require.Zero(t, stale, "a day after they expired, the gone instances are pruned")
	require.Positive(t, all, "live instances stay")
	installed, waiting, err := c.DB.BindingLedger(ctx) // what the public listing shows
	require.NoError(t, err)
	require.Equal(t, []string{"a.*"}, installed.Patterns)
	require.Len(t, waiting, 1)
	require.Equal(t, []string{"b.*"}, waiting[0].Patterns)
	require.True(t, waiting[0].DeclaredAt.Equal(start), "the wait began at %s, listed %s", start, waiting[0].DeclaredAt)

	for i := range 6 { // config snapshots beyond ConfigLogKeep go
		declareWorker(t, e, manager.PruneWorker, settings.Worker{Interval: settings.Of(time.Hour), Batch: 50, ConfigLogKeep: 3, MaxBatches: 10 + i})
	}
	mock.Add(time.Hour)
	require.NoError(t, a.Step(ctx))
	var snapshots int
	require.NoError(t, e.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.worker_config_log l
JOIN %[1]s.worker_config w ON w.id = l.worker_config_id WHERE w.name = 'prune' AND w.consumer_group_id IS NULL`, e.Schema())).Scan(&snapshots))
	require.Equal(t, 3, snapshots)
	t.Logf("prune: at most %d waiting rows held over three days of attempts; %d rows pruned", most, prune.Pruned.Load())
}

// worker_config_log keeps every earlier document by default (seed 001): a
// prune round with default knobs drops no config snapshot, however many a
// group has; ConfigLogKeep bounds them only when set.
func TestPruneKeepsEveryConfigDocumentByDefault(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := actortest.New(t, &actortest.Options{Clock: mock})
	ctx := context.Background()
	s := e.Stream("orders", settings.Stream{})
	const declarations = 120 // past the old default cap of 100
	g := s.Group("g", groupconfig.Declared{Message: policy.Options{MaxRetries: 1}})
	for i := 1; i < declarations; i++ {
		g.Declare(groupconfig.Declared{Message: policy.Options{MaxRetries: i + 1}})
	}
	declareWorker(t, e, manager.PruneWorker, settings.Worker{Interval: settings.Of(time.Hour)})
	a := newManager(e, 2*time.Hour)
	mock.Add(2 * time.Hour)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, declarations, configSnapshots(t, e, "g"), "every earlier document stays")
	declareWorker(t, e, manager.PruneWorker, settings.Worker{Interval: settings.Of(time.Hour), ConfigLogKeep: 10})
	mock.Add(2 * time.Hour)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 10, configSnapshots(t, e, "g"), "the knob still bounds them")
}

// configSnapshots counts the message consumer's worker_config_log rows of
// group.
func configSnapshots(t *testing.T, e *actortest.Env, group string) (n int) {
	t.Helper()
	require.NoError(t, e.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %[1]s.worker_config_log l
JOIN %[1]s.worker_config w ON w.id = l.worker_config_id
JOIN %[1]s.consumer_group_config g ON g.id = w.consumer_group_id
WHERE g.name = $1 AND w.name = 'message_consumer'`, e.Schema()), group).Scan(&n))
	return n
}

// A slot's provisioning whose end the manager did not see (its context
// ended while the insert committed: the CI's TestGracefulShutdownDrains
// found a scheduler row left after a graceful stop) is neither left behind
// at a stop nor provisioned a second time: the manager takes the row up at
// its next step if it is there, and gives it back at the stop.
func TestAManagerKeepsTrackOfAProvisionWhoseOutcomeItDidNotSee(t *testing.T) {
	ctx := context.Background()
	pool, counter := actortest.CountingPool(t, "", 0)
	e := actortest.New(t, &actortest.Options{Clock: clocks.Real(), Pool: pool})
	var ids []string
	mgr := manager.Standard(manager.Config{Store: e.Store, DeclaredBy: "test", TTL: 30 * time.Second,
		NewID: func() string {
			ids = append(ids, store.NewID())
			return ids[len(ids)-1]
		},
		Clock: clocks.Real(), DBNow: e.DBNow()})
	rows := func(worker string) (n int) {
		t.Helper()
		require.NoError(t, e.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.worker_instance i
JOIN %[1]s.worker_config w ON w.id = i.worker_config_id WHERE w.name = $1`, e.Schema()), worker).Scan(&n))
		return n
	}

	// The first worker's provisioning fails as if its context had ended,
	// and its row is written as if the insert had committed all the same.
	counter.FailNext("store.ProvisionSlot")
	require.Error(t, mgr.Step(ctx))
	require.False(t, mgr.Holds(manager.RetentionWorker))
	_, err := e.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
SELECT $1::uuid, w.id, 'test', now(), now(), now() + interval '30 seconds' FROM %[1]s.worker_config w WHERE w.name = $2`, e.Schema()),
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
	mgr2 := manager.Standard(manager.Config{Store: e.Store, DeclaredBy: "test", TTL: 30 * time.Second,
		NewID: func() string {
			ids = append(ids, store.NewID())
			return ids[len(ids)-1]
		},
		Clock: clocks.Real(), DBNow: e.DBNow()})
	counter.FailNext("store.ProvisionSlot")
	require.Error(t, mgr2.Step(ctx))
	_, err = e.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
SELECT $1::uuid, w.id, 'test', now(), now(), now() + interval '30 seconds' FROM %[1]s.worker_config w WHERE w.name = $2`, e.Schema()),
		ids[len(ids)-3], manager.RetentionWorker)
	require.NoError(t, err)
	require.NoError(t, mgr2.Release(ctx))
	for _, w := range mgr2.Workers() {
		require.Zero(t, rows(w.Name()), "%s: every slot given back, the unseen one too", w.Name())
	}
}

// A schedule with three managers running produces every due time exactly
// once, including across the crash of the manager running it.
func TestScheduleProducesEveryDueTimeOnceAcrossManagerCrash(t *testing.T) {
	e := actortest.New(t, nil)
	s := e.Stream("orders", settings.Stream{})
	s.Group("g", groupconfig.Declared{})
	ctx := context.Background()
	const ttl = 30 * time.Second
	e.Mock.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	registerSchedule(t, e, s, "tick", "*/5 * * * *", order{OrderID: "tick"}, schedule.MissedAll)
	ms := []*manager.Actor{newManager(e, ttl), newManager(e, ttl), newManager(e, ttl)}
	crashed := -1
	for minute := 1; minute <= 120; minute++ {
		for sec := 0; sec < 60; sec += 10 { // every heartbeat
			e.Mock.Add(10 * time.Second)
			for i, m := range ms {
				if i != crashed {
					require.NoError(t, m.Step(ctx))
				}
			}
		}
		if minute == 30 { // the holder dies; its slot lapses after ttl
			for i, m := range ms {
				if m.Holds(manager.SchedulerWorker) {
					crashed = i
				}
			}
			require.NotEqual(t, -1, crashed)
		}
	}
	taken := false
	for i, m := range ms {
		taken = taken || (i != crashed && m.Holds(manager.SchedulerWorker))
	}
	require.True(t, taken, "another manager took the scheduler over")
	rows, err := e.Pool.Query(ctx, "SELECT key FROM "+s.Table("idempotency")+" ORDER BY key")
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		got = append(got, k)
	}
	require.NoError(t, rows.Err())
	var want []string
	for m := 5; m <= 120; m += 5 {
		want = append(want, "schedule:tick:"+time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(m)*time.Minute).Format(time.RFC3339Nano))
	}
	require.Equal(t, want, got, "every due time, once")
	n, err := storetest.CountLog(ctx, e.Store, s.ID())
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), n, "one message per due time")

	list, err := e.Store.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, time.Date(2026, 3, 1, 2, 5, 0, 0, time.UTC), list[0].NextDue.UTC())
	require.Equal(t, time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC), list[0].LastDue.UTC())
}
