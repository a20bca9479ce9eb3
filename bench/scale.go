package main

// Scale (-only scale; make bench-scale): many streams and many groups, the
// shape of a large deployment rather than a fast one (issue 22, target 4).
//
//  1. Registering -scale-streams streams, then a group per stream: how long
//     each takes, and what the catalog holds afterwards (tables, indexes,
//     relations with a file, bytes on disk).
//  2. Idle: -scale-groups groups on each of those streams (2,000 over 1,000
//     by default), one Consume session each, spread over -scale-processes
//     clients with their own pools (processes), and nothing produced for
//     -scale-idle: the server CPU that costs, as a share of one core.
//  3. Spread: -scale-n messages produced (ProduceBatch, 100 a call, 4
//     goroutines) round-robin over the streams, then burnt down by one
//     session per stream; and the same volume on one stream, burnt down by
//     -scale-processes sessions. The ratios of the two. The burn-down is
//     timed twice (decision 0041): by sessions starting on the backlog
//     (their start included), then by the same sessions, running, on the
//     same volume again made visible at once by one transaction's commit.
//     The target's ratio is the running one's.
//
// Run only when named, like capacity: its sizes are its own.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// scaleSettle is how long the idle window begins after the warm-up (one
// message to each stream, to see every session deliver): one reconcile
// tick at the default InstanceTTL, and a second, in which each session lets
// go of what its warm-up claim took and turns quiet (decisions 0038, 0040).
// The window measures idle sessions, not the warm-up's tail.
const scaleSettle = sqlstreams.DefaultInstanceTTL/3 + time.Second

// scaleResult is the scale workload's report section.
type scaleResult struct {
	Streams   int `json:"streams"`
	Groups    int `json:"groups_per_stream"`
	Processes int `json:"processes"`
	// Registration.
	RegisterStreamsSeconds float64 `json:"register_streams_s"`
	RegisterGroupsSeconds  float64 `json:"register_groups_s"`
	Tables                 int     `json:"tables"`
	Indexes                int     `json:"indexes"`
	Files                  int     `json:"relations_with_files"`
	Bytes                  int64   `json:"bytes_on_disk"`
	// Idle.
	IdleSessions      int     `json:"idle_sessions"`
	IdleSeconds       float64 `json:"idle_seconds"`
	IdleServerCore    float64 `json:"idle_server_share_of_one_core"`
	IdleClientCore    float64 `json:"idle_client_share_of_one_core"`
	IdleConnsPerProc  float64 `json:"idle_connections_per_process"`
	IdleServerPerSess float64 `json:"idle_server_us_per_session_second"`
}

