package refresher_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestMain starts the tests' PostgreSQL: the refresher's steps, and the
// claimers that read what it publishes, run against a real database
// (internal/actortest).
func TestMain(m *testing.M) { pgtest.Main(m) }

// instance is one simulated Consume session driven by its step functions:
// its own config snapshot and refresher, range claimer and exception claimer.
type instance struct {
	snap   *groupconfig.Snapshot
	ref    *refresher.Actor
	ranges *claimer.Actor
	exc    *claimer.ExceptionActor
}

// newInstance starts an instance of group g on e with handler h: its
// refresher's first step done, its claimers under the snapshot it keeps,
// with the claimer settings the root package's step tests use.
func newInstance(t *testing.T, e *actortest.Env, g *actortest.Group, clk clocks.Clock, h claimer.Handler) *instance {
	t.Helper()
	in := &instance{snap: groupconfig.NewSnapshot(groupconfig.Declared{})}
	in.ref = refresher.New(refresher.Config{Store: e.Store, GroupID: g.ID(), Interval: 30 * time.Second,
		Snapshot: in.snap, Clock: clk, Logger: e.Logger})
	_, err := in.ref.Step(context.Background())
	require.NoError(t, err)
	common := claimer.Common{
		Store: e.Store, StreamID: g.StreamID(), GroupID: g.ID(), InstanceID: store.NewID(),
		Handler: h, Group: in.snap.Group, Concurrency: 4, PollRate: time.Second,
		Lease: time.Minute, KeyBusyDelay: 100 * time.Millisecond, TimeoutGrace: time.Second,
		ShutdownTimeout: func() time.Duration { return time.Second }, Clock: clk, Logger: e.Logger, DBNow: e.DBNow(),
		Stats: &claimer.Stats{},
	}
	in.ranges = claimer.New(claimer.Config{Common: common, BatchLimit: 10, QueueSize: 10, StallAfter: time.Hour})
	common.InstanceID = store.NewID()
	in.exc = claimer.NewExceptionActor(claimer.ExceptionConfig{Common: common})
	return in
}

func (in *instance) retry(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	jobs, err := in.exc.Claim(ctx)
	require.NoError(t, err)
	n := 0
	for ; len(jobs) > 0; n++ { // a chain's next row starts as the one before settles
		more, err := in.exc.Outcome(ctx, in.exc.Run(ctx, jobs[0]))
		require.NoError(t, err)
		jobs = append(jobs[1:], more...)
	}
	return n
}

// The seed's worked case: charge-cards runs MaxRetries 3; a message sits at
// its third retry, about to dead-letter; another service redeclares
// MaxRetries 5; within one refresh interval every instance uses 5 and the
// message gets retries 4 and 5 before it is dead.
func TestRedeclaredMaxRetriesReachesEveryInstanceWithinOneRefresh(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	e := actortest.New(t, &actortest.Options{Clock: mock})
	ctx := context.Background()
	s := e.Stream("payments.requested", settings.Stream{})
	declared := func(retries int) groupconfig.Declared {
		return groupconfig.Declared{
			Message:                 policy.Options{Timeout: 10 * time.Second, MaxRetries: retries, BaseDelay: time.Second, Exponent: 1},
			ExceptionInitialBackoff: time.Second,
		}
	}
	c := s.Group("charge-cards", declared(3))
	var runs atomic.Int32
	h := func(context.Context, *claimer.Delivery) error { runs.Add(1); return errors.New("card processor flaky") }
	a, b := newInstance(t, e, c, mock, h), newInstance(t, e, c, mock, h)
	s.Produce(actortest.Msg{Payload: actortest.Order{OrderID: "o1"}})

	// Run 1 on A's range claimer, retries 1 and 2 on A's and B's exception claimers.
	jobs, err := a.ranges.Claim(ctx)
	require.NoError(t, err)
	_, err = a.ranges.Outcome(ctx, a.ranges.Run(ctx, jobs[0]))
	require.NoError(t, err)
	for _, in := range []*instance{a, b} {
		mock.Add(10 * time.Second)
		require.Equal(t, 1, in.retry(t))
	}
	require.EqualValues(t, 3, runs.Load())
	require.Equal(t, 3, a.snap.Group().Message.MaxRetries)

	// Another service redeclares; nobody has refreshed yet.
	c.Declare(declared(5))
	require.Equal(t, 3, b.snap.Group().Message.MaxRetries, "the claim path never reads the database")

	mock.Add(30 * time.Second) // one refresh interval
	for _, in := range []*instance{a, b} {
		changed, err := in.ref.Step(ctx)
		require.NoError(t, err)
		require.True(t, changed)
		require.Equal(t, 5, in.snap.Group().Message.MaxRetries)
	}
	for i, in := range []*instance{a, b, a} { // retries 3, 4, 5
		mock.Add(10 * time.Second)
		require.Equal(t, 1, in.retry(t), "retry %d", i+3)
	}
	mock.Add(time.Hour)
	require.Zero(t, a.retry(t)+b.retry(t))
	require.EqualValues(t, 6, runs.Load(), "the first run and five retries")
	xs := c.States()
	require.Equal(t, "dead", xs[0].Status)
	require.Equal(t, 6, xs[0].Attempts)
}

