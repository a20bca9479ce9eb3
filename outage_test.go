package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// handledSet records which messages were handled, and signals each first
// handling.
type handledSet struct {
	mu    sync.Mutex
	seen  map[string]bool
	fresh chan string
}

// skipOutageWhenShort skips a test that stops the test binary's PostgreSQL
// (pgtest.StopFor): the fast tier (go test -short, make check) runs no
// outage.
func skipOutageWhenShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("stops the test PostgreSQL: skipped with -short")
	}
}

func newHandledSet() *handledSet {
	return &handledSet{seen: map[string]bool{}, fresh: make(chan string, 1000)}
}

func (h *handledSet) add(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.seen[id] {
		h.seen[id] = true
		h.fresh <- id
	}
}

// waitAll waits until every id of want was handled.
func (h *handledSet) waitAll(t *testing.T, want []string) {
	t.Helper()
	for {
		h.mu.Lock()
		missing := 0
		for _, id := range want {
			if !h.seen[id] {
				missing++
			}
		}
		h.mu.Unlock()
		if missing == 0 {
			return
		}
		within(t, h.fresh, fmt.Sprintf("%d more messages to be handled", missing))
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// Once its context ends, Consume returns within ShutdownTimeout plus
// ShutdownGrace whatever the database does. PostgreSQL is stopped and the
// session cancelled: with handlers in flight (they get ShutdownTimeout, then
// nothing can be handed back), and with the range claimer restarted by the
// supervisor in the middle of the outage (a panic: the restarted claimer
// cannot even start its first statement). Consume must return within the
// budget, measured on the wall clock. What it held lapses with its lease,
// and once the database is back another session delivers every message.
func TestConsumeReturnsWithinItsBudgetWhilePostgresIsDown(t *testing.T) {
	skipOutageWhenShort(t)
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "handlers in flight", true: "claimer restarted mid-outage"}[restart], func(t *testing.T) {
			e, s, c := setup(t, &ClientConfig{Retry: Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}}, "g", 0)
			// One batch: the claimer's queue (2 batches) is never full, so it
			// keeps trying to claim during the outage (where the fault fires).
			want := ids("m", 3)
			e.produceN(s, "m", len(want))

			inFlight := make(chan string, len(want))
			var armed atomic.Bool
			restarted := make(chan struct{})
			fault := func(site hooks.Site) error {
				if site == hooks.ClaimerClaim && armed.CompareAndSwap(true, false) {
					close(restarted)
					hooks.Inject(site) // the range claimer restarts while the database is down
				}
				return nil
			}
			const budget = 2 * time.Second
			opts := &ConsumeOptions{BatchLimit: 3, MessageConcurrency: 3, ClaimPollRate: 20 * time.Millisecond,
				InstanceTTL: 2 * time.Second, ShutdownTimeout: budget, DisableManager: true, test: &hooks.Hooks{Step: fault}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- c.Consume(ctx, func(ctx context.Context, o *order) error {
					inFlight <- o.OrderID
					<-ctx.Done() // holds its message until the session cuts it off
					return ctx.Err()
				}, opts)
			}()
			within(t, inFlight, "a handler in flight")

			start := pgtest.StopFor(t, "fast")
			if restart {
				armed.Store(true)
				within(t, restarted, "the range claimer to restart during the outage")
			}
			cancelled := time.Now()
			cancel()
			ceiling := time.NewTimer(budget + ShutdownGrace)
			defer ceiling.Stop()
			select {
			case err := <-done:
				t.Logf("Consume returned %s after its context ended, with the database down (budget %s + grace %s)",
					time.Since(cancelled).Round(time.Millisecond), budget, ShutdownGrace)
				require.NoError(t, err)
			case <-ceiling.C:
				t.Fatalf("Consume had not returned %s after its context ended (ShutdownTimeout %s + ShutdownGrace %s)",
					budget+ShutdownGrace, budget, ShutdownGrace)
			}

			start()
			got := newHandledSet()
			sess := consume(t, c, func(ctx context.Context, o *order) error {
				got.add(o.OrderID)
				return nil
			}, &ConsumeOptions{BatchLimit: 3, ClaimPollRate: 20 * time.Millisecond, InstanceTTL: 2 * time.Second})
			got.waitAll(t, want) // the lapsed leases are reclaimed: nothing is lost
			require.NoError(t, sess.stop(t))
		})
	}
}

