package manager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/manager"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestMain starts the tests' PostgreSQL: the manager's steps run against a
// real database (internal/actortest).
func TestMain(m *testing.M) { pgtest.Main(m) }

type order = actortest.Order

// hour is a RetentionTTL of an hour, as a stream's config stores it.
var hour = string(settings.Of(time.Hour))

// newManager returns a manager of the standard workers on e, as a client's
// is, with heartbeat TTL ttl.
func newManager(e *actortest.Env, ttl time.Duration) *manager.Actor {
	return manager.Standard(manager.Config{Store: e.Store, DeclaredBy: actortest.DeclaredBy, TTL: ttl, NewID: store.NewID,
		Clock: e.Clock, Logger: e.Logger, DBNow: e.DBNow()})
}

// declareWorker replaces a maintenance worker's knobs, as Manager.Declare
// does.
func declareWorker(t *testing.T, e *actortest.Env, worker string, w settings.Worker) {
	t.Helper()
	doc, err := w.Doc()
	require.NoError(t, err)
	require.NoError(t, e.Store.DeclareFleetWorker(context.Background(), worker, doc, actortest.DeclaredBy, e.Now()))
}

// stepper drives a group's range and exception claimers through their
// step functions, with the claimer settings of the claimer's own step
// tests, so that a group commits (and retention may drop) what it handled.
type stepper struct {
	t      *testing.T
	e      *actortest.Env
	s      *actortest.Stream
	g      *actortest.Group
	mock   *clocks.Mock
	ranges *claimer.Actor
	exc    *claimer.ExceptionActor
	calls  []string // the orders handled, in order
}

// newStepper drives the group "g" of the stream "orders", declared with
// cfg, with handler h, on a mock clock.
func newStepper(t *testing.T, cfg groupconfig.Declared, h func(o *order, attempt int) error) *stepper {
	t.Helper()
	e := actortest.New(t, nil)
	return newStepperFor(t, e, e.Stream("orders", settings.Stream{}).Group("g", cfg), h)
}

// newStepperFor drives g's claimers with handler h.
func newStepperFor(t *testing.T, e *actortest.Env, g *actortest.Group, h func(o *order, attempt int) error) *stepper {
	t.Helper()
	st := &stepper{t: t, e: e, s: g.Stream, g: g, mock: e.Mock}
	group := g.Policy()
	common := claimer.Common{
		Store: e.Store, StreamID: g.StreamID(), GroupID: g.ID(), InstanceID: store.NewID(),
		Handler: func(_ context.Context, d *claimer.Delivery) error {
			var o order
			if err := json.Unmarshal(d.Msg.Payload, &o); err != nil {
				return &policy.TerminalError{Err: err}
			}
			st.calls = append(st.calls, o.OrderID)
			return h(&o, d.Attempt)
		},
		Group: func() policy.Group { return group }, Concurrency: 4, PollRate: time.Second,
		Lease: time.Minute, KeyBusyDelay: 100 * time.Millisecond, TimeoutGrace: time.Second,
		ShutdownTimeout: func() time.Duration { return time.Second }, Clock: e.Clock, Logger: e.Logger, DBNow: e.DBNow(),
		Stats: &claimer.Stats{},
	}
	st.ranges = claimer.New(claimer.Config{Common: common, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	common.InstanceID = store.NewID()
	st.exc = claimer.NewExceptionActor(claimer.ExceptionConfig{Common: common})
	return st
}

// claimRange claims and runs one range to its commit.
func (st *stepper) claimRange() int {
	st.t.Helper()
	ctx := context.Background()
	jobs, err := st.ranges.Claim(ctx)
	require.NoError(st.t, err)
	n := 0
	for ; len(jobs) > 0; n++ {
		more, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, jobs[0]))
		require.NoError(st.t, err)
		jobs = append(jobs[1:], more...)
	}
	return n
}

// retry claims and runs the due exception rows; it returns how many ran.
func (st *stepper) retry() int {
	st.t.Helper()
	ctx := context.Background()
	jobs, err := st.exc.Claim(ctx)
	require.NoError(st.t, err)
	n := 0
	for ; len(jobs) > 0; n++ { // a chain's next row starts as the one before settles
		more, err := st.exc.Outcome(ctx, st.exc.Run(ctx, jobs[0]))
		require.NoError(st.t, err)
		jobs = append(jobs[1:], more...)
	}
	return n
}

// count counts the stream's messages.
func (st *stepper) count() int64 {
	st.t.Helper()
	n, err := storetest.CountLog(context.Background(), st.e.Store, st.s.ID())
	require.NoError(st.t, err)
	return n
}

