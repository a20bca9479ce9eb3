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
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// Under a RetentionTTL, a stream produced to and consumed for a simulated
// day holds no more than the TTL's worth of messages, and retention runs in
// bounded batches.
func TestRetentionKeepsTheLogBounded(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	require.NoError(t, s.Register(ctx, &StreamConfig{RetentionTTL: time.Hour}))
	require.NoError(t, st.e.client.Manager().Declare(ctx, WorkerRetention, WorkerConfig{Batch: 20, MaxBatches: 10}))
	mgr := st.e.client.Manager().actor(30 * time.Second)
	ret := retention(t, mgr)
	most := int64(0)
	for half := range 48 {
		st.e.produceN(s, fmt.Sprintf("h%d", half), 50)
		for st.claimRange() > 0 {
		}
		st.mock.Add(30 * time.Minute)
		require.NoError(t, mgr.Step(ctx))
		n := st.e.count(s)
		most = max(most, n)
		require.LessOrEqual(t, n, int64(150), "half-hour %d: only messages younger than the TTL (and the batch at its edge) remain", half)
	}
	require.GreaterOrEqual(t, ret.Deleted.Load(), int64(46*50))
	var dead int64
	require.NoError(t, st.e.pool.QueryRow(ctx, "SELECT pg_stat_force_next_flush()").Scan(new(any)))
	require.NoError(t, st.e.pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname LIKE '%\_log'`, st.e.client.Schema()).Scan(&dead))
	t.Logf("retention: at most %d rows held, %d deleted, %d dead tuples in the log table (left to autovacuum)", most, ret.Deleted.Load(), dead)
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
	mgr := st.e.client.Manager().actor(30 * time.Second)
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

// With target 1 and three managers, exactly one runs the worker; when it
// dies another takes over within one heartbeat TTL; Instances and Suspend
// move the count on the next heartbeat.
func TestManagerRunsEachWorkerOnItsTargetCount(t *testing.T) {
	st, _ := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	const ttl = 3 * time.Second
	ms := []*manager.Actor{st.e.client.Manager().actor(ttl), st.e.client.Manager().actor(ttl), st.e.client.Manager().actor(ttl)}
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

// A worker's knobs change by redeclaring its worker_config row; the running
// worker follows at its next heartbeat.
func TestWorkerKnobsFollowRedeclaration(t *testing.T) {
	st, _ := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	m := st.e.client.Manager()
	require.NoError(t, m.Declare(ctx, WorkerRetention, WorkerConfig{Interval: time.Hour}))
	a := m.actor(time.Hour) // a TTL longer than the test's steps: the slot never lapses
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 1, a.Rounds[WorkerRetention])
	st.mock.Add(10 * time.Minute)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 1, a.Rounds[WorkerRetention], "an hour between rounds")
	require.NoError(t, m.Declare(ctx, WorkerRetention, WorkerConfig{Interval: 5 * time.Minute}))
	st.mock.Add(10 * time.Second)
	require.NoError(t, a.Step(ctx))
	require.Equal(t, 2, a.Rounds[WorkerRetention], "the redeclared 5m interval applies at the next heartbeat")
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
	a := m.actor(2 * time.Hour)
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
		require.NoError(t, e.client.store.InsertInstance(ctx, id, c.group.Workers[store.WorkerMessageConsumer], "gone", time.Minute, engine.DBNow(mock)()))
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