// Readiness is a level: ready while the session consumes and reaches its
// database; not ready once PostgreSQL has been unreachable for longer than
// InstanceTTL; ready again when it is back; not ready after Consume returns.
func TestReadinessIsALevel(t *testing.T) {
	skipOutageWhenShort(t)
	_, _, c := setup(t, &ClientConfig{Retry: Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}}, "g", 0)
	ready := NewReadiness()
	require.False(t, ready.Ready(), "no session yet")
	sess := consume(t, c, func(context.Context, *order) error { return nil }, &ConsumeOptions{
		ClaimPollRate: 20 * time.Millisecond, InstanceTTL: time.Second, ConfigRefreshInterval: 100 * time.Millisecond,
		Readiness: ready, DisableManager: true})
	waitLevel(t, ready, true, "ready while consuming")

	down := time.Now()
	start := pgtest.StopFor(t, "fast")
	waitLevel(t, ready, false, "not ready once the database has been unreachable for longer than InstanceTTL")
	// Counted from the last store call that succeeded, at most a heartbeat
	// interval (a third of the TTL) before the stop.
	require.GreaterOrEqual(t, time.Since(down), 2*time.Second/3, "an outage shorter than InstanceTTL keeps it ready")
	start()
	waitLevel(t, ready, true, "ready again once the database is back")

	require.NoError(t, sess.stop(t))
	require.False(t, ready.Ready(), "not ready after Consume returned")
}

// waitLevel waits, on the readiness's change signal, for its level to be
// want.
func waitLevel(t *testing.T, r *Readiness, want bool, what string) {
	t.Helper()
	for {
		ch := r.Changed()
		if r.Ready() == want {
			return
		}
		within(t, ch, what)
	}
}

// A failure that retrying cannot fix ends the session: Consume returns an
// error wrapping ErrPermanent that names the cause and the remedy, instead
// of retrying every poll while Readiness stays true.
// ddlRetryingDeadlocks runs a DROP while a session runs: it takes its locks
// one object at a time, so a session's statement that reads several of
// them may deadlock with it, and PostgreSQL may pick the DROP as the victim.
// It is run again then (at most 5 times).
func ddlRetryingDeadlocks(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	var err error
	for range 5 {
		var pgErr *pgconn.PgError
		if _, err = pool.Exec(context.Background(), sql); !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			break
		}
	}
	require.NoError(t, err)
}

