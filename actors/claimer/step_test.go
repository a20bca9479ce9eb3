package claimer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
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

// TestMain starts the tests' PostgreSQL: the step-driven tests here run the
// claimers against a real database (internal/actortest).
func TestMain(m *testing.M) { pgtest.Main(m) }

type order = actortest.Order

// terminal marks err as not worth retrying, as the public Terminal does.
func terminal(err error) error { return &policy.TerminalError{Err: err} }

// delay asks for another run after d without spending a retry, as the
// public Delay does.
func delay(d time.Duration) error { return &policy.DelayError{D: d} }

// decoded is a claimer.Handler that decodes the delivery's payload into an
// order and hands both to h, as the public API's handler adapter does.
func decoded(h func(o *order, d *claimer.Delivery) error) claimer.Handler {
	return func(_ context.Context, d *claimer.Delivery) error {
		var o order
		if err := json.Unmarshal(d.Msg.Payload, &o); err != nil {
			return terminal(fmt.Errorf("decode message %d: %w", d.Msg.ID, err))
		}
		return h(&o, d)
	}
}

// orderOf decodes a job's order.
func orderOf(t *testing.T, j claimer.Job) order {
	t.Helper()
	var o order
	require.NoError(t, json.Unmarshal(j.Delivery.Msg.Payload, &o))
	return o
}

// dbNow is the time clk sends the database, as the engine's DBNow: a mock's
// time, or nil (now()) for a real clock.
func dbNow(clk clocks.Clock) func() store.Now {
	if _, ok := clk.(*clocks.Mock); !ok {
		return func() store.Now { return nil }
	}
	return func() store.Now { t := clk.Now(); return &t }
}

// common is an actor config for driving the claimers' step functions
// directly against g, under the group config g was declared with.
func common(e *actortest.Env, g *actortest.Group, clk clocks.Clock, h claimer.Handler) claimer.Common {
	group := g.Policy()
	return claimer.Common{
		Store: e.Store, StreamID: g.StreamID(), GroupID: g.ID(), InstanceID: store.NewID(),
		Handler: h, Group: func() policy.Group { return group }, Concurrency: 4, PollRate: time.Second,
		Lease: time.Minute, KeyBusyDelay: 100 * time.Millisecond, TimeoutGrace: time.Second,
		ShutdownTimeout: func() time.Duration { return time.Second }, Clock: clk, Logger: e.Logger, DBNow: dbNow(clk),
		Stats: &claimer.Stats{},
	}
}

// stepper drives a group's two claimers through their step functions with a
// mock clock: no goroutines of ours, no real time.
type stepper struct {
	t      *testing.T
	e      *actortest.Env
	s      *actortest.Stream
	g      *actortest.Group
	mock   *clocks.Mock
	ranges *claimer.Actor
	exc    *claimer.ExceptionActor
	common claimer.Common
	stats  *claimer.Stats
	calls  []call
}

type call struct {
	id      string
	attempt int
	at      time.Time
}

// newStepper drives the group "g" of the stream "orders", declared with
// cfg, with handler h, on a mock clock.
func newStepper(t *testing.T, cfg groupconfig.Declared, h func(o *order, attempt int) error) *stepper {
	t.Helper()
	e := actortest.New(t, nil)
	s := e.Stream("orders", settings.Stream{})
	g := s.Group("g", cfg)
	var st *stepper
	st = newStepperFor(t, e, g, decoded(func(o *order, d *claimer.Delivery) error {
		st.calls = append(st.calls, call{id: o.OrderID, attempt: d.Attempt, at: e.Mock.Now()})
		return h(o, d.Attempt)
	}))
	return st
}

// newStepperFor drives g's claimers with handler h, under the group config
// g was declared with, on e's mock clock.
func newStepperFor(t *testing.T, e *actortest.Env, g *actortest.Group, h claimer.Handler) *stepper {
	t.Helper()
	st := &stepper{t: t, e: e, s: g.Stream, g: g, mock: e.Mock}
	c := common(e, g, e.Mock, h)
	st.stats, st.common = c.Stats, c
	st.ranges = claimer.New(claimer.Config{Common: c, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	st.exc, _ = st.newExc()
	return st
}

// newExc returns a fresh exception claimer with its own instance id, as a
// new process would have.
func (st *stepper) newExc() (*claimer.ExceptionActor, string) { return st.newExcWith(0, 0) }

// newExcWith is newExc with a prefetch and, when concurrency > 0, that many
// handler slots.
func (st *stepper) newExcWith(prefetch, concurrency int) (*claimer.ExceptionActor, string) {
	ec := st.common
	ec.InstanceID = store.NewID()
	if concurrency > 0 {
		ec.Concurrency = concurrency
	}
	return claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec, Prefetch: prefetch}), ec.InstanceID
}

// now is the mock clock's time as the database sees it.
func (st *stepper) now() store.Now { return st.e.Now() }

// claimRange claims and runs one range to its commit.
func (st *stepper) claimRange() int {
	st.t.Helper()
	jobs, err := st.ranges.Claim(context.Background())
	require.NoError(st.t, err)
	return st.runAll(jobs)
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

// runAll runs jobs and the jobs their outcomes release, to the end.
func (st *stepper) runAll(jobs []claimer.Job) int {
	st.t.Helper()
	ctx := context.Background()
	n := 0
	for len(jobs) > 0 {
		j := jobs[0]
		jobs = jobs[1:]
		more, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(st.t, err)
		jobs = append(jobs, more...)
		n++
	}
	return n
}

// states returns the group's exception rows.
func (st *stepper) states() []store.ExceptionState { return st.g.States() }

// exceptions counts the group's exception rows.
func (st *stepper) exceptions() int64 {
	st.t.Helper()
	n, err := storetest.CountExceptions(context.Background(), st.e.Store, st.g.StreamID(), st.g.ID())
	require.NoError(st.t, err)
	return n
}

// deliveries returns the group's delivery-log rows.
func (st *stepper) deliveries(t *testing.T) []storetest.Delivery {
	t.Helper()
	log, err := storetest.Deliveries(context.Background(), st.e.Store, st.g.StreamID(), st.g.ID(), nil)
	require.NoError(t, err)
	return log
}

// expireRanges moves every range lease of the stream into the past: its
// holder died.
func (st *stepper) expireRanges() {
	st.t.Helper()
	_, err := st.e.Pool.Exec(context.Background(), "UPDATE "+st.s.Table("range")+" SET expires_at = '-infinity'")
	require.NoError(st.t, err)
}
