package sqlstreams

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Nonsense is refused with an error naming the field and the rule, before
// anything is written.
func TestNonsenseGroupConfigIsRefusedNamingTheFieldAndTheRule(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	cases := map[string]struct {
		cfg  ConsumerConfig
		says []string
	}{
		"timeout floor above ceiling": {ConsumerConfig{MessageMin: &MessageOptions{Timeout: 10 * time.Second},
			MessageMax: &MessageOptions{Timeout: 5 * time.Second}}, []string{"MessageMin.Timeout 10s", "MessageMax.Timeout 5s", "floor"}},
		"retries floor above ceiling": {ConsumerConfig{MessageMin: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 5}},
			MessageMax: &MessageOptions{Retry: &RetryPolicy{MaxRetries: NoRetries}}}, []string{"MessageMin.Retry.MaxRetries 5", "MessageMax.Retry.MaxRetries -1"}},
		"base delay floor above ceiling": {ConsumerConfig{MessageMin: &MessageOptions{Retry: &RetryPolicy{BaseDelay: time.Minute}},
			MessageMax: &MessageOptions{Retry: &RetryPolicy{BaseDelay: time.Second}}}, []string{"Retry.BaseDelay 1m0s", "Retry.BaseDelay 1s"}},
		"max delay below base delay": {ConsumerConfig{Message: &MessageOptions{Retry: &RetryPolicy{BaseDelay: 10 * time.Second, MaxDelay: time.Second}}},
			[]string{"ConsumerConfig.Message", "Retry.MaxDelay 1s is below Retry.BaseDelay 10s"}},
	}
	for name, tc := range cases {
		_, err := s.Consumer("g").Register(ctx, &tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, name)
		for _, want := range tc.says {
			require.Contains(t, err.Error(), want, name)
		}
	}
	var groups int
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{e.client.Schema()}.Sanitize()+".consumer_group_config").Scan(&groups))
	require.Zero(t, groups, "a refused declaration creates nothing")

	_, err := s.Produce(ctx, order{OrderID: "x"}, &ProduceOptions{Message: &MessageOptions{Retry: &RetryPolicy{BaseDelay: time.Hour, MaxDelay: time.Minute}}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "ProduceOptions.Message: Retry.MaxDelay 1m0s is below Retry.BaseDelay 1h0m0s")
	require.Zero(t, e.count(s))
}

// A session's options have upper bounds: a MessageConcurrency of a million
// is refused at once instead of starting two million goroutines.
func TestConsumeOptionsHaveUpperBounds(t *testing.T) {
	_, _, c := setup(t, nil, "g", 0)
	h := func(context.Context, *order) error { return nil }
	for _, tc := range []struct {
		opts ConsumeOptions
		says string
	}{
		{ConsumeOptions{MessageConcurrency: 1_000_000}, "ConsumeOptions.MessageConcurrency 1000000 outside 1..10000"},
		{ConsumeOptions{BatchLimit: 100, QueueSize: 1_000_000}, "ConsumeOptions.QueueSize 1000000 is above 100000"},
		{ConsumeOptions{BatchLimit: 20_000}, "ConsumeOptions.BatchLimit 20000 outside 1..10000"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		err := c.Consume(ctx, h, &tc.opts) // returns at once: it never starts
		cancel()
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, tc.says)
	}
	require.NoError(t, (&ConsumeOptions{MessageConcurrency: MaxMessageConcurrency}).withDefaults().validate())
}

// @every needs a positive interval of at least one second, in whole
// seconds; the cron library would otherwise run a negative, zero or
// nanosecond interval every second.
func TestScheduleEveryNeedsAWholeSecondIntervalOfAtLeastOneSecond(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.stream("orders")
	for _, expr := range []string{"@every -5m", "@every 1ns", "@every 0s", "@every 1500ms", "@every", "@every soon"} {
		err := e.client.Scheduler("s").Register(ctx, "orders", expr, order{}, nil)
		require.ErrorIs(t, err, ErrInvalidConfig, expr)
		require.ErrorContains(t, err, "@every", expr)
	}
	list, err := e.client.Schedules(ctx)
	require.NoError(t, err)
	require.Empty(t, list, "nothing refused was stored")
	for _, expr := range []string{"@every 1s", "@every 5m", "@every 1h30m"} {
		require.NoError(t, e.client.Scheduler("s").Register(ctx, "orders", expr, order{}, nil), expr)
	}
}

// PostgreSQL's own schemas are refused: no table may land in
// information_schema or a pg_ schema.
func TestSchemasOfPostgresOwnAreRefused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_mine"} {
		_, err := NewClient(ctx, e.pool, &ClientConfig{Schema: schema})
		require.ErrorIs(t, err, ErrInvalidSchema, schema)
		require.ErrorContains(t, err, "reserved for PostgreSQL", schema)
	}
	var n int
	require.NoError(t, e.pool.QueryRow(ctx,
		"SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'information_schema' AND tablename LIKE '%migration%'").Scan(&n))
	require.Zero(t, n)
}

