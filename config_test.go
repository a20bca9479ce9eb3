package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// instance is one simulated Consume session driven by its step functions:
// its own config snapshot and refresher, range claimer and exception claimer.
type instance struct {
	snap   *groupconfig.Snapshot
	ref    *refresher.Actor
	ranges *claimer.Actor
	exc    *claimer.ExceptionActor
}

func newInstance(t *testing.T, e *env, c *Consumer[order], clk clock.Clock, h claimer.Handler) *instance {
	t.Helper()
	in := &instance{snap: groupconfig.NewSnapshot(groupconfig.Declared{})}
	in.ref = refresher.New(refresher.Config{Store: e.client.store, GroupID: c.group.ID, Interval: 30 * time.Second,
		Snapshot: in.snap, Clock: clk, Logger: e.client.cfg.Logger})
	_, err := in.ref.Step(context.Background())
	require.NoError(t, err)
	common := e.common(c, clk, h)
	common.Group = in.snap.Group
	in.ranges = claimer.New(claimer.Config{Common: common, BatchLimit: 10, QueueSize: 10, StallAfter: time.Hour})
	common.InstanceID = engine.NewID()
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
	mock := clock.NewMock()
	mock.Set(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	s := e.stream("payments.requested")
	declare := func(client *Client, retries int) *Consumer[order] {
		c, err := Stream[order](client, "payments.requested").Consumer("charge-cards").Register(ctx, &ConsumerConfig{
			Message:                 &MessageOptions{Timeout: 10 * time.Second, Retry: &RetryPolicy{MaxRetries: retries, BaseDelay: time.Second, Exponent: 1}},
			ExceptionInitialBackoff: time.Second,
		})
		require.NoError(t, err)
		return c
	}
	c := declare(e.client, 3)
	var runs atomic.Int32
	h := c.adapt(func(context.Context, *order) error { runs.Add(1); return errors.New("card processor flaky") })
	a, b := newInstance(t, e, c, mock, h), newInstance(t, e, c, mock, h)
	_, err := s.Produce(ctx, order{OrderID: "o1"}, nil)
	require.NoError(t, err)

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
	other, err := NewClient(ctx, e.pool, &ClientConfig{Schema: e.client.Schema(), Clock: mock, Logger: e.client.cfg.Logger})
	require.NoError(t, err)
	declare(other, 5)
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
	xs, err := c.db().ExceptionStates(ctx)
	require.NoError(t, err)
	require.Equal(t, "dead", xs[0].Status)
	require.Equal(t, 6, xs[0].Attempts)
}

// The seed's query, as written, against the default schema.
func TestSeedWorkedCaseQuery(t *testing.T) {
	ctx := context.Background()
	admin := pgtest.Pool(t)
	db := strings.TrimPrefix(pgtest.Schema(t), "t_") + "_db"
	_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Database = db
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	})

	client, err := NewClient(ctx, pool, nil)
	require.NoError(t, err)
	require.Equal(t, "sqlstreams", client.Schema())
	payments := Stream[order](client, "payments.requested")
	require.NoError(t, payments.Register(ctx, nil))
	for _, retries := range []int{3, 5} {
		_, err := payments.Consumer("charge-cards").Register(ctx, &ConsumerConfig{
			Message: &MessageOptions{Timeout: 10 * time.Second, Retry: &RetryPolicy{MaxRetries: retries}}})
		require.NoError(t, err)
	}
	rows, err := pool.Query(ctx, `SELECT w.name, w.metadata
FROM sqlstreams.worker_config w
JOIN sqlstreams.consumer_group_config g ON g.id = w.consumer_group_id
WHERE g.name = 'charge-cards';`)
	require.NoError(t, err)
	got := map[string]string{}
	for rows.Next() {
		var name, metadata string
		require.NoError(t, rows.Scan(&name, &metadata))
		got[name] = metadata
	}
	require.NoError(t, rows.Err())
	require.JSONEq(t, `{"message": {"timeout": "10s", "retry": {"max_retries": 5}}}`, got["message_consumer"])
	var history int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM sqlstreams.worker_config_log l
