package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// chaosDuration is how long the fault injector runs: SQLSTREAMS_CHAOS
// (a Go duration; `make chaos DURATION=30m`), else a short run that make
// test (and so CI) includes; -short skips it.
func chaosDuration(t *testing.T) time.Duration {
	if v := os.Getenv("SQLSTREAMS_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "SQLSTREAMS_CHAOS")
		return d
	}
	if testing.Short() {
		t.Skip("chaos: skipped with -short")
	}
	return 45 * time.Second
}

// chaosSeed is the fault injector's seed: SQLSTREAMS_CHAOS_SEED, else random
// (printed, so a failing run can be repeated with the same faults).
func chaosSeed(t *testing.T) uint64 {
	return envNumber(t, "SQLSTREAMS_CHAOS_SEED", rand.Uint64())
}

// envNumber reads a number from the environment, def when unset.
func envNumber[N int | uint64](t *testing.T, name string, def N) N {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var n N
	_, err := fmt.Sscan(v, &n)
	require.NoError(t, err, name)
	return n
}

// chaosRate is the offered load in messages per second, shared by the two
// producers: SQLSTREAMS_CHAOS_RATE, default 100; 0 produces as fast as the
// producers can. A chaos run checks what happens to messages under faults;
// unthrottled producers outrun consumers that lose a database every few
// seconds, and the run measures only how long the backlog takes to drain.
func chaosRate(t *testing.T) int {
	return envNumber(t, "SQLSTREAMS_CHAOS_RATE", 100)
}