// A nil pool or client is an error, never a panic.
func TestNilPoolAndNilClientAreErrors(t *testing.T) {
	ctx := context.Background()
	_, err := NewClient(ctx, nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "NewClient needs a *pgxpool.Pool")

	s := Stream[order](nil, "orders")
	require.ErrorIs(t, s.Register(ctx, nil), ErrInvalidConfig)
	_, err = s.Produce(ctx, order{}, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "nil *Client")
	_, err = s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{}}}, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = s.Consumer("g").Register(ctx, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// Terminal(nil) is nil, like the error it wraps: a handler that returns it
// has succeeded, and nothing is dead-lettered.
func TestTerminalOfNilIsSuccess(t *testing.T) {
	require.NoError(t, Terminal(nil))
	require.Error(t, Terminal(errors.New("x")))
	st, s := newStepper(t, nil, func(*order, int) error { return Terminal(nil) })
	_, err := s.Produce(context.Background(), order{OrderID: "o1"}, nil)
	require.NoError(t, err)
	st.claimRange()
	require.Empty(t, st.states(), "no exception row, no dead letter")
	require.EqualValues(t, 1, st.stats.Succeeded.Load())
	require.Zero(t, st.stats.Dead.Load())
}

// Delay(d) with d ≤ 0 runs the message again at once (due immediately, no
// mock time passes), without spending a retry, and counts against
// MaxDelays.
func TestDelayOfZeroOrLessRunsAgainAtOnceWithoutSpendingARetry(t *testing.T) {
	results := []error{Delay(0), Delay(-time.Minute), nil}
	calls := 0
	st2, s2 := newStepper(t, nil, func(*order, int) error {
		err := results[calls]
		calls++
		return err
	})
	_, err := s2.Produce(context.Background(), order{OrderID: "o1"}, nil)
	require.NoError(t, err)
	st2.claimRange()
	xs := st2.states()
	require.Len(t, xs, 1)
	require.Equal(t, "pending", xs[0].Status)
	require.Zero(t, xs[0].Attempts, "a delay spends no retry")
	require.Equal(t, 1, xs[0].Delays)
	require.False(t, xs[0].CanRunAfter.After(st2.mock.Now()), "due at once")
	require.Equal(t, 1, st2.retry(), "runs again with no time passing")
	xs = st2.states()
	require.Equal(t, 2, xs[0].Delays)
	require.Zero(t, xs[0].Attempts)
	require.Equal(t, 1, st2.retry())
	require.Empty(t, st2.states(), "the third run succeeded")
	require.Equal(t, 3, calls)
	require.EqualValues(t, 2, st2.stats.Delayed.Load())
}

// A client that may not run DDL (DisableMigrate) only checks the schema: a
// missing or older one is ErrNotMigrated naming `sqlstreams migrate`, and
// nothing is created.
func TestDisableMigrateChecksAndCreatesNothing(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil) // a migrated schema
	fresh := pgtest.Schema(t)
	_, err := NewClient(ctx, e.pool, &ClientConfig{Schema: fresh, DisableMigrate: true})
	require.ErrorIs(t, err, ErrNotMigrated)
	require.ErrorIs(t, err, ErrPermanent)
	require.ErrorContains(t, err, "sqlstreams migrate -schema "+fresh)
	var exists bool
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", fresh).Scan(&exists))
	require.False(t, exists, "no schema was created")

	_, err = NewClient(ctx, e.pool, &ClientConfig{Schema: e.client.Schema(), DisableMigrate: true})
	require.NoError(t, err, "an up-to-date schema is fine")

	_, err = e.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{e.client.Schema()}.Sanitize()+".schema_migration WHERE version = (SELECT max(version) FROM "+
		pgx.Identifier{e.client.Schema()}.Sanitize()+".schema_migration)")
	require.NoError(t, err)
	_, err = NewClient(ctx, e.pool, &ClientConfig{Schema: e.client.Schema(), DisableMigrate: true})
	require.ErrorIs(t, err, ErrNotMigrated)
	require.ErrorContains(t, err, "this library needs")
}

// EngineConns is checked against the pool: a lane count the pool cannot
// spare is refused naming the field and the rule, and NoEngineLanes turns
// the lanes off.
func TestEngineConnsMustLeaveThePoolRoom(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	maxConns := int(pool.Config().MaxConns)
	for _, n := range []int{maxConns, maxConns + 5, -2} {
		_, err := NewClient(ctx, pool, &ClientConfig{Schema: pgtest.Schema(t), EngineConns: n})
		require.ErrorIs(t, err, ErrInvalidConfig, "EngineConns %d", n)
		require.ErrorContains(t, err, "ClientConfig.EngineConns")
	}
	for _, n := range []int{0, 1, maxConns - 1, NoEngineLanes} {
		_, err := NewClient(ctx, pool, &ClientConfig{Schema: pgtest.Schema(t), EngineConns: n})
		require.NoError(t, err, "EngineConns %d", n)
	}
}