JOIN sqlstreams.worker_config w ON w.id = l.worker_config_id WHERE w.name = 'message_consumer'`).Scan(&history))
	require.Equal(t, 2, history, "worker_config_log holds every earlier document")
}

func TestRedeclarationWarnsSQL0059NamingEachChange(t *testing.T) {
	e, _, _ := setup(t, nil, "g", 0)
	ctx := context.Background()
	s := Stream[order](e.client, "orders")
	logRows := func() int {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.client.Schema()+".worker_config_log").Scan(&n))
		return n
	}
	warnings := func() []string {
		var out []string
		for _, m := range e.logs.Messages(0) {
			if strings.HasPrefix(m, "SQL0059") {
				out = append(out, m)
			}
		}
		return out
	}
	cfgA := &ConsumerConfig{Message: &MessageOptions{Timeout: 10 * time.Second, Retry: &RetryPolicy{MaxRetries: 3}}}
	_, err := s.Consumer("g").Register(ctx, cfgA)
	require.NoError(t, err)
	before := logRows()
	require.Len(t, warnings(), 1, "a declaration over the empty one changes values")

	_, err = s.Consumer("g").Register(ctx, cfgA)
	require.NoError(t, err)
	require.Equal(t, before, logRows(), "an identical redeclaration appends nothing")
	require.Len(t, warnings(), 1, "and logs nothing")

	cfgB := &ConsumerConfig{Message: &MessageOptions{Timeout: 10 * time.Second, Retry: &RetryPolicy{MaxRetries: 5}},
		ExceptionInitialBackoff: 2 * time.Second}
	_, err = s.Consumer("g").Register(ctx, cfgB)
	require.NoError(t, err)
	w := warnings()
	require.Len(t, w, 2)
	require.Contains(t, w[1], "message.retry.max_retries: 3 → 5")
	require.Contains(t, w[1], "exception_initial_backoff: (unset) → 2s")

	// Two services alternating: every restart overwrites, every time visibly.
	for i := range 4 {
		cfg := cfgA
		if i%2 == 1 {
			cfg = cfgB
		}
		_, err = s.Consumer("g").Register(ctx, cfg)
		require.NoError(t, err)
	}
	require.Len(t, warnings(), 6)
	require.Equal(t, before+2+4*2, logRows(), "each changed worker document appends one row")

	// nil declares the empty document.
	_, err = s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	w = warnings()
	require.Contains(t, w[len(w)-1], "message.timeout: 10s → (unset)")
}

func TestShutdownBudgetRederivesWhenMessageMaxMoves(t *testing.T) {
	snap := groupconfig.NewSnapshot(groupconfig.Declared{})
	budget := engine.ShutdownBudget(engine.Options{TimeoutGrace: time.Second}, snap)
	require.Equal(t, policy.DefaultTimeout+time.Second, budget())
	snap.Set(groupconfig.Declared{MessageMax: policy.Options{Timeout: 5 * time.Second}})
	require.Equal(t, 6*time.Second, budget(), "a refreshed ceiling moves the budget")
	fixed := engine.ShutdownBudget(engine.Options{ShutdownTimeout: time.Minute, TimeoutGrace: time.Second}, snap)
	require.Equal(t, time.Minute, fixed(), "a session's own ShutdownTimeout wins")
}

// Without a ceiling (MessageMax.Timeout) to derive from, the budget is the
// timeout a message that sets none runs under: the group's declared
// Message.Timeout (clamped by MessageMin), so a drain does not cut short
// handlers the group declared long (decision 0070).
func TestShutdownBudgetFollowsTheDeclaredMessageTimeoutWithoutACeiling(t *testing.T) {
	snap := groupconfig.NewSnapshot(groupconfig.Declared{Message: policy.Options{Timeout: 2 * time.Minute}})
	budget := engine.ShutdownBudget(engine.Options{TimeoutGrace: time.Second}, snap)
	require.Equal(t, 2*time.Minute+time.Second, budget(), "the declared Message.Timeout")
	snap.Set(groupconfig.Declared{Message: policy.Options{Timeout: time.Second}, MessageMin: policy.Options{Timeout: 10 * time.Second}})
	require.Equal(t, 11*time.Second, budget(), "clamped by MessageMin")
	snap.Set(groupconfig.Declared{Message: policy.Options{Timeout: 2 * time.Minute}, MessageMax: policy.Options{Timeout: 5 * time.Second}})
	require.Equal(t, 6*time.Second, budget(), "a ceiling wins")
}

// A refresh that flips ConcurrencyOverride does not change the policy of a
// message already claimed.
func TestOverrideIsPinnedAtClaimAcrossARefresh(t *testing.T) {
	mock := clock.NewMock()
	e, s, c := setup(t, &ClientConfig{Clock: mock}, "g", 0)
	ctx := context.Background()
	_, err := s.Consumer("g").Register(ctx, &ConsumerConfig{ConcurrencyOverride: Exclusive})
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "o1"}, &ProduceOptions{Key: "k"})
	require.NoError(t, err)
	var seen []Concurrency
	var in *instance
	bad := actortest.NewFailures(t)
	in = newInstance(t, e, c, mock, func(_ context.Context, d *claimer.Delivery) error {
		seen = append(seen, d.Concurrency)
		if len(seen) == 1 {
			if _, err := s.Consumer("g").Register(ctx, &ConsumerConfig{ConcurrencyOverride: Parallel}); err != nil {
				bad.Add("redeclare: %v", err)
			}
			if _, err := in.ref.Step(ctx); err != nil {
				bad.Add("refresh: %v", err)
			}
			if got := in.snap.Group().Override; got != Parallel {
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
	require.Equal(t, []Concurrency{Exclusive, Exclusive}, seen)
}

func TestInspectShowsDeclaredAndDefaults(t *testing.T) {
	e, s, _ := setup(t, nil, "g", 0)
	ctx := context.Background()
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{
		Message:    &MessageOptions{Timeout: 10 * time.Second, Retry: &RetryPolicy{MaxRetries: 7}},
		MessageMax: &MessageOptions{Retry: &RetryPolicy{BaseDelay: 100 * time.Millisecond}},
	})
	require.NoError(t, err)
	sess := consume(t, c, func(context.Context, *order) error { return nil }, fast())
	<-sess.id
	in, err := c.Inspect(ctx)
	require.NoError(t, err)
	got := map[string]Setting{}
	for _, s := range in.Effective {
		got[s.Field] = s
	}
	require.Equal(t, Setting{"message.timeout", "10s", "declared"}, got["message.timeout"])
	require.Equal(t, Setting{"message.retry.max_retries", "7", "declared"}, got["message.retry.max_retries"])
	require.Equal(t, Setting{"message.retry.base_delay", "100ms", "clamped"}, got["message.retry.base_delay"])
	require.Equal(t, Setting{"message.retry.max_delay", "1h0m0s", "default"}, got["message.retry.max_delay"])
	require.Equal(t, Setting{"exception_initial_backoff", "1s", "default"}, got["exception_initial_backoff"])
	require.Equal(t, "declared", got["message_max"].Source)
	declared, err := json.Marshal(in.Config)
	require.NoError(t, err)
	require.JSONEq(t, `{"message":{"timeout":"10s","retry":{"max_retries":7}},"message_max":{"retry":{"base_delay":"100ms"}}}`,
		string(declared))
	require.NotEmpty(t, in.Log)
	require.Equal(t, in.Config, in.Log[0].Config, "the newest declaration is the one in force")
	require.Len(t, in.Members, 1, "one session")
	require.True(t, in.Members[0].Live)
	require.Len(t, in.Members[0].Instances, 2, "its message and exception consumers' rows")
	require.NoError(t, sess.stop(t))
	_ = e
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

func TestClaimPathNeverReadsConfigFromTheDatabase(t *testing.T) {
	ctx := context.Background()
	tracer := &countingTracer{}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	mock := clock.NewMock()
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: pgtest.Schema(t), Clock: mock})
	require.NoError(t, err)
	e := &env{t: t, pool: pool, client: client, logs: actortest.NewLogs(t)}
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 1}}})
	require.NoError(t, err)
	in := newInstance(t, e, c, mock, func(context.Context, *claimer.Delivery) error { return errors.New("fail") })
	e.produceN(s, "m", 30)

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

func TestStreamConfigLadder(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := Stream[order](e.client, "orders")
	require.NoError(t, s.Register(ctx, &StreamConfig{MaxMessageBytes: 4096}))
	require.NoError(t, s.Register(ctx, &StreamConfig{MaxMessageBytes: 4096}))
	for _, m := range e.logs.Messages(0) {
		require.NotContains(t, m, "SQL0059", "creation and identical redeclaration are silent")
	}
	require.NoError(t, s.Register(ctx, &StreamConfig{MaxMessageBytes: 8192}))
	require.Contains(t, e.logs.Messages(0), "SQL0059 stream config redeclared; newest wins: max_message_bytes: 4096 → 8192")
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.client.Schema()+".stream_config_log").Scan(&n))
	require.Equal(t, 2, n, "one snapshot per change, the first declaration included")
	_, cfg, err := Stream[order](e.client, "orders").resolve(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 8192, cfg.MaxMessageBytes, "newest wins")
}