func TestPermanentStoreErrorsEndConsume(t *testing.T) {
	cases := map[string]struct {
		breakIt func(t *testing.T, e *env, c *Consumer[order], pool *pgxpool.Pool)
		says    []string
	}{
		"dropped schema": {
			breakIt: func(t *testing.T, e *env, _ *Consumer[order], _ *pgxpool.Pool) {
				ddlRetryingDeadlocks(t, e.pool, "DROP SCHEMA "+pgx.Identifier{e.client.Schema()}.Sanitize()+" CASCADE")
			},
			says: []string{"SQLSTATE", "sqlstreams migrate"},
		},
		"dropped table": {
			breakIt: func(t *testing.T, e *env, c *Consumer[order], _ *pgxpool.Pool) {
				ddlRetryingDeadlocks(t, e.pool, fmt.Sprintf("DROP TABLE %s.stream_%d_range",
					pgx.Identifier{e.client.Schema()}.Sanitize(), c.group.StreamID))
			},
			says: []string{"42P01", "sqlstreams migrate"},
		},
		"closed pool": {
			breakIt: func(t *testing.T, _ *env, _ *Consumer[order], pool *pgxpool.Pool) {
				go pool.Close() // Close waits for the connections in use, which Consume gives back as it stops
			},
			says: []string{"closed pool", "close the pool only after Consume has returned"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e, _, _ := setup(t, nil, "g", 0)
			pool := poolOf(t, 8)
			client, err := NewClient(context.Background(), pool, &ClientConfig{Schema: e.client.Schema(), Logger: slog.New(e.logs),
				Retry: Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
			require.NoError(t, err)
			c, err := Stream[order](client, "orders").Consumer("g").Register(context.Background(), nil)
			require.NoError(t, err)
			ready := NewReadiness()
			sess := consume(t, c, func(context.Context, *order) error { return nil }, &ConsumeOptions{
				ClaimPollRate: 20 * time.Millisecond, InstanceTTL: 2 * time.Second, ShutdownTimeout: time.Second,
				Readiness: ready, DisableManager: true})
			waitLevel(t, ready, true, "the session to consume")
			tc.breakIt(t, e, c, pool)
			err = within(t, sess.done, "Consume to return on its own")
			sess.done <- err
			require.ErrorIs(t, err, ErrPermanent)
			for _, s := range tc.says {
				require.Contains(t, err.Error(), s)
			}
			require.False(t, ready.Ready())
			for _, m := range e.logs.Messages(slog.LevelWarn) {
				require.NotContains(t, m, "actor failed; restarting", "a permanent error is not retried by restarting actors")
			}
		})
	}
}

// A role that loses a privilege it needs is a permanent error too: the
// session ends naming the privilege, and nothing is retried forever. It
// needs a role the test may create (the private cluster's superuser can).
func TestMissingPrivilegeEndsConsume(t *testing.T) {
	e, _, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	role := "r_" + e.client.Schema()
	schema := pgx.Identifier{e.client.Schema()}.Sanitize()
	if _, err := e.pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
		t.Skipf("the test database user cannot create roles (%v); skipped", err)
	}
	t.Cleanup(func() {
		_, _ = e.pool.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = e.pool.Exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	for _, q := range []string{
		"GRANT USAGE ON SCHEMA " + schema + " TO " + pgx.Identifier{role}.Sanitize(),
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + schema + " TO " + pgx.Identifier{role}.Sanitize(),
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + pgx.Identifier{role}.Sanitize(),
	} {
		_, err := e.pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: e.client.Schema(), Logger: slog.New(e.logs), DisableMigrate: true,
		Retry: Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	require.NoError(t, err)
	rc, err := Stream[order](client, "orders").Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	ready := NewReadiness()
	got := newHandledSet()
	sess := consume(t, rc, func(_ context.Context, o *order) error { got.add(o.OrderID); return nil }, &ConsumeOptions{
		ClaimPollRate: 20 * time.Millisecond, InstanceTTL: 2 * time.Second, ShutdownTimeout: time.Second,
		Readiness: ready, DisableManager: true})
	waitLevel(t, ready, true, "the session to consume as the application role")
	// With the grants of README's Privileges section the role produces
	// (plain and idempotent) and consumes.
	app := Stream[order](client, "orders")
	_, err = app.Produce(ctx, order{OrderID: "plain"}, nil)
	require.NoError(t, err)
	_, err = app.Produce(ctx, order{OrderID: "idempotent"}, &ProduceOptions{IdempotencyKey: "once"})
	require.NoError(t, err)
	got.waitAll(t, []string{"plain", "idempotent"})
	_, err = e.pool.Exec(ctx, fmt.Sprintf("REVOKE ALL ON %s.stream_%d_cursor FROM %s", schema, c.group.StreamID, pgx.Identifier{role}.Sanitize()))
	require.NoError(t, err)
	err = within(t, sess.done, "Consume to return on its own")
	sess.done <- err
	require.ErrorIs(t, err, ErrPermanent)
	require.Contains(t, err.Error(), "42501")
	require.Contains(t, err.Error(), "GRANT")
}

// Produce does not retry: while the database cannot be reached it fails at
// once with ErrUnavailable, wrapping the cause, which errors.Is can test
// (issue 60: a raw connection error), whether the stream's row was read
// already or not. Nothing is written, and the next produce once the
// database is back succeeds.
func TestProduceDuringAnOutageIsErrUnavailable(t *testing.T) {
	skipOutageWhenShort(t)
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	_, err := s.Produce(ctx, order{OrderID: "before"}, nil)
	require.NoError(t, err)
	fresh := Stream[order](e.client, "orders") // its row not read yet
	start := pgtest.StopFor(t, "fast")
	for name, produce := range map[string]func() error{
		"Produce": func() error { _, err := s.Produce(ctx, order{OrderID: "during"}, nil); return err },
		"ProduceBatch": func() error {
			_, err := s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "during"}}}, nil)
			return err
		},
		"Produce, the row unknown": func() error { _, err := fresh.Produce(ctx, order{OrderID: "during"}, nil); return err },
	} {
		err := produce()
		require.ErrorIs(t, err, ErrUnavailable, name)
		require.ErrorContains(t, err, `produce to "orders"`, name)
		require.NotEqual(t, ErrUnavailable.Error(), err.Error(), "%s: the cause is kept", name)
	}
	start()
	_, err = s.Produce(ctx, order{OrderID: "after"}, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, e.count(s), "nothing was written during the outage")
}
