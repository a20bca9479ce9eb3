package sqlstreams

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

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