// Under a RetentionTTL, a stream produced to for a simulated day holds a
// bounded number of rows and chunks: whole chunks go once every group has
// committed past them and every row in them is past the TTL, so the log
// tables carry no dead tuples; a group that lags holds every message it has
// not committed, and gets all of them when it catches up.
func TestRetentionKeepsTheLogBounded(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return nil })
	ctx := context.Background()
	st.s.Declare("orders", settings.Stream{RetentionTTL: hour})
	declareWorker(t, st.e, manager.RetentionWorker, settings.Worker{Batch: 20, MaxBatches: 10, ChunkInterval: settings.Of(30 * time.Minute)})
	mgr := newManager(st.e, 30*time.Second)
	ret := retention(t, mgr)
	slow := st.s.Group("slow", groupconfig.Declared{})
	slowHandled := 0
	slowSt := newStepperFor(t, st.e, slow, func(*order, int) error {
		slowHandled++
		return nil
	})
	streamID := st.g.StreamID()

	const step, perStep = 10 * time.Minute, 30
	produced, mostRows, mostChunks := 0, int64(0), 0
	for i := range 6 * 24 { // a simulated day in 10-minute steps
		for j := range perStep { // one transaction each, so xids move as in a real stream
			st.s.Produce(actortest.Msg{Payload: order{OrderID: fmt.Sprintf("s%d-%d", i, j)}})
		}
		produced += perStep
		for st.claimRange() > 0 {
		}
		if i >= 6*12 { // group slow lags for half a day, then catches up and keeps up
			require.GreaterOrEqual(t, st.count(), int64(produced-slowHandled), "step %d: the log holds what group slow has not committed", i)
			for slowSt.claimRange() > 0 {
			}
			require.Equal(t, produced, slowHandled, "step %d: group slow handled every message once it caught up", i)
		}
		st.mock.Add(step)
		require.NoError(t, mgr.Step(ctx))
		n := st.count()
		cs, err := st.e.Store.Chunks(ctx, streamID)
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
	require.NoError(t, st.e.Pool.QueryRow(ctx, "SELECT pg_stat_force_next_flush()").Scan(new(any)))
	require.NoError(t, st.e.Pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_dead_tup) FILTER (WHERE relname NOT LIKE '%\_default'), 0)
FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE $2`, st.e.Schema(), fmt.Sprintf("stream\\_%d\\_log%%", streamID)).Scan(&dead, &chunkDead))
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
	st := newStepper(t, groupconfig.Declared{Message: policy.Options{MaxRetries: 3}}, func(o *order, attempt int) error {
		switch {
		case o.OrderID == "m-3":
			return &policy.TerminalError{Err: errors.New("poison")}
		case o.OrderID == "m-5" && attempt == 1:
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Declare("orders", settings.Stream{RetentionTTL: hour})
	st.s.Produce(actortest.Orders("m", 10)...)
	require.Equal(t, 10, st.claimRange())
	mgr := newManager(st.e, 30*time.Second)
	survivors := func() []string {
		rows, err := st.e.Pool.Query(ctx, "SELECT payload->>'order_id' FROM "+st.s.Table("log")+" ORDER BY id")
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
	late := st.s.Group("late", groupconfig.Declared{})
	require.Equal(t, 1, st.retry(), "m-5 succeeds on retry")
	st.mock.Add(time.Hour)
	require.NoError(t, mgr.Step(ctx))
	require.Equal(t, []string{"m-3", "m-5", "m-6", "m-7", "m-8", "m-9"}, survivors(), "group late has committed nothing")

	lateSt := newStepperFor(t, st.e, late, func(*order, int) error { return nil })
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
	st := newStepper(t, groupconfig.Declared{}, func(o *order, _ int) error {
		if fail && o.OrderID == "m-3" {
			return &policy.TerminalError{Err: errors.New("poison")}
		}
		return nil
	})
	ctx := context.Background()
	st.s.Declare("orders", settings.Stream{RetentionTTL: hour})
	declareWorker(t, st.e, manager.RetentionWorker, settings.Worker{ChunkInterval: settings.Of(time.Minute)})
	mgr := newManager(st.e, 30*time.Second)
	ret := retention(t, mgr)
	streamID := st.g.StreamID()
	chunks := func() []store.Chunk {
		cs, err := st.e.Store.Chunks(ctx, streamID)
		require.NoError(t, err)
		return cs
	}
	// burn moves the cluster's xids past a chunk: each autocommitted call
	// is a transaction with its own xid.
	burn := func(n int) {
		for range n {
			_, err := st.e.Pool.Exec(ctx, "SELECT pg_current_xact_id()")
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
		p := st.s.Produce(actortest.Msg{Payload: order{OrderID: fmt.Sprintf("m-%d", i)}})
		ids = append(ids, p[0].ID)
	}
	require.Equal(t, 5, st.claimRange())
	dead, err := st.g.DB.ListDead(ctx, 0, 10)
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
	require.Equal(t, int64(1), st.count(), "only the dead letter's message remains")

	after, err := st.g.DB.ListDead(ctx, 0, 10)
	require.NoError(t, err)
	require.Equal(t, dead, after, "the dead letter is listed as before")
	fail = false
	n, err := st.g.DB.Redrive(ctx, &ids[3], st.e.Now())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, st.retry(), "the redriven message runs with its payload")
	require.Equal(t, "m-3", st.calls[len(st.calls)-1])
}
