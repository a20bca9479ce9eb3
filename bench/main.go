// Command bench is the sqlstreams benchmark harness. It is its own module so
// that nothing it needs becomes a dependency of the library.
//
//	cd bench && go run . [-n 200000] [-runs 3] [-keysn 50000] [-only keys] [-url postgres://...]
//
// Against a fresh database (a private, durable PostgreSQL it starts and
// removes, unless -url or SQLSTREAMS_DATABASE_URL names a server, on which it
// creates and drops a database of its own) it runs every workload -runs times,
// prints a progress line while running, and writes the medians, the ratios to
// the raw-PostgreSQL baselines and the machine it ran on to
// results/latest.md and results/latest.json. See ../BENCHMARKS.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type config struct {
	n, runs, singles, rate int
	keysN, fanoutN         int
	keysVariants           string // -keys-variants: report keys, without keys_, to run (the baseline always runs)
	growthN                int
	riverWorkers           int
	watermillBatch         int
	latencyFor             time.Duration
	url, only, cpuprofile  string
	memprofile, growth     string
	resultsDir             string
	allowShared, keep      bool
	statements             bool
	peerN                  int
	refN                   int
	capacityRate           int
	capacityRetained       int
	capacityStreams        int
	capacityWindow         time.Duration
	scaleStreams           int
	scaleGroups            int
	scaleProcesses         int
	scaleN                 int
	scaleIdle              time.Duration
	sharedBuffers          string
	stmtCache              int
	perfServer             string
	roundProfile           string
	configurePool          bool
}