func (b *bench) scale(ctx context.Context) error {
	S, G, P := b.c.scaleStreams, b.c.scaleGroups, b.c.scaleProcesses
	res := &scaleResult{Streams: S, Groups: G, Processes: P}
	b.rep.Scale = res
	fmt.Printf("scale: %d streams, %d groups each, %d processes; idle for %s (from %s after the warm-up); spread %d messages\n", S, G, P, b.c.scaleIdle, scaleSettle, b.c.scaleN)

	// 1. Registration, on the benchmark's pool.
	client, err := sqlstreams.NewClient(ctx, b.pool, b.clientConfig())
	if err != nil {
		return err
	}
	before, err := b.catalog(ctx)
	if err != nil {
		return err
	}
	const prefix = "scale"
	// P registering goroutines, as P processes starting together would
	// register their streams: each stream's templates run under its own
	// advisory lock, so they do not wait on each other.
	start := wall.Now()
	if err := eachOf(S, P, func(i int) error {
		if err := sqlstreams.Stream[Order](client, fmt.Sprintf("bench.%s.s%d", prefix, i)).Register(ctx, nil); err != nil {
			return fmt.Errorf("register stream %d: %w", i, err)
		}
		return nil
	}); err != nil {
		return err
	}
	res.RegisterStreamsSeconds = wall.Since(start).Seconds()
	start = wall.Now()
	if err := eachOf(S, P, func(i int) error {
		s := sqlstreams.Stream[Order](client, fmt.Sprintf("bench.%s.s%d", prefix, i))
		for g := range G {
			if _, err := s.Consumer(fmt.Sprintf("%s-s%d-g%d", prefix, i, g)).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartHead}); err != nil {
				return fmt.Errorf("register group %d of stream %d: %w", g, i, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	res.RegisterGroupsSeconds = wall.Since(start).Seconds()
	after, err := b.catalog(ctx)
	if err != nil {
		return err
	}
	res.Tables, res.Indexes, res.Files, res.Bytes = after.tables-before.tables, after.indexes-before.indexes, after.files-before.files, after.bytes-before.bytes
	fmt.Printf("  registered %d streams in %.1f s and %d groups in %.1f s (%d goroutines); the catalog gained %d tables, %d indexes, %d relations with files, %.1f MB\n",
		S, res.RegisterStreamsSeconds, S*G, res.RegisterGroupsSeconds, P, res.Tables, res.Indexes, res.Files, float64(res.Bytes)/1e6)

	// 2. Idle: the same streams and groups (capacityWindow's registrations
	// are then re-declarations of the same config).
	run, err := b.capacityWindow(ctx, prefix, capacityScenario{processes: P, streams: S, groups: G, sessionsPerGroup: 1, idle: true, settle: scaleSettle}, 0, b.c.scaleIdle)
	if err != nil {
		return fmt.Errorf("scale idle: %w", err)
	}
	res.IdleSessions, res.IdleSeconds, res.IdleConnsPerProc, res.IdleServerPerSess = run.Sessions, run.Seconds, run.ConnsPerProcess, run.ServerCPUus
	sessSeconds := float64(run.Sessions) * run.Seconds
	res.IdleServerCore = run.ServerCPUus * sessSeconds / 1e6 / run.Seconds
	res.IdleClientCore = run.ClientCPUus * sessSeconds / 1e6 / run.Seconds
	fmt.Printf("  idle: %d sessions for %.0f s: server %.1f%% of one core (%.0f µs a session-second), clients %.1f%%; %.1f connections a process\n",
		run.Sessions, run.Seconds, 100*res.IdleServerCore, run.ServerCPUus, 100*res.IdleClientCore, run.ConnsPerProcess)

	// 3. Spread against one stream, each -runs times.
	prodMany := b.rep.throughput("scale_produce_many", fmt.Sprintf("ProduceBatch over %d streams (100 a call, round-robin)", S), "msg/s")
	prodOne := b.rep.throughput("scale_produce_one", "ProduceBatch to 1 stream (100 a call)", "msg/s")
	burnMany := b.rep.throughput("scale_burndown_many", fmt.Sprintf("burn-down over %d streams, 1 running session each, %d processes", S, P), "msg/s")
	burnOne := b.rep.throughput("scale_burndown_one", fmt.Sprintf("burn-down of 1 stream, %d running sessions, %d processes", P, P), "msg/s")
	coldMany := b.rep.throughput("scale_burndown_many_cold", fmt.Sprintf("burn-down over %d streams by sessions starting on it (their start timed), %d processes", S, P), "msg/s")
	coldOne := b.rep.throughput("scale_burndown_one_cold", fmt.Sprintf("burn-down of 1 stream by %d sessions starting on it, %d processes", P, P), "msg/s")
	for r := 1; r <= b.c.runs; r++ {
		for _, v := range []struct {
			streams, sessions int
			prod, burn, cold  *throughputResult
		}{{S, 1, prodMany, burnMany, coldMany}, {1, P, prodOne, burnOne, coldOne}} {
			label := fmt.Sprintf("scale %d stream(s) run %d/%d", v.streams, r, b.c.runs)
			p, c, d, cpu, err := b.spread(ctx, fmt.Sprintf("sp%d_%d_", v.streams, r), v.streams, v.sessions, label)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			v.prod.add(label, p)
			v.cold.add(label, c)
			v.burn.addCPU(cpu.before, cpu.after, cpu.ok, cpu.units)
			v.burn.add(label, d)
		}
	}
	return nil
}

type catalogCount struct {
	tables, indexes, files int
	bytes                  int64
}

// eachOf runs f(0..n-1) on workers goroutines and returns the first error
// (the others stop taking work).
func eachOf(n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					next.Store(int64(n)) // the others stop
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// catalog counts the benchmark schema's relations and their size on disk.
func (b *bench) catalog(ctx context.Context) (c catalogCount, err error) {
	err = b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE c.relkind IN ('r', 'p')),
  count(*) FILTER (WHERE c.relkind IN ('i', 'I')),
  count(*) FILTER (WHERE c.relkind IN ('r', 'i', 't', 'S', 'm')),
  coalesce(sum(pg_relation_size(c.oid)), 0)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'sqlstreams_bench' OR (c.relkind = 't' AND n.nspname = 'pg_toast')`).Scan(&c.tables, &c.indexes, &c.files, &c.bytes)
	return c, err
}

// spread produces -scale-n messages round-robin over streams fresh streams,
// then times their burn-down twice by sessions sessions per stream's group
// spread over -scale-processes clients: cold, by sessions that start on the
// backlog (their Register and start are timed with it), and running, by the
// same sessions once the backlog's first round is done: the same volume is
// produced again in one transaction, untimed, and the burn-down is timed from
// its commit (decision 0041). It returns the three rates, and the CPU the
// server and this process (every client) used in the running round.
func (b *bench) spread(ctx context.Context, prefix string, streams, sessions int, label string) (produce, cold, running float64, cpu cpuWindow, err error) {
	n := b.c.scaleN
	// The producer's own pool counts its prepares: a stream's insert is
	// prepared once per connection, and over many streams most produce
	// calls meet a stream new to their connection.
	pcfg := b.pool.Config()
	prepares := &prepareCounter{}
	pcfg.ConnConfig.Tracer = prepares
	ppool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, 0, 0, cpu, err
	}
	defer ppool.Close()
	producer, err := sqlstreams.NewClient(ctx, ppool, b.clientConfig())
	if err != nil {
		return 0, 0, 0, cpu, err
	}
	handles := make([]*sqlstreams.StreamHandle[Order], streams)
	for i := range handles {
		handles[i] = sqlstreams.Stream[Order](producer, fmt.Sprintf("bench.%s.s%d", prefix, i))
		if err := handles[i].Register(ctx, nil); err != nil {
			return 0, 0, 0, cpu, err
		}
		if _, err := handles[i].Consumer(fmt.Sprintf("%sg%d", prefix, i)).Register(ctx, nil); err != nil {
			return 0, 0, 0, cpu, err
		}
	}
	items := make([]sqlstreams.BatchItem[Order], produceBatchLen)
	for i := range items {
		items[i].Msg = baseOrder
	}
	calls := (n + produceBatchLen - 1) / produceBatchLen
	b.checkpoint(ctx)
	fresh0, again0, took0 := prepares.fresh.Load(), prepares.again.Load(), prepares.ns.Load()
	if err := b.windowStart(ctx, true); err != nil { // what the produce itself runs
		return 0, 0, 0, cpu, err
	}
	av0 := b.autovacuums(ctx)
	w0, wok := b.walNow(ctx)
	pc0, _ := b.cpuNow(ctx)
	start := wall.Now()
	if err := eachCall(calls, func(c int) error {
		_, err := handles[c%streams].ProduceBatch(ctx, items, nil)
		return err
	}); err != nil {
		return 0, 0, 0, cpu, err
	}
	total := calls * produceBatchLen
	produce = report1(label+" produce", "msgs", total, wall.Since(start))
	if pc1, ok := b.cpuNow(ctx); ok {
		fmt.Printf("  %-34s the produce's CPU a message: %s\n", "", pc0.perMessage(pc1, total))
	}
	if w1, ok := b.walNow(ctx); ok && wok {
		fmt.Printf("  %-34s the produce's WAL a message: %s\n", "", w0.perMessage(w1, total))
	}
	if av := autovacuumed(av0, b.autovacuums(ctx)); len(av) > 0 {
		fmt.Printf("  %-34s autovacuumed or autoanalyzed during the produce: %d tables\n", "", len(av))
	}
	fmt.Printf("  %-34s prepares: %d new to their connection (%.2f s in them, all workers), %d already prepared\n", "",
		prepares.fresh.Load()-fresh0, float64(prepares.ns.Load()-took0)/1e9, prepares.again.Load()-again0)
	if err := b.windowEnd(ctx, label+", the produce's statements"); err != nil {
		return 0, 0, 0, cpu, err
	}

	// The consumers: one client (pool) per process.
	var pools []*pgxpool.Pool
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	var clients []*sqlstreams.Client
	// The consumers' pools count their prepares too: over many streams a
	// connection's statement cache (pgx's, 512 texts by default) may not
	// hold what its claimers run in turn (printed for the running round).
	cprepares := &prepareCounter{}
	for range b.c.scaleProcesses {
		cfg := b.pool.Config()
		cfg.MaxConns = 16
		if b.c.stmtCache > 0 {
			cfg.ConnConfig.StatementCacheCapacity = b.c.stmtCache
		}
		cfg.ConnConfig.Tracer = cprepares
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return 0, 0, 0, cpu, err
		}
		pools = append(pools, p)
		c, err := sqlstreams.NewClient(ctx, p, b.clientConfig())
		if err != nil {
			return 0, 0, 0, cpu, err
		}
		clients = append(clients, c)
	}
	b.checkpoint(ctx)
	var handled atomic.Int64
	done, again := make(chan struct{}), make(chan struct{}) // the first round handled, the second
	var once, onceAgain sync.Once
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, streams*sessions)
	stop := progress(label+" burn-down", "msgs", int64(total), &handled)
	start = wall.Now()
	// When every session had its first message: how much of the burn-down
	// was the sessions' start (a thousand sessions register and begin; the
	// one stream's four do not). Printed, not subtracted.
	allUp := make(chan struct{})
	var up atomic.Int64
	var upAfter atomic.Int64 // ns
	// Each process (client) starts its share of the sessions, as P
	// processes would at once: a session's Register is a few committed
	// statements, and one goroutine starting a thousand of them in turn
	// would time its own fsyncs.
	err = eachOf(streams*sessions, len(clients), func(k int) error {
		i := k / sessions
		cons, err := sqlstreams.Stream[Order](clients[k%len(clients)], fmt.Sprintf("bench.%s.s%d", prefix, i)).Consumer(fmt.Sprintf("%sg%d", prefix, i)).Register(ctx, nil)
		if err != nil {
			return err
		}
		wg.Add(1)
		var first atomic.Bool
		go func() {
			defer wg.Done()
			errs <- cons.Consume(cctx, func(context.Context, *Order) error {
				if !first.Swap(true) && up.Add(1) == int64(streams*sessions) {
					upAfter.Store(int64(wall.Since(start)))
					close(allUp)
				}
				switch handled.Add(1) {
				case int64(total):
					once.Do(func() { close(done) })
				case 2 * int64(total):
					onceAgain.Do(func() { close(again) })
				}
				return nil
			}, nil)
		}()
		return nil
	})
	if err != nil {
		cancel()
		wg.Wait()
		stop()
		return 0, 0, 0, cpu, err
	}
	startedAfter := wall.Since(start) // every Register returned and every Consume was called
	var failed error
	select {
	case <-done:
	case <-after(burnTimeout):
		failed = fmt.Errorf("timed out after %s with %d of %d handled", burnTimeout, handled.Load(), total)
	case <-ctx.Done():
		failed = ctx.Err()
	}
	elapsed := wall.Since(start)
	stop()
	var againAfter time.Duration
	if failed == nil {
		fresh0, again0 := cprepares.fresh.Load(), cprepares.again.Load()
		cprepares.freshByCaller()
		printPoolStats("the consumers' pools after the cold round", pools)
		againAfter, cpu, failed = b.spreadAgain(ctx, handles, items, calls, &handled, again, label)
		fmt.Printf("  %-34s the running round's consumer prepares: %d new to their connection, %d already prepared; new, by caller:\n", "",
			cprepares.fresh.Load()-fresh0, cprepares.again.Load()-again0)
		printFresh(cprepares.freshByCaller())
		printPoolStats("the consumers' pools after the running round", pools)
		if b.c.statements {
			b.backendMemory(ctx, "after the running round")
		}
	}
	cancel()
	wg.Wait()
	close(errs)
	for e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) && failed == nil {
			failed = e
		}
	}
	if failed != nil {
		return 0, 0, 0, cpu, failed
	}
	cold = report1(label+" burn-down, cold", "msgs", total, elapsed)
	select {
	case <-allUp:
		fmt.Printf("  %-34s every one of the %d session(s) had its first message after %.2f s (the last was started at %.2f s)\n", "", streams*sessions, float64(upAfter.Load())/1e9, startedAfter.Seconds())
	default:
		fmt.Printf("  %-34s %d of the %d session(s) had a message\n", "", up.Load(), streams*sessions)
	}
	running = report1(label+" burn-down, running", "msgs", total, againAfter)
	if cpu.ok {
		fmt.Printf("  %-34s the running burn-down's CPU a message: %s\n", "", cpu.before.perMessage(cpu.after, cpu.units))
	}
	return produce, cold, running, cpu, nil
}

// spreadAgain is spread's second round: with every session running (and,
// after the first round, idle), it produces the same calls again in one
// transaction, untimed, and times from its commit until the sessions have
// handled them (again closes). A transaction makes the whole backlog
// visible at once, as a backlog that built up while the sessions ran is.
// The CPU readings bracket the same window.
func (b *bench) spreadAgain(ctx context.Context, handles []*sqlstreams.StreamHandle[Order], items []sqlstreams.BatchItem[Order], calls int, handled *atomic.Int64, again <-chan struct{}, label string) (time.Duration, cpuWindow, error) {
	cpu := cpuWindow{units: calls * len(items)}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, cpu, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after the commit
	for c := range calls {
		if _, err := handles[c%len(handles)].ProduceBatch(ctx, items, &sqlstreams.BatchOptions{Tx: tx}); err != nil {
			return 0, cpu, err
		}
	}
	total := int64(cpu.units)
	// The backlog's pages are written out before the round, as a backlog
	// that built up while the sessions ran would have been by the
	// checkpointer and background writer: otherwise the round whose working
	// set outgrows shared buffers pays for the producer's writes as it
	// evicts them (over 1,000 streams at 256 MB, 26,673 of them in the
	// lease statement alone), and the round whose backlog fits never does.
	// b.checkpoint's rule for every timed run, without its VACUUM (which
	// would set the visibility map the round's scans otherwise check).
	// Without the privilege the step is skipped, as there.
	_, _ = b.pool.Exec(ctx, "CHECKPOINT")
	if err := b.windowStart(ctx, true); err != nil { // what the running round itself runs
		return 0, cpu, err
	}
	stopPerf, err := b.perfStart(label)
	if err != nil {
		return 0, cpu, err
	}
	defer stopPerf()
	cpu.before, cpu.ok = b.cpuNow(ctx)
	start := wall.Now()
	if err := tx.Commit(ctx); err != nil {
		return 0, cpu, err
	}
	select {
	case <-again:
		took := wall.Since(start)
		stopPerf()
		var ok bool
		cpu.after, ok = b.cpuNow(ctx)
		cpu.ok = cpu.ok && ok
		return took, cpu, b.windowEnd(ctx, label+", the running round's statements")
	case <-after(burnTimeout):
		return 0, cpu, fmt.Errorf("%s, running sessions: timed out after %s with %d of %d handled", label, burnTimeout, handled.Load()-total, total)
	case <-ctx.Done():
		return 0, cpu, ctx.Err()
	}
}

// cpuWindow is a window's CPU readings (cpuNow at its start and end).
type cpuWindow struct {
	before, after cpuTimes
	ok            bool // the server's CPU was readable at both ends
	units         int  // the messages the window handled
}

// prepareCounter counts a pool's prepares: those a connection had not
// prepared yet (a round trip, and the time in it) and those it had.
type prepareCounter struct {
	fresh, again, ns atomic.Int64
	mu               sync.Mutex
	byCaller         map[string]int64 // fresh prepares by the statement's first line (its caller)
}

type prepareStarted struct{ sql string }

// freshByCaller returns the fresh prepares by caller and starts counting
// afresh.
func (p *prepareCounter) freshByCaller() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.byCaller
	p.byCaller = nil
	return m
}

// printFresh prints the callers with the most fresh prepares.
func printFresh(m map[string]int64) {
	type kv struct {
		k string
		v int64
	}
	var all []kv
	for k, v := range m {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	for i, e := range all {
		if i == 8 {
			break
		}
		fmt.Printf("  %-34s %7d  %s\n", "", e.v, e.k)
	}
}

func (p *prepareCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (p *prepareCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *prepareCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	return context.WithValue(context.WithValue(ctx, prepareStarted{}, wall.Now()), prepareStarted{sql: "sql"}, d.SQL)
}
func (p *prepareCounter) TracePrepareEnd(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if d.AlreadyPrepared {
		p.again.Add(1)
		return
	}
	p.fresh.Add(1)
	if sql, ok := ctx.Value(prepareStarted{sql: "sql"}).(string); ok {
		caller, _, _ := strings.Cut(sql, "\n")
		p.mu.Lock()
		if p.byCaller == nil {
			p.byCaller = map[string]int64{}
		}
		p.byCaller[caller]++
		p.mu.Unlock()
	}
	if t, ok := ctx.Value(prepareStarted{}).(time.Time); ok {
		p.ns.Add(int64(wall.Since(t)))
	}
}

// backendMemory prints the private memory of the database's client backends
// (RssAnon in /proc: the caches, prepared statements and plans each builds
// for itself), largest first, when the server runs on this machine: what the
// consumers' connections hold after the running round.
func (b *bench) backendMemory(ctx context.Context, label string) {
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_catalog.pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	if err != nil {
		return
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return
	}
	var kbs []int64
	var total int64
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return // not this machine's
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
				var kb int64
				fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
				kbs = append(kbs, kb)
				total += kb
			}
		}
	}
	if len(kbs) == 0 {
		return
	}
	sort.Slice(kbs, func(i, j int) bool { return kbs[i] > kbs[j] })
	top := kbs[:min(6, len(kbs))]
	fmt.Printf("  %-34s %s: %d client backends, private memory %.1f MB in all; the largest (MB):", "", label, len(kbs), float64(total)/1024)
	for _, kb := range top {
		fmt.Printf(" %.1f", float64(kb)/1024)
	}
	fmt.Println()
}

// perfStart starts Linux perf recording the whole machine (-perf-server) and
// returns what stops it and waits for it (idempotent); without the flag both
// do nothing.
func (b *bench) perfStart(label string) (func(), error) {
	name := strings.NewReplacer(" ", "_", "/", "of", "(", "", ")", "").Replace(label)
	if b.c.roundProfile != "" {
		out := fmt.Sprintf("%s-%s.pprof", b.c.roundProfile, name)
		f, err := os.Create(out)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("round profile: %w", err)
		}
		var once sync.Once
		return func() {
			once.Do(func() {
				pprof.StopCPUProfile()
				_ = f.Close()
				fmt.Printf("  %-34s Go CPU profile: %s\n", "", out)
			})
		}, nil
	}
	if b.c.perfServer == "" {
		return func() {}, nil
	}
	out := fmt.Sprintf("%s-%s.data", b.c.perfServer, name)
	cmd := exec.Command("perf", "record", "-a", "-g", "-F", "499", "-o", out)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf record: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			fmt.Printf("  %-34s perf: %s\n", "", out)
		})
	}, nil
}

// printPoolStats prints pools' connection counts, summed: how many
// connections they opened (a connection new to a stream prepares its
// statements afresh) and how often an acquire found none idle.
func printPoolStats(when string, pools []*pgxpool.Pool) {
	var total, opened, acquires, empty, canceled, lifetime, idle int64
	for _, p := range pools {
		st := p.Stat()
		total += int64(st.TotalConns())
		opened += st.NewConnsCount()
		acquires += st.AcquireCount()
		empty += st.EmptyAcquireCount()
		canceled += st.CanceledAcquireCount()
		lifetime += st.MaxLifetimeDestroyCount()
		idle += st.MaxIdleDestroyCount()
	}
	fmt.Printf("  %-34s %s: %d connections, %d opened in all; %d acquires, %d found none idle, %d canceled; closed for lifetime %d, idle %d\n", "",
		when, total, opened, acquires, empty, canceled, lifetime, idle)
}

// walTimes is the cluster's WAL activity so far (pg_stat_wal): the records,
// full-page images and bytes written. Printed for the spread's produce: a
// produce over many streams first touches each stream's sequence and index
// pages after the checkpoint that precedes it, which could have cost a
// full-page image of each (the runs at 69d07b1 measured 0–4 in all: it
// does not).
type walTimes struct{ records, fpi, bytes int64 }

func (b *bench) walNow(ctx context.Context) (walTimes, bool) {
	var w walTimes
	err := b.pool.QueryRow(ctx, `SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal`).Scan(&w.records, &w.fpi, &w.bytes)
	return w, err == nil
}

func (w walTimes) perMessage(after walTimes, n int) string {
	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	return fmt.Sprintf("%.2f records, %.3f full-page images, %.0f bytes (%d full-page images in all)",
		per(w.records, after.records), per(w.fpi, after.fpi), per(w.bytes, after.bytes), after.fpi-w.fpi)
}