// TestChaos runs several Consume sessions of one group while producers
// produce and a seeded injector kills instances, terminates backends,
// restarts PostgreSQL, panics actors, and handlers fail, panic and hang. A
// ledger written in the producers' own transactions lets the checker sort
// every message: handled, dead, or missing. Missing must be 0; duplicates
// (at-least-once) are counted, not failed.
func TestChaos(t *testing.T) {
	duration := chaosDuration(t)
	seed := chaosSeed(t)
	rate := chaosRate(t)
	t.Logf("chaos: duration %s, offered %d msg/s (0: unthrottled), seed %d (SQLSTREAMS_CHAOS_SEED=%d repeats the faults)", duration, rate, seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var rngMu sync.Mutex
	roll := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }

	ctx := context.Background()
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 40
	cfg.ConnConfig.RuntimeParams["application_name"] = "chaos-app"
	deadlocks := &deadlockCounter{}
	cfg.ConnConfig.Tracer = deadlocks
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	control := pgtest.Pool(t) // the harness's own connections, never terminated
	// The injector restarts PostgreSQL every few seconds, far more often
	// than autovacuum's one-minute nap: without this it would never run, and
	// a long run would measure plans on statistics from its first minute and
	// tables full of dead tuples, which no deployment has. (On a server of
	// its own the harness is not allowed to restart, and this may fail.)
	if _, err := control.Exec(ctx, "ALTER SYSTEM SET autovacuum_naptime = '1s'"); err == nil {
		_, _ = control.Exec(ctx, "SELECT pg_reload_conf()")
		t.Cleanup(func() {
			_, _ = control.Exec(context.Background(), "ALTER SYSTEM RESET autovacuum_naptime")
			_, _ = control.Exec(context.Background(), "SELECT pg_reload_conf()")
		})
	}
	sink := actortest.NewLogs(t)
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: schema, Logger: slog.New(sink)})
	require.NoError(t, err)
	s := Stream[order](client, "chaos")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{
		Message:                 &MessageOptions{Timeout: 300 * time.Millisecond, Retry: &RetryPolicy{MaxRetries: 30, BaseDelay: 10 * time.Millisecond, MaxDelay: 200 * time.Millisecond}},
		ExceptionInitialBackoff: 10 * time.Millisecond,
		MaxRangeReclaims:        5,
	})
	require.NoError(t, err)
	_, err = control.Exec(ctx, "CREATE TABLE "+schema+".chaos_ledger (id text PRIMARY KEY, handled int NOT NULL DEFAULT 0)")
	require.NoError(t, err)

	stopAll := make(chan struct{}) // releases handlers still hanging at the end
	var faults sync.Map            // kind → *atomic.Int64
	count := func(kind string) {
		v, _ := faults.LoadOrStore(kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	handler := func(ctx context.Context, o *order) error {
		switch r := roll(1000); {
		case r < 40:
			count("handler error")
			return errors.New("chaos: handler fails")
		case r < 55:
			count("handler panic")
			panic("chaos: handler panics")
		case r < 60:
			// It ignores its context well past Timeout + TimeoutGrace,
			// then does its work: a handler that returns nil has handled
			// the message, however late (a loaded runner may still take
			// that nil, and an abandoned one's update counts as a
			// duplicate).
			count("handler hang")
			select {
			case <-time.After(time.Second):
			case <-stopAll:
				return errors.New("chaos: released at the end")
			}
		}
		_, err := pool.Exec(ctx, "UPDATE "+schema+".chaos_ledger SET handled = handled + 1 WHERE id = $1", o.OrderID)
		return err
	}
	var actorPanics atomic.Bool
	var uninjected atomic.Int64 // actor panics no hook injected: bugs
	fault := func(site hooks.Site) error {
		if actorPanics.Load() && (site == hooks.ClaimerClaim || site == hooks.ExceptionsClaim || site == hooks.Registrar) && roll(50) == 0 {
			count("actor panic")
			hooks.Inject(site)
		}
		return nil
	}
	opts := &ConsumeOptions{BatchLimit: 20, MessageConcurrency: 4, ClaimPollRate: 20 * time.Millisecond,
		InstanceTTL: 2 * time.Second, TimeoutGrace: 100 * time.Millisecond, ShutdownTimeout: 500 * time.Millisecond,
		ConfigRefreshInterval: time.Second}

	type inst struct {
		cancel context.CancelFunc
		done   chan error
		abrupt bool
		calm   atomic.Int64 // messages handled after the faults stopped
		n      int          // its number, in start order
	}
	var calm atomic.Bool
	runs := &successfulRuns{byID: map[string][]successfulRun{}, abrupt: map[int]bool{}}
	var mu sync.Mutex
	var running []*inst
	var all []*inst
	start := func(abrupt bool) {
		o := *opts
		o.DisableGracefulShutdown = abrupt
		ictx, cancel := context.WithCancel(ctx)
		mu.Lock()
		in := &inst{cancel: cancel, done: make(chan error, 1), abrupt: abrupt, n: len(all)}
		mu.Unlock()
		runs.mu.Lock()
		runs.abrupt[in.n] = abrupt
		runs.mu.Unlock()
		o.test = &hooks.Hooks{Trace: func(kind hooks.TraceKind, ids []int64) { runs.trace(in.n, kind, ids) }, Step: func(site hooks.Site) error {
			defer func() {
				if p := recover(); p != nil {
					runs.event(in.n, "actor panic: "+string(site))
					panic(p)
				}
			}()
			return fault(site)
		}, Panicked: func(actor string, injected bool) {
			if !injected {
				uninjected.Add(1)
			}
		}}
		h := func(ctx context.Context, o *order) error {
			err := handler(ctx, o)
			if err == nil && calm.Load() {
				in.calm.Add(1)
			}
			if err == nil {
				meta, _ := MetaFromContext(ctx)
				runs.add(o.OrderID, successfulRun{attempt: meta.Attempt, inst: in.n, at: time.Now(), msg: meta.ID})
			}
			return err
		}
		go func() { in.done <- c.Consume(ictx, h, &o) }()
		mu.Lock()
		running, all = append(running, in), append(all, in)
		mu.Unlock()
	}
	for i := range 3 {
		start(i == 0)
	}

	// Producers: each message and its ledger row in one transaction.
	var produced atomic.Int64
	produceOne := func(p, i int) {
		id := fmt.Sprintf("p%d-%d", p, i)
		tx, err := control.Begin(ctx)
		if err != nil {
			return // the server is restarting
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+schema+".chaos_ledger (id) VALUES ($1)", id)
		if err == nil {
			// A third unkeyed, a third exclusive, a third ordered, on
			// 200 keys of each kind: ranges and instances contend for
			// them, and the parked messages stay within what the
			// exception path (keyed rows one at a time, ROADMAP.md)
			// drains in a long run.
			po := &ProduceOptions{Tx: tx}
			switch i % 3 {
			case 1:
				po.Key, po.Message = fmt.Sprintf("x%d", i%200), &MessageOptions{Concurrency: Exclusive}
			case 2:
				po.Key, po.Message = fmt.Sprintf("o%d-%d", p, i%100), &MessageOptions{Concurrency: Ordered}
			}
			_, err = s.Produce(ctx, order{OrderID: id}, po)
		}
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(ctx)
		}
		if err == nil {
			produced.Add(1)
		}
	}
	stopProducing := make(chan struct{})
	var producers sync.WaitGroup
	for p := range 2 {
		producers.Add(1)
		go func() {
			defer producers.Done()
			var pace <-chan time.Time // each producer offers half the rate
			if rate > 0 {
				tick := time.NewTicker(2 * time.Second / time.Duration(rate))
				defer tick.Stop()
				pace = tick.C
			}
			for i := 0; ; i++ {
				select {
				case <-stopProducing:
					return
				default:
				}
				if pace != nil {
					select {
					case <-stopProducing:
						return
					case <-pace:
					}
				}
				produceOne(p, i)
			}
		}()
	}

	// The fault injector.
	actorPanics.Store(true)
	deadline := time.After(duration)
	tick := time.NewTicker(300 * time.Millisecond)
inject:
	for {
		select {
		case <-deadline:
			break inject
		case <-tick.C:
		}
		switch roll(11) {
		case 0, 1: // an instance dies without a graceful shutdown; a new one starts
			mu.Lock()
			victim := running[roll(len(running))]
			running = remove(running, victim)
			mu.Unlock()
			victim.cancel()
			if victim.abrupt {
				count("instance killed")
				runs.event(victim.n, "instance killed")
			} else {
				count("instance stopped gracefully")
				runs.event(victim.n, "instance stopped gracefully")
			}
			start(roll(2) == 0)
		case 2: // a graceful restart of an instance
			mu.Lock()
			victim := running[roll(len(running))]
			running = remove(running, victim)
			mu.Unlock()
			victim.cancel()
			count("instance restarted")
			runs.event(victim.n, "instance restarted")
			start(false)
		case 3, 4: // every application connection is cut
			_, err := control.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'chaos-app'")
			if err == nil {
				count("backends terminated")
				runs.event(-1, "backends terminated")
			}
		case 5:
			runs.event(-1, "postgres restarted")
			if err := pgtest.Restart(ctx); err == nil {
				count("postgres restarted")
			} else if !errors.Is(err, pgtest.ErrExternal) {
				t.Fatalf("restart postgres: %v", err)
			}
		case 6: // PostgreSQL stops while a session is being cancelled, for longer than its ShutdownTimeout
			mu.Lock()
			var victim *inst
			for _, in := range running {
				if !in.abrupt {
					victim = in
					break
				}
			}
			if victim != nil {
				running = remove(running, victim)
			}
			mu.Unlock()
			if victim == nil {
				continue
			}
			if err := pgtest.Stop(ctx, "fast"); errors.Is(err, pgtest.ErrExternal) {
				victim.cancel()
				start(false)
				continue
			} else if err != nil {
				t.Fatalf("stop postgres: %v", err)
			}
			runs.event(-1, "postgres stopped")
			runs.event(victim.n, "instance cancelled while postgres was down")
			down := time.NewTimer(2 * opts.ShutdownTimeout) // down for longer than ShutdownTimeout, whatever happens
			cancelled := time.Now()
			victim.cancel()
			budget := time.NewTimer(opts.ShutdownTimeout + ShutdownGrace)
			select {
			case err := <-victim.done:
				victim.done <- err // read again at the end
				count("session cancelled while postgres was down")
			case <-budget.C:
				t.Fatalf("chaos: a session cancelled while PostgreSQL was down had not returned after %s (ShutdownTimeout %s + ShutdownGrace %s)",
					time.Since(cancelled).Round(time.Millisecond), opts.ShutdownTimeout, ShutdownGrace)
			}
			budget.Stop()
			<-down.C
			if err := pgtest.Start(ctx); err != nil {
				t.Fatalf("start postgres: %v", err)
			}
			start(false)
		}
	}
	tick.Stop()
	actorPanics.Store(false)
	close(stopProducing)
	producers.Wait()

	// Every instance still running consumes again: probe messages are
	// produced one at a time until each has handled one since the calm.
	calm.Store(true)
	back := time.After(time.Minute)
	probeTick := time.NewTicker(50 * time.Millisecond)
	defer probeTick.Stop()
	for probe := 0; ; probe++ {
		mu.Lock()
		idle := 0
		for _, in := range running {
			if in.calm.Load() == 0 {
				idle++
			}
		}
		mu.Unlock()
		if idle == 0 {
			break
		}
		produceOne(9, probe)
		select {
		case <-back:
			t.Fatalf("chaos: %d instance(s) never consumed again after the faults stopped", idle)
		case <-probeTick.C:
		}
	}

	// Every produced message ends handled or dead.
	var handled, dead, missing, dups int
	check := func() bool {
		rows, err := control.Query(ctx, fmt.Sprintf(`SELECT l.handled, x.status = 'dead'
FROM %[1]s.chaos_ledger l
JOIN %[1]s.stream_%[2]d_log m ON m.payload->>'order_id' = l.id
LEFT JOIN %[1]s.stream_%[2]d_exception x ON x.group_id = %[3]d AND x.message_id = m.id`, schema, c.group.StreamID, c.group.ID))
		if err != nil {
			return false
		}
		defer rows.Close()
		handled, dead, missing, dups = 0, 0, 0, 0
		for rows.Next() {
			var h int
			var isDead *bool
			if rows.Scan(&h, &isDead) != nil {
				return false
			}
			switch {
			case h > 0:
				handled++
				dups += h - 1
			case isDead != nil && *isDead:
				dead++
			default:
				missing++
			}
		}
		return rows.Err() == nil && missing == 0
	}
	// The backlog drains after the faults stop. A run fails when the count
	// of settled messages stops moving for two minutes, not when a long
	// run's backlog takes longer than that to drain.
	const stuckAfter = 2 * time.Minute
	stuck := time.NewTimer(stuckAfter)
	defer stuck.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	settled := -1
	calmAt := time.Now()
	defer func() {
		t.Logf("chaos: the backlog drained %s after the faults stopped", time.Since(calmAt).Round(time.Second))
	}()
	for !check() {
		if handled+dead > settled {
			settled = handled + dead
			stuck.Reset(stuckAfter)
		}
		if os.Getenv("SQLSTREAMS_CHAOS_PROGRESS") != "" && int(time.Since(calmAt).Seconds())%10 == 0 {
			var summary string
			_ = control.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(format('%%s/%%s=%%s', concurrency, status, n), ' '), '')
FROM (SELECT concurrency, status, count(*) n FROM %s.stream_%d_exception GROUP BY 1, 2 ORDER BY 1, 2) s`, schema, c.group.StreamID)).Scan(&summary)
			t.Logf("chaos: drain %s: handled %d, dead %d, left %d; exception rows: %s", time.Since(calmAt).Round(time.Second), handled, dead, missing, summary)
		}
		select {
		case <-stuck.C:
			chaosDiagnose(t, ctx, control, schema, c.group.StreamID, c.group.ID)
			t.Fatalf("chaos: %d produced, %d handled, %d dead, %d missing, and no progress for %s", produced.Load(), handled, dead, missing, stuckAfter)
		case <-poll.C:
		}
	}
	close(stopAll)

	mu.Lock()
	for _, in := range all {
		in.cancel()
	}
	mu.Unlock()
	for _, in := range all {
		select {
		case err := <-in.done:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("an instance did not return")
		}
	}
	pool.Close()
	var report []string
	faults.Range(func(k, v any) bool {
		report = append(report, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("chaos: produced %d, handled %d, dead %d, missing %d, duplicates %d (%.1f%%), deadlocks %d; faults: %s",
		produced.Load(), handled, dead, missing, dups, 100*float64(dups)/float64(max(produced.Load(), 1)), deadlocks.n.Load(), strings.Join(report, " "))
	st := c.Stats()
	firstAgain, retryAgain := runs.repeats()
	t.Logf("chaos: repeated successful runs as seen by handlers: %d on the range path (attempt 1 again), %d on the exception path; "+
		"ranges reclaimed %d, committed %d, progress records %d, leases lost %d, handlers abandoned %d",
		firstAgain, retryAgain, st.Reclaimed, st.Committed, st.ProgressRecorded, st.LeasesLost, st.Abandoned)
	t.Logf("chaos: each repeated successful run by the first event between it and the run before it "+
		"(the earlier run's instance, or the whole database): %s", runs.causes(logWarnings(sink)))
	require.Positive(t, produced.Load())
	require.Zero(t, missing)
	require.Zero(t, uninjected.Load(), "actor panics that no hook injected (the log has their stacks, SQL0401)")
	require.Zero(t, deadlocks.n.Load(), "statements that hit `deadlock detected`: the lock order (internal/store/locks.go) is broken")

	// Unexpected: a message without its ledger row (a rolled-back producer's
	// message that was delivered anyway) or a ledger row without its message.
	var unexpected int
	require.NoError(t, control.QueryRow(ctx, fmt.Sprintf(`SELECT
  (SELECT count(*) FROM %[1]s.stream_%[2]d_log m WHERE NOT EXISTS (SELECT 1 FROM %[1]s.chaos_ledger l WHERE l.id = m.payload->>'order_id'))
+ (SELECT count(*) FROM %[1]s.chaos_ledger l WHERE NOT EXISTS (SELECT 1 FROM %[1]s.stream_%[2]d_log m WHERE m.payload->>'order_id' = l.id))`,
		schema, c.group.StreamID)).Scan(&unexpected))
	require.Zero(t, unexpected, "messages without a ledger row, or ledger rows without a message")

	// No goroutine of ours outlives the sessions.
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "github.com/c1702965/sqlstreams/actors") || strings.Contains(g, "github.com/c1702965/sqlstreams/engine") {
			t.Errorf("goroutine left behind:\n%s", g)
		}
	}
}

func remove[T comparable](s []T, v T) []T {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

// chaosDiagnose prints, for each missing message, where the engine last saw
// it: inside an outstanding range, an exception row, beyond the cursor head.
func chaosDiagnose(t *testing.T, ctx context.Context, control *pgxpool.Pool, schema string, streamID, groupID int64) {
	rows, err := control.Query(ctx, fmt.Sprintf(`SELECT l.id, m.xid, m.id, coalesce(m.message_key, ''),
  (SELECT format('head=(%%s,%%s)', c.head_xid, c.head_id) FROM %[1]s.stream_%[2]d_cursor c WHERE c.group_id = %[3]d),
  (SELECT string_agg(format('range %%s owner=%%s live=%%s exp=%%s reclaims=%%s', r.id, r.owner,
      EXISTS (SELECT 1 FROM %[1]s.worker_instance w WHERE w.id = r.owner AND w.expires_at > now()), r.expires_at - now(), r.reclaims), '; ')
   FROM %[1]s.stream_%[2]d_range r WHERE r.group_id = %[3]d AND (m.xid, m.id) > (r.lo_xid, r.lo_id) AND (m.xid, m.id) <= (r.hi_xid, r.hi_id)),
  (SELECT format('exception status=%%s attempts=%%s owner=%%s live=%%s exp=%%s due=%%s', x.status, x.attempts, x.owner,
      EXISTS (SELECT 1 FROM %[1]s.worker_instance w WHERE w.id = x.owner AND w.expires_at > now()), x.expires_at - now(), x.can_run_after - now())
   FROM %[1]s.stream_%[2]d_exception x WHERE x.group_id = %[3]d AND x.message_id = m.id),
  (SELECT string_agg(format('keylease owner=%%s', k.owner), '; ') FROM %[1]s.stream_%[2]d_key_lease k WHERE k.group_id = %[3]d AND k.message_key = m.message_key)
FROM %[1]s.chaos_ledger l
JOIN %[1]s.stream_%[2]d_log m ON m.payload->>'order_id' = l.id
LEFT JOIN %[1]s.stream_%[2]d_exception x ON x.group_id = %[3]d AND x.message_id = m.id
WHERE l.handled = 0 AND (x.status IS NULL OR x.status <> 'dead')
ORDER BY m.xid, m.id LIMIT 50`, schema, streamID, groupID))
	if err != nil {
		t.Logf("diagnose: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id, key string
		var xid, mid int64
		var head, rng, exc, kl *string
		if err := rows.Scan(&id, &xid, &mid, &key, &head, &rng, &exc, &kl); err != nil {
			t.Logf("diagnose: %v", err)
			return
		}
		str := func(p *string) string {
			if p == nil {
				return "-"
			}
			return *p
		}
		t.Logf("missing %s at (%d,%d) key=%q %s | %s | %s | %s", id, xid, mid, key, str(head), str(rng), str(exc), str(kl))
	}
	ranges, err := control.Query(ctx, fmt.Sprintf(`SELECT format('range %%s (%%s,%%s]-(%%s,%%s] owner=%%s exp=%%s reclaims=%%s', id, lo_xid, lo_id, hi_xid, hi_id, owner, expires_at - now(), reclaims)
FROM %[1]s.stream_%[2]d_range WHERE group_id = %[3]d ORDER BY id`, schema, streamID, groupID))
	if err == nil {
		defer ranges.Close()
		for ranges.Next() {
			var s string
			if ranges.Scan(&s) == nil {
				t.Logf("%s", s)
			}
		}
	}
}

// deadlockCounter counts the application's statements (single or batched)
// that PostgreSQL aborted with deadlock_detected.
type deadlockCounter struct{ n atomic.Int64 }

func (d *deadlockCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (d *deadlockCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if isDeadlock(data.Err) {
		d.n.Add(1)
	}
}

func (d *deadlockCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (d *deadlockCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if isDeadlock(data.Err) {
		d.n.Add(1)
	}
}

func (d *deadlockCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// successfulRuns records, per message, each handler run that succeeded
// (its attempt, instance and time), and the faults with their times: where
// the chaos run's duplicates come from.
type successfulRuns struct {
	mu     sync.Mutex
	byID   map[string][]successfulRun
	events []chaosEvent
	// fates holds, per message id, what the claimers said became of its
	// outcomes (claimer.Common.Trace).
	fates map[int64][]fate
	// abrupt marks the instances started with DisableGracefulShutdown.
	abrupt map[int]bool
}

type successfulRun struct {
	attempt int
	inst    int
	at      time.Time
	msg     int64
}

type fate struct {
	at   time.Time
	inst int
	kind hooks.TraceKind
}

func (r *successfulRuns) trace(inst int, kind hooks.TraceKind, ids []int64) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fates == nil {
		r.fates = map[int64][]fate{}
	}
	for _, id := range ids {
		r.fates[id] = append(r.fates[id], fate{at: now, inst: inst, kind: kind})
	}
}

// fateOf says what became of a successful run's outcome before the message
// ran again: written (by any instance: then the repeat is the engine's
// bug), lost with its lease at the write, applied but never written,
// dropped by its actor, or never handed to it.
func (r *successfulRuns) fateOf(prev, cur successfulRun) string {
	// The earlier run's own instance's events count, and after its
	// outcome was adopted, the adopter's; a write by a third instance is
	// of a later attempt (a failure), not of this outcome.
	seen := map[hooks.TraceKind]bool{}
	for _, f := range r.fates[prev.msg] {
		if f.at.Before(prev.at) || f.at.After(cur.at) {
			continue
		}
		if f.inst == prev.inst || f.kind == hooks.TraceAdopted || (seen[hooks.TraceAdopted] && (f.kind == hooks.TraceRecorded || f.kind == hooks.TraceLost)) {
			seen[f.kind] = true
		}
	}
	switch {
	case seen[hooks.TraceRecorded]:
		return "written, delivered again"
	case seen[hooks.TraceLost] && seen[hooks.TraceAdopted]:
		return "left, adopted, lease lost at the write"
	case seen[hooks.TraceLost]:
		return "lease lost at the write"
	case seen[hooks.TraceAdopted]:
		return "left, adopted, never written"
	case seen[hooks.TraceLeft]:
		return "left, never adopted"
	case seen[hooks.TraceAbandoned] && r.abrupt[prev.inst]:
		return "abandoned by an abrupt stop"
	case seen[hooks.TraceAbandoned]:
		return "abandoned by a graceful session's stop"
	case seen[hooks.TraceApplied]:
		return "applied, never written"
	case seen[hooks.TraceDropped]:
		return "dropped by its actor"
	}
	return "never reached its actor"
}

// chaosEvent is a fault at a time, in one instance (inst) or everywhere (-1).
type chaosEvent struct {
	at   time.Time
	inst int
	kind string
}

func (r *successfulRuns) add(id string, run successfulRun) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byID[id] = append(r.byID[id], run)
}

func (r *successfulRuns) event(inst int, kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, chaosEvent{at: time.Now(), inst: inst, kind: kind})
}

// repeats counts the successful runs after a message's first, by the path
// that ran them again: attempt 1 (a range delivered again: a reclaim or a
// hand-back) or a later attempt (an exception row run again).
func (r *successfulRuns) repeats() (rangePath, exceptionPath int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, runs := range r.byID {
		for _, run := range runs[1:] {
			if run.attempt <= 1 {
				rangePath++
			} else {
				exceptionPath++
			}
		}
	}
	return rangePath, exceptionPath
}

// causePriority orders the faults that can make a message run again, the
// surest cause first: a repeat is put down to the first of these that
// happened between it and the run before it (to that run's instance, or to
// the whole database).
var causePriority = []string{"instance killed", "instance cancelled while postgres was down", "instance stopped gracefully",
	"instance restarted", "log: instance lapsed", "actor panic: claimer", "actor panic: exceptions", "postgres stopped",
	"postgres restarted", "backends terminated"}

// causes attributes each repeated run (see causePriority) and counts them
// by path and cause; it also counts the warnings by message.
func (r *successfulRuns) causes(warnings []chaosEvent) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	events := append(append([]chaosEvent(nil), r.events...), warnings...)
	sort.Slice(events, func(i, j int) bool { return events[i].at.Before(events[j].at) })
	rank := func(kind string) int {
		for i, k := range causePriority {
			if strings.HasPrefix(kind, k) {
				return i
			}
		}
		return -1
	}
	tally, gaps, places, fates := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	for _, runs := range r.byID {
		for k := 1; k < len(runs); k++ {
			prev, cur := runs[k-1], runs[k]
			best := len(causePriority)
			for _, e := range events {
				if e.at.Before(prev.at) || (e.inst >= 0 && e.inst != prev.inst) {
					continue
				}
				if e.at.After(cur.at) {
					break
				}
				if i := rank(e.kind); i >= 0 && i < best {
					best = i
				}
			}
			cause := "no fault in between"
			if best < len(causePriority) {
				cause = causePriority[best]
			}
			path := "range"
			if cur.attempt > 1 {
				path = "exception"
			}
			tally[path+"/"+cause]++
			fates[r.fateOf(prev, cur)+" / "+cause]++
			// How long after the first run, and where, the repeat ran (a
			// repeat within a flush tick of its first run is a different
			// story from one a lease later).
			gap := cur.at.Sub(prev.at)
			bucket := ">5s"
			for _, b := range []struct {
				under time.Duration
				name  string
			}{{100 * time.Millisecond, "<100ms"}, {500 * time.Millisecond, "<500ms"}, {2 * time.Second, "<2s"}, {5 * time.Second, "<5s"}} {
				if gap < b.under {
					bucket = b.name
					break
				}
			}
			where := "another instance"
			if cur.inst == prev.inst {
				where = "the same instance"
			}
			gaps[cause+" "+bucket]++
			places[where]++
		}
	}
	logged := map[string]int{}
	for _, w := range warnings {
		logged[w.kind]++
	}
	return sortedCounts(tally) + "; by fault and time after the run before it: " + sortedCounts(gaps) + "; on " + sortedCounts(places) +
		"; by what became of the earlier run's outcome, and fault: " + sortedCounts(fates) +
		"; warnings: " + sortedCounts(logged)
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || (m[keys[i]] == m[keys[j]] && keys[i] < keys[j]) })
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(out, " ")
}

// logWarnings returns the WARN and ERROR lines s logged so far as database-wide
// chaos events (the log does not say which session wrote them).
func logWarnings(s *actortest.Logs) []chaosEvent {
	var out []chaosEvent
	for _, r := range s.Records() {
		if r.Level >= slog.LevelWarn {
			msg := r.Message
			if len(msg) > 60 {
				msg = msg[:60]
			}
			out = append(out, chaosEvent{at: r.Time, inst: -1, kind: "log: " + msg})
		}
	}
	return out
}