func main() {
	var c config
	flag.IntVar(&c.n, "n", 200000, "backlog size: rows for the raw baselines, batched produce, burn-down and the peers (make bench-1m: 1000000)")
	flag.IntVar(&c.fanoutN, "fanout-n", 50000, "fan-out workload: messages each group reads (the first of the backlog)")
	flag.IntVar(&c.growthN, "growth-n", 200000, "growth workload: new messages burnt down after the retained rows")
	flag.IntVar(&c.runs, "runs", 3, "runs of each workload; medians are reported")
	flag.StringVar(&c.url, "url", "", "PostgreSQL server to use (default $SQLSTREAMS_DATABASE_URL, else a private throwaway cluster); a fresh database is created on it and dropped at the end")
	flag.IntVar(&c.singles, "singles", 20000, "messages of the single-Produce workload")
	flag.IntVar(&c.rate, "rate", 0, "latency and selective workloads: messages produced per second (latency default: 10%, 50% and 90% of the run's max single produce; selective default: 500)")
	flag.DurationVar(&c.latencyFor, "latency-for", 10*time.Second, "latency workload: how long to produce")
	flag.IntVar(&c.keysN, "keysn", 20000, "failures/keys workloads: messages per stream")
	flag.StringVar(&c.keysVariants, "keys-variants", "", "failures/keys: comma-separated subset of fail_1pct,fail_10pct,exclusive_100,exclusive_10000,parallel_keyed (default all; the parallel baseline always runs)")
	flag.StringVar(&c.growth, "growth", "1000000,10000000", "growth workload: comma-separated retained-row counts")
	flag.StringVar(&c.only, "only", "", "comma-separated subset of workloads: raw,produce,burndown,latency,fanout,selective,keys,growth,river,watermill,pgq,nats,rabbitmq (default all), and capacity and scale (only when named)")
	flag.IntVar(&c.riverWorkers, "river-workers", 2000, "river: MaxWorkers of the peer's queue")
	flag.IntVar(&c.watermillBatch, "watermill-batch", 10000, "watermill: SubscribeBatchSize of the peer's subscriber")
	flag.StringVar(&c.cpuprofile, "cpuprofile", "", "write a Go CPU profile of the whole run to this file")
	flag.StringVar(&c.memprofile, "memprofile", "", "write a Go allocation profile of the whole run to this file (at the end)")
	flag.StringVar(&c.resultsDir, "results", "results", "directory for latest.md and latest.json")
	flag.IntVar(&c.refN, "ref-n", 200000, "nats, rabbitmq: messages each reference run publishes and consumes (BENCH_NATS_URL, BENCH_AMQP_URL; skipped when no server answers)")
	flag.IntVar(&c.peerN, "peer-n", 0, "river, watermill: messages each run times from the peer's backlog of -n (0: all of them); make bench-1m reads 200,000 of 1,000,000, the peers' rate at that backlog")
	flag.BoolVar(&c.statements, "statements", false, "private cluster only: load pg_stat_statements and print the statements that took the most server time in the run (a diagnostic; it adds a little per-statement overhead)")
	flag.IntVar(&c.capacityRate, "capacity-rate", 400, "capacity: messages offered per second in each window (single Produce calls unless the scenario batches)")
	flag.DurationVar(&c.capacityWindow, "capacity-window", 10*time.Second, "capacity: how long each window produces (idle windows: how long they last)")
	flag.IntVar(&c.capacityStreams, "capacity-streams", 100, "capacity: streams of the many-streams and idle scenarios (a group and a session each)")
	flag.IntVar(&c.capacityRetained, "capacity-retained", 1000000, "capacity: rows the retained-rows scenario's stream holds")
	flag.IntVar(&c.scaleStreams, "scale-streams", 1000, "scale: streams registered, idle and spread over")
	flag.IntVar(&c.scaleGroups, "scale-groups", 2, "scale: groups on each stream in the idle window (a Consume session each)")
	flag.IntVar(&c.scaleProcesses, "scale-processes", 4, "scale: clients with their own pools (processes) the sessions are spread over")
	flag.IntVar(&c.scaleN, "scale-n", 200000, "scale: messages produced and burnt down, over all the streams and on one")
	flag.DurationVar(&c.scaleIdle, "scale-idle", time.Minute, "scale: how long the idle window lasts")
	flag.IntVar(&c.stmtCache, "stmt-cache", 0, "scale: the consumers' pools' pgx statement cache capacity (0: pgx's default, 512; a diagnostic)")
	flag.StringVar(&c.sharedBuffers, "shared-buffers", "256MB", "private cluster only: its shared_buffers (make bench-scale passes 1GB, decision 0058; the other recorded runs use the default)")
	flag.StringVar(&c.roundProfile, "round-profile", "", "scale: write a Go CPU profile of each running round (every client) to this path prefix (a diagnostic; not with -cpuprofile)")
	flag.StringVar(&c.perfServer, "perf-server", "", "scale: record the whole machine with Linux perf (perf record -a -g) during each running round, to this path prefix (a diagnostic: where the server's CPU goes; needs perf and the server on this machine)")
	flag.BoolVar(&c.configurePool, "configure-pool", false, "configure the shared pool with sqlstreams.ConfigurePool (a 256 KiB read buffer a connection, decision 0059) instead of pgx's 8 KiB; every system measured gets it (a diagnostic: the recorded runs do not, decision 0059)")
	flag.BoolVar(&c.keep, "keep", false, "with -url: keep the benchmark's database afterwards, for EXPLAIN and inspection")
	flag.BoolVar(&c.allowShared, "allow-port-5432", false, "allow a -url on port 5432 (refused by default: that is usually a shared server)")
	flag.Parse()
	for _, k := range strings.Split(c.keysVariants, ",") {
		if k = strings.TrimSpace(k); k != "" && !slices.ContainsFunc(keysVariants[1:], func(v keysVariant) bool { return v.key == "keys_"+k }) {
			fmt.Fprintf(os.Stderr, "bench: -keys-variants: %q is not one of fail_1pct, fail_10pct, exclusive_100, exclusive_10000, parallel_keyed\n", k)
			os.Exit(2)
		}
	}
	if c.n < 1000 || c.keysN < 1000 || c.fanoutN < 1 || c.growthN < 1000 || c.runs < 1 || c.singles < 4 || c.rate < 0 || c.latencyFor <= 0 ||
		c.riverWorkers < 1 || c.riverWorkers > 10000 || c.watermillBatch < 1 || c.capacityRate < 4 || c.capacityWindow <= 0 ||
		c.capacityStreams < 1 || c.capacityRetained < 1 ||
		c.scaleStreams < 1 || c.scaleGroups < 1 || c.scaleProcesses < 1 || c.scaleN < produceBatchLen || c.scaleIdle <= 0 {
		fmt.Fprintln(os.Stderr, "bench: -n and -keysn must be at least 1000, -runs, -singles, -rate, -latency-for and -watermill-batch positive, -river-workers 1 to 10000, -capacity-rate at least 4, -capacity-window, -capacity-streams and -capacity-retained positive, -scale-streams, -scale-groups, -scale-processes and -scale-idle positive, -scale-n at least 100")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, c)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func (c config) want(workload string) bool {
	if workload == "capacity" || workload == "scale" { // not part of "every workload": make bench-capacity, make bench-scale
		return slices.Contains(strings.Split(c.only, ","), workload)
	}
	return c.only == "" || slices.Contains(strings.Split(c.only, ","), workload)
}

func run(ctx context.Context, c config) (err error) {
	if c.cpuprofile != "" {
		f, err := os.Create(c.cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	if c.memprofile != "" {
		defer func() {
			f, ferr := os.Create(c.memprofile)
			if ferr == nil {
				ferr = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
			if ferr != nil && err == nil {
				err = fmt.Errorf("memprofile: %w", ferr)
			}
		}()
	}
	rep := newReport(c)

	serverURL := c.url
	if serverURL == "" {
		serverURL = os.Getenv("SQLSTREAMS_DATABASE_URL")
	}
	if serverURL == "" {
		fmt.Println("starting a private durable PostgreSQL (pass -url or set SQLSTREAMS_DATABASE_URL to use your own)...")
		cl, err := startCluster(ctx, c.statements, c.sharedBuffers)
		if err != nil {
			return err
		}
		defer cl.stop()
		serverURL = cl.url()
		rep.Database = fmt.Sprintf("private cluster: initdb in %s, 127.0.0.1:%d, removed at the end", cl.dir, cl.port)
	} else {
		rep.Database = "-url " + redact(serverURL)
	}
	admin, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return fmt.Errorf("database url: %w", err)
	}
	if admin.Port == 5432 && !c.allowShared {
		return errors.New("refusing a server on port 5432, which is usually a shared one (the benchmark creates and drops a database and loads it hard); pass -allow-port-5432 if you mean it")
	}

	// A fresh database for this run.
	dbName := "sqlstreams_bench_" + wall.Now().UTC().Format("20060102_150405")
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		_ = conn.Close(ctx)
		return fmt.Errorf("create a fresh database (the role needs CREATEDB): %w", err)
	}
	defer func() {
		if c.keep && !strings.HasPrefix(rep.Database, "private") { // a private cluster goes anyway
			fmt.Printf("kept database %s\n", dbName)
			_ = conn.Close(context.Background())
			return
		}
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)"); err != nil {
			fmt.Fprintln(os.Stderr, "drop benchmark database:", err)
		}
		_ = conn.Close(context.Background())
	}()

	pcfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.Database = dbName
	pcfg.MaxConns = 32
	// JIT off for every system measured (sqlstreams, raw, River, Watermill,
	// PgQ share this pool or its connection config), as decision 0013
	// recommends for sqlstreams: its short statements were JIT-compiled at
	// 25–190 ms each once a log held 10M rows. With -configure-pool, the
	// whole of what sqlstreams recommends (decision 0059), for every system
	// alike (decision 0059: in alternated keys runs it made no difference
	// beyond the runs' spread; the recorded runs keep pgx's buffer so that
	// their figures share one basis).
	if c.configurePool {
		sqlstreams.ConfigurePool(pcfg)
	} else if _, set := pcfg.ConnConfig.RuntimeParams["jit"]; !set {
		pcfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if err := rep.describeServer(ctx, pool); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL %s (fsync=%s, synchronous_commit=%s, shared_buffers=%s, wal_level=%s); database %s\n",
		rep.Postgres.Version, rep.Postgres.Settings["fsync"], rep.Postgres.Settings["synchronous_commit"],
		rep.Postgres.Settings["shared_buffers"], rep.Postgres.Settings["wal_level"], dbName)
	fmt.Printf("payload %d bytes of JSON per message; -n %d, -runs %d\n", len(payloadJSON), c.n, c.runs)

	b := &bench{c: c, pool: pool, rep: rep, logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if c.statements {
		if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()"); err != nil {
			return fmt.Errorf("-statements needs pg_stat_statements loaded (the private cluster loads it): %w", err)
		}
	}
	started := wall.Now()
	b.lapAt = started
	if c.want("raw") {
		if err := b.raw(ctx, pcfg.ConnConfig); err != nil {
			return fmt.Errorf("raw baselines: %w", err)
		}
		b.lap("raw")
	}
	if c.want("produce") || c.want("burndown") || c.want("latency") || c.want("fanout") || c.want("selective") || c.want("keys") || c.want("growth") {
		if err := b.streams(ctx); err != nil {
			return err
		}
	}
	if c.want("capacity") {
		if err := b.capacity(ctx); err != nil {
			return err
		}
		b.lap("capacity")
	}
	if c.want("scale") {
		if err := b.scale(ctx); err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		b.lap("scale")
	}
	// The peers, after sqlstreams, whose burn-down they are compared to; then
	// the reference points outside PostgreSQL, where the machine runs them.
	for _, w := range []struct {
		name string
		run  func(context.Context) error
	}{{"river", b.river}, {"watermill", b.watermill}, {"pgq", b.pgq}, {"nats", b.natsRef}, {"rabbitmq", b.rabbitRef}} {
		if !c.want(w.name) {
			continue
		}
		if err := w.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		b.lap(w.name)
	}
	if c.statements {
		if err := b.topStatements(ctx); err != nil {
			return fmt.Errorf("statements: %w", err)
		}
	}
	rep.Elapsed = wall.Since(started).Round(time.Second).String()
	rep.finish()
	rep.print(os.Stdout)
	return rep.write(c.resultsDir)
}