// A refresh that flips ConcurrencyOverride does not change the policy of a
// message already claimed.
func TestOverrideIsPinnedAtClaimAcrossARefresh(t *testing.T) {
	mock := clocks.NewMock()
	e := actortest.New(t, &actortest.Options{Clock: mock})
	s := e.Stream("orders", settings.Stream{})
	c := s.Group("g", groupconfig.Declared{})
	ctx := context.Background()
	c.Declare(groupconfig.Declared{ConcurrencyOverride: policy.Exclusive})
	s.Produce(actortest.Msg{Payload: actortest.Order{OrderID: "o1"}, Key: "k"})
	var seen []policy.Concurrency
	var in *instance
	bad := actortest.NewFailures(t)
	in = newInstance(t, e, c, mock, func(_ context.Context, d *claimer.Delivery) error {
		seen = append(seen, d.Concurrency)
		if len(seen) == 1 {
			if err := c.TryDeclare(groupconfig.Declared{ConcurrencyOverride: policy.Parallel}); err != nil {
				bad.Add("redeclare: %v", err)
			}
			if _, err := in.ref.Step(ctx); err != nil {
				bad.Add("refresh: %v", err)
			}
			if got := in.snap.Group().Override; got != policy.Parallel {
				bad.Add("the refresh did not land mid-message: override %q", got)
			}
			return errors.New("retry me")
		}
		return nil
	})
	jobs, err := in.ranges.Claim(ctx)
	require.NoError(t, err)
	_, err = in.ranges.Outcome(ctx, in.ranges.Run(ctx, jobs[0]))
	require.NoError(t, err)
	mock.Add(time.Hour)
	require.Equal(t, 1, in.retry(t))
	bad.Check(t)
	require.Equal(t, []policy.Concurrency{policy.Exclusive, policy.Exclusive}, seen)
}

func TestClaimPathNeverReadsConfigFromTheDatabase(t *testing.T) {
	ctx := context.Background()
	tracer := &countingTracer{}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	mock := clocks.NewMock()
	e := actortest.New(t, &actortest.Options{Clock: mock, Pool: pool})
	s := e.Stream("orders", settings.Stream{})
	c := s.Group("g", groupconfig.Declared{Message: policy.Options{MaxRetries: 1}})
	in := newInstance(t, e, c, mock, func(context.Context, *claimer.Delivery) error { return errors.New("fail") })
	s.Produce(actortest.Orders("m", 30)...)

	before := tracer.reads.Load()
	for range 3 {
		jobs, err := in.ranges.Claim(ctx)
		require.NoError(t, err)
		for _, j := range jobs {
			_, err := in.ranges.Outcome(ctx, in.ranges.Run(ctx, j))
			require.NoError(t, err)
		}
	}
	mock.Add(time.Hour)
	require.Positive(t, in.retry(t))
	require.Equal(t, before, tracer.reads.Load(), "claims, commits and exception writes read no config")
	_, err = in.ref.Step(ctx)
	require.NoError(t, err)
	require.Equal(t, before+1, tracer.reads.Load(), "only the refresher does, once per interval")

}

// countingTracer counts statements that read the group's config.
type countingTracer struct{ reads atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "worker_config") {
		c.reads.Add(1)
	}
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