// bench carries what every workload needs.
type bench struct {
	c      config
	pool   *pgxpool.Pool
	rep    *report
	logger *slog.Logger
	lapAt  time.Time // when the last section ended (lap)
	// io is the block counters by kind of relation at windowStart
	// (-statements), for windowEnd's difference.
	io map[string]ioCount
}

// lap records the wall time since the last lap as the named section's, so a
// report says where its elapsed time went (the peers' fixed volumes, the
// growth workload's 10M rows).
func (b *bench) lap(name string) {
	now := wall.Now()
	b.rep.Sections = append(b.rep.Sections, section{Name: name, Seconds: now.Sub(b.lapAt).Seconds()})
	b.lapAt = now
}

// checkpoint starts a timed run with no vacuum owed and a clean WAL, so no
// run pays for an earlier one's tables being autovacuumed (the tables a
// batch-produce run filled were vacuumed during the next run, adding up to a
// third to its server CPU) or for its checkpoint. Without the privilege
// either step is skipped.
//
// It also collects this process's garbage and returns its free memory to
// the OS, so no run collects the garbage of the one before it (usually the
// untimed backlog's produce). The runtime's scavenger took 6.6% of the
// CPU samples of a whole keys profile (BENCHMARKS.md at 1df8b0a); this step alone made
// no visible difference to the keys runs' rates.
func (b *bench) checkpoint(ctx context.Context) {
	_, _ = b.pool.Exec(ctx, "VACUUM")
	b.analyzeOwed(ctx)
	_, _ = b.pool.Exec(ctx, "CHECKPOINT")
	debug.FreeOSMemory()
}

// analyzeOwed analyzes the tables changed since their last analyze: VACUUM
// alone leaves them owed an autoanalyze, which the server ran during a
// later timed run. In a keys run it analyzed two earlier streams' 200,000
// row logs and more, doubling the run's server CPU a message (11.5 µs
// against 5–6) and cutting its rate by a sixth (BENCHMARKS.md at 1df8b0a).
func (b *bench) analyzeOwed(ctx context.Context) {
	rows, err := b.pool.Query(ctx, `SELECT format('%I.%I', schemaname, relname) FROM pg_stat_all_tables
WHERE n_mod_since_analyze > 0 AND schemaname NOT IN ('pg_toast', 'information_schema')`)
	if err != nil {
		return
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, t := range tables {
		_, _ = b.pool.Exec(ctx, "ANALYZE "+t) // quoted by format's %I
	}
}

// progress prints a line every two seconds while a run goes on.
func progress(label, unit string, total int64, done *atomic.Int64) (stop func()) {
	start := wall.Now()
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := wall.Ticker(2 * time.Second)
		defer t.Stop()
		last, lastAt := int64(0), start
		for {
			select {
			case <-quit:
				return
			case now := <-t.C():
				d := done.Load()
				fmt.Printf("  %-34s %5.1fs  %8d/%d %s  %8.0f %s/s now\n", label, now.Sub(start).Seconds(), d, total, unit,
					float64(d-last)/now.Sub(lastAt).Seconds(), unit)
				last, lastAt = d, now
			}
		}
	}()
	return func() { close(quit); <-exited }
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if strings.Contains(s, "password") {
			return "(a connection string holding a password)"
		}
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Order is the message of every workload: one JSON object of about 1 KB.
// SentAt is zero except in the latency workload.
type Order struct {
	SentAt   int64       `json:"sent_at"`
	OrderID  int64       `json:"order_id"`
	Customer string      `json:"customer"`
	Email    string      `json:"email"`
	Currency string      `json:"currency"`
	Lines    []OrderLine `json:"lines"`
	Shipping Address     `json:"shipping"`
	Note     string      `json:"note"`
}

type OrderLine struct {
	SKU      string `json:"sku"`
	Title    string `json:"title"`
	Quantity int    `json:"quantity"`
	Cents    int64  `json:"cents"`
}

type Address struct {
	Name    string `json:"name"`
	Street  string `json:"street"`
	City    string `json:"city"`
	Postal  string `json:"postal"`
	Country string `json:"country"`
}

// payloadJSONSize is the encoded size of the benchmark's message.
const payloadJSONSize = 1024

var (
	baseOrder   = newOrder()
	payloadJSON = mustJSON(baseOrder) // the raw baselines insert exactly these bytes
)

func newOrder() Order {
	o := Order{OrderID: 4711, Customer: "cust-0042", Email: "customer.0042@example.com", Currency: "EUR",
		Shipping: Address{Name: "Ada Lovelace", Street: "12 Analytical Engine Street", City: "London", Postal: "NW1 2DB", Country: "GB"}}
	for i := range 6 {
		o.Lines = append(o.Lines, OrderLine{SKU: fmt.Sprintf("SKU-%06d", 1000+i), Title: fmt.Sprintf("Benchmark item number %d, standard edition", i),
			Quantity: 1 + i%3, Cents: int64(1999 + 250*i)})
	}
	if pad := payloadJSONSize - len(mustJSON(o)); pad > 0 {
		o.Note = strings.Repeat("x", pad)
	}
	return o
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// wall is the harness's clock: a benchmark measures real elapsed time, and
// this is the one place it is read from.
var wall = sqlstreams.RealClock()

// sleep waits d on the wall clock.
func sleep(d time.Duration) { <-after(d) }

// after delivers the time once d has passed on the wall clock.
func after(d time.Duration) <-chan time.Time { return wall.Timer(d).C() }

// topStatements prints the statements that took the most server time since
// the run began, named by their first line (sqlstreams' statements start with
// a comment naming their caller).
// windowStart begins a window whose own statements windowEnd prints, with
// -statements (otherwise both do nothing): the idle window, the spread's
// produce and its running round.
//
// withIO adds the blocks read by kind of relation (ioByKind): a catalog
// query of a few hundred milliseconds over 1,000 streams, so only for
// windows whose CPU readings do not include windowStart and windowEnd (the
// idle window's do).
func (b *bench) windowStart(ctx context.Context, withIO bool) error {
	b.io = nil
	if !b.c.statements {
		return nil
	}
	if _, err := b.pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return err
	}
	if !withIO {
		return nil
	}
	var err error
	b.io, err = b.ioByKind(ctx)
	return err
}

// windowEnd prints the statements run since windowStart under title.
func (b *bench) windowEnd(ctx context.Context, title string) error {
	if !b.c.statements {
		return nil
	}
	fmt.Printf("  %s:", title)
	if err := b.topStatements(ctx); err != nil || b.io == nil {
		return err
	}
	return b.printIO(ctx)
}

func (b *bench) topStatements(ctx context.Context) error {
	// Grouped by that first line: a statement of a stream's own tables has a
	// text per stream.
	rows, err := b.pool.Query(ctx, `SELECT split_part(ltrim(query), E'\n', 1), sum(calls)::bigint, sum(total_exec_time), sum(total_plan_time),
       sum(plans)::bigint, sum(rows)::bigint, sum(shared_blks_read)::bigint, sum(shared_blks_written)::bigint
FROM pg_stat_statements GROUP BY 1
UNION ALL
SELECT '(all statements)', sum(calls)::bigint, sum(total_exec_time), sum(total_plan_time), sum(plans)::bigint, sum(rows)::bigint,
       sum(shared_blks_read)::bigint, sum(shared_blks_written)::bigint
FROM pg_stat_statements
ORDER BY 3 DESC LIMIT 21`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Printf("\nstatements by server time (pg_stat_statements; blocks read into and written out of shared buffers):\n  %10s %10s %10s %10s %10s %10s %8s %8s  %s\n",
		"exec ms", "calls", "mean µs", "plan ms", "plans", "rows", "read", "written", "statement")
	for rows.Next() {
		var q string
		var calls, plans, n, read, written int64
		var total, plan float64
		if err := rows.Scan(&q, &calls, &total, &plan, &plans, &n, &read, &written); err != nil {
			return err
		}
		if len(q) > 70 {
			q = q[:70]
		}
		fmt.Printf("  %10.0f %10d %10.1f %10.0f %10d %10d %8d %8d  %s\n", total, calls, total*1000/float64(max(calls, 1)), plan, plans, n, read, written, q)
	}
	return rows.Err()
}

// peerCount is how many messages a peer's run times: -peer-n of its -n
// backlog, or all of it.
func (c config) peerCount() int {
	if c.peerN > 0 && c.peerN < c.n {
		return c.peerN
	}
	return c.n
}

// ioCount is a kind of relation's block counters (pg_statio_all_tables,
// with its indexes and TOAST).
type ioCount struct{ read, hit int64 }

// ioByKind reads the block counters by kind of relation: a stream table's
// name without its stream (stream_12_range: range; a log chunk: log_chunk),
// the catalog, and everything else.
func (b *bench) ioByKind(ctx context.Context) (map[string]ioCount, error) {
	rows, err := b.pool.Query(ctx, `SELECT CASE
         WHEN schemaname = 'pg_catalog' THEN 'catalog'
         WHEN relname ~ '^stream_[0-9]+_log_[0-9]+$' THEN 'log_chunk'
         WHEN relname ~ '^stream_[0-9]+_' THEN regexp_replace(relname, '^stream_[0-9]+_', '')
         ELSE 'other' END,
       sum(coalesce(heap_blks_read, 0) + coalesce(idx_blks_read, 0) + coalesce(toast_blks_read, 0) + coalesce(tidx_blks_read, 0))::bigint,
       sum(coalesce(heap_blks_hit, 0) + coalesce(idx_blks_hit, 0) + coalesce(toast_blks_hit, 0) + coalesce(tidx_blks_hit, 0))::bigint
FROM pg_catalog.pg_statio_all_tables GROUP BY 1`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]ioCount{}
	for rows.Next() {
		var k string
		var c ioCount
		if err := rows.Scan(&k, &c.read, &c.hit); err != nil {
			return nil, err
		}
		m[k] = c
	}
	return m, rows.Err()
}

// printIO prints the block counters' growth since windowStart by kind of
// relation, most read first.
func (b *bench) printIO(ctx context.Context) error {
	now, err := b.ioByKind(ctx)
	if err != nil {
		return err
	}
	type kv struct {
		k string
		c ioCount
	}
	var all []kv
	for k, c := range now {
		d := ioCount{c.read - b.io[k].read, c.hit - b.io[k].hit}
		if d.read > 0 || d.hit > 0 {
			all = append(all, kv{k, d})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].c.read > all[j].c.read })
	fmt.Printf("  blocks by kind of relation (pg_statio_all_tables, indexes and TOAST included): read / hit\n")
	for _, e := range all {
		fmt.Printf("  %10d %10d  %s\n", e.c.read, e.c.hit, e.k)
	}
	return nil
}
