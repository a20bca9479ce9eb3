package main

// The report: what ran where, the runs, their medians, the ratios to the raw
// baselines and the floors; printed, and written as results/latest.md and
// results/latest.json.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

type report struct {
	Date     string              `json:"date"`
	Command  string              `json:"command"`
	Via      string              `json:"via,omitempty"`
	Library  string              `json:"library_revision"`
	Database string              `json:"database"`
	Elapsed  string              `json:"elapsed"`
	Machine  machine             `json:"machine"`
	Go       goInfo              `json:"go"`
	Postgres pgInfo              `json:"postgres"`
	Params   params              `json:"params"`
	Results  []*throughputResult `json:"throughput"`
	Latency  []*latencyResult    `json:"latency"`
	Ratios   []ratio             `json:"ratios"`
	Peers    []peerInfo          `json:"peers,omitempty"`
	// Selective are the selective-bindings runs (server CPU per window).
	Selective []selectiveResult `json:"selective,omitempty"`
	// DeadTuples are the sqlstreams tables' dead tuples at the end.
	DeadTuples []deadTuples `json:"dead_tuples,omitempty"`
	// Capacity holds the capacity scenarios' medians, CapacityRuns every
	// window.
	Capacity       []capacityRun `json:"capacity,omitempty"`
	Scale          *scaleResult  `json:"scale,omitempty"`
	CapacityRuns   []capacityRun `json:"capacity_runs,omitempty"`
	CapacityRate   int           `json:"capacity_rate,omitempty"`
	CapacityWindow string        `json:"capacity_window,omitempty"`
	// Sections are the wall time of each part of the run, in run order.
	Sections []section `json:"sections,omitempty"`
}

// section is one part of a run and the wall time it took, set-up (backlogs,
// registrations) included.
type section struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// peerInfo is a peer library the run measured beside sqlstreams: the module
// versions it was built with (read from the binary) and how it was set up.
type peerInfo struct {
	Key     string            `json:"key"`
	Name    string            `json:"name"`
	Modules map[string]string `json:"modules"`
	Config  string            `json:"config"`
}

type machine struct {
	NProc    int    `json:"nproc"`
	MemoryMB int64  `json:"memory_mb"`
	CPU      string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
}

type goInfo struct {
	Version    string `json:"version"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

type pgInfo struct {
	Version  string            `json:"version"`
	Full     string            `json:"full_version"`
	Settings map[string]string `json:"settings"`
}

type params struct {
	N            int    `json:"n"`
	Runs         int    `json:"runs"`
	Singles      int    `json:"singles"`
	PayloadBytes int    `json:"payload_bytes"`
	LatencyRate  int    `json:"latency_rate"`
	LatencyFor   string `json:"latency_for"`
	KeysN        int    `json:"keys_n,omitempty"` // messages per failures/keys stream, when that family ran
	Only         string `json:"only,omitempty"`
}

type throughputResult struct {
	Key    string    `json:"key"`
	Name   string    `json:"name"`
	Unit   string    `json:"unit"`
	Runs   []float64 `json:"runs"`
	Median float64   `json:"median"`
	// RunStats are the consumer's counters after each run (failures/keys).
	RunStats []runStats `json:"run_stats,omitempty"`
	// ServerCPU is the database server's CPU per unit in each run, in
	// microseconds, where measured (a local server only).
	ServerCPU       []float64 `json:"server_cpu_us_per_unit,omitempty"`
	ServerCPUMedian float64   `json:"server_cpu_us_per_unit_median,omitempty"`
	// ClientCPU is the benchmark process's own CPU per unit (the library and
	// the peers' clients run in it), in microseconds.
	ClientCPU       []float64 `json:"client_cpu_us_per_unit,omitempty"`
	ClientCPUMedian float64   `json:"client_cpu_us_per_unit_median,omitempty"`
}

func (t *throughputResult) add(_ string, v float64) { t.Runs = append(t.Runs, v) }

// timedRun starts a run after a checkpoint, runs it, and records its rate
// and the server's and client's CPU per unit (units of them) into t.
func (b *bench) timedRun(ctx context.Context, t *throughputResult, label string, units int, run func() (float64, error)) error {
	b.checkpoint(ctx)
	c0, _ := b.cpuNow(ctx)
	rate, err := run()
	if err != nil {
		return err
	}
	c1, ok := b.cpuNow(ctx)
	t.addCPU(c0, c1, ok, units)
	t.add(label, rate)
	if ok {
		fmt.Printf("  %-34s CPU a unit: %s\n", "", c0.perMessage(c1, units))
	}
	return nil
}

// addCPU records a run's server CPU (from bench.serverCPU before and after)
// over units.
func (t *throughputResult) addCPU(before, after cpuTimes, ok bool, units int) {
	if units <= 0 {
		return
	}
	server, client := before.perUnit(after, units)
	if ok {
		t.ServerCPU = append(t.ServerCPU, server)
	}
	t.ClientCPU = append(t.ClientCPU, client)
}

type latencyRun struct {
	Label          string  `json:"label"`
	Messages       int     `json:"messages"`
	ProducedPerSec float64 `json:"produced_per_sec"`
	P50ms          float64 `json:"p50_ms"`
	P99ms          float64 `json:"p99_ms"`
	P999ms         float64 `json:"p99_9_ms"`
	MaxMs          float64 `json:"max_ms"`
}

type latencyResult struct {
	Key           string       `json:"key"`
	Name          string       `json:"name"`
	ClaimPollRate string       `json:"claim_poll_rate"`
	Rate          int          `json:"rate"`
	For           string       `json:"for"`
	Runs          []latencyRun `json:"runs"`
	// Medians over the runs of each run's percentile.
	P50ms  float64 `json:"median_p50_ms"`
	P99ms  float64 `json:"median_p99_ms"`
	P999ms float64 `json:"median_p99_9_ms"`
	MaxMs  float64 `json:"median_max_ms"`
}

type ratio struct {
	Name  string  `json:"name"`
	Of    string  `json:"of"`
	To    string  `json:"to"`
	Value float64 `json:"value"`
	Floor float64 `json:"floor,omitempty"`
	Met   *bool   `json:"floor_met,omitempty"`
}

func newReport(c config) *report {
	r := &report{
		Date:    wall.Now().UTC().Format(time.RFC3339),
		Command: "cd bench && go run ." + quoteArgs(os.Args[1:]),
		Library: gitRevision(),
		Machine: describeMachine(),
		Go:      goInfo{Version: runtime.Version(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GOMAXPROCS: runtime.GOMAXPROCS(0)},
		Params: params{N: c.n, Runs: c.runs, Singles: c.singles, PayloadBytes: len(payloadJSON),
			LatencyRate: c.rate, LatencyFor: c.latencyFor.String(), Only: c.only},
	}
	if c.want("keys") {
		r.Params.KeysN = c.keysN
	}
	if os.Getenv("MAKELEVEL") != "" {
		r.Via = "make bench"
		if f := os.Getenv("BENCHFLAGS"); f != "" {
			r.Via += " BENCHFLAGS='" + f + "'"
		}
	}
	return r
}

func quoteArgs(args []string) string {
	var sb strings.Builder
	for _, a := range args {
		sb.WriteByte(' ')
		if strings.ContainsAny(a, " '\"$\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		if strings.Contains(a, "://") {
			a = redact(a)
		}
		sb.WriteString(a)
	}
	return sb.String()
}

func gitRevision() string {
	out, err := exec.Command("git", "-C", "..", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func describeMachine() machine {
	m := machine{NProc: runtime.NumCPU()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			var kb int64
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				m.MemoryMB = kb / 1024
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

var pgSettings = []string{"fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers",
	"max_connections", "max_wal_size", "checkpoint_timeout", "wal_sync_method"}

func (r *report) describeServer(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version'), version()").Scan(&r.Postgres.Version, &r.Postgres.Full); err != nil {
		return fmt.Errorf("server version: %w", err)
	}
	r.Postgres.Settings = map[string]string{}
	for _, s := range pgSettings {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err != nil {
			return fmt.Errorf("setting %s: %w", s, err)
		}
		r.Postgres.Settings[s] = v
	}
	return nil
}

func (r *report) throughput(key, name, unit string) *throughputResult {
	t := &throughputResult{Key: key, Name: name, Unit: unit}
	r.Results = append(r.Results, t)
	return t
}

// peer records a peer's versions, as built into this binary, and config.
func (r *report) peer(key, name string, modules []string, config string) {
	p := peerInfo{Key: key, Name: name, Modules: map[string]string{}, Config: config}
	for _, m := range modules {
		p.Modules[m] = "unknown"
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if _, want := p.Modules[d.Path]; want {
				p.Modules[d.Path] = d.Version
			}
		}
	}
	r.Peers = append(r.Peers, p)
}

func (r *report) latency(key, name string, poll time.Duration, rate int, dur time.Duration) *latencyResult {
	l := &latencyResult{Key: key, Name: name, ClaimPollRate: poll.String(), Rate: rate, For: dur.String()}
	r.Latency = append(r.Latency, l)
	return l
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *report) find(key string) *throughputResult {
	for _, t := range r.Results {
		if t.Key == key && len(t.Runs) > 0 {
			return t
		}
	}
	return nil
}

// finish computes the medians and the ratios.
func (r *report) finish() {
	for _, t := range r.Results {
		t.Median = median(t.Runs)
		if len(t.ServerCPU) > 0 {
			t.ServerCPUMedian = median(t.ServerCPU)
		}
		if len(t.ClientCPU) > 0 {
			t.ClientCPUMedian = median(t.ClientCPU)
		}
	}
	for _, l := range r.Latency {
		var p50, p99, p999, mx []float64
		for _, run := range l.Runs {
			p50, p99, p999, mx = append(p50, run.P50ms), append(p99, run.P99ms), append(p999, run.P999ms), append(mx, run.MaxMs)
		}
		l.P50ms, l.P99ms, l.P999ms, l.MaxMs = median(p50), median(p99), median(p999), median(mx)
	}
	add := func(name, of, to string, floor float64) {
		a, b := r.find(of), r.find(to)
		if a == nil || b == nil || b.Median == 0 {
			return
		}
		q := ratio{Name: name, Of: of, To: to, Value: a.Median / b.Median, Floor: floor}
		if floor > 0 {
			met := q.Value >= floor
			q.Met = &met
		}
		r.Ratios = append(r.Ratios, q)
	}
	add("batched produce / raw batched INSERT", "produce_batch", "raw_insert", 0.80)
	add("single produce / raw batched INSERT", "produce_single", "raw_insert", 0)
	add("burn-down 4 instances / raw keyset drain", "burndown_4", "raw_drain", 0.25)
	add("burn-down 1 instance / raw keyset drain", "burndown_1", "raw_drain", 0)
	add("burn-down 2 instances / 1 instance", "burndown_2", "burndown_1", 0)
	add("burn-down 4 instances / 1 instance", "burndown_4", "burndown_1", 0)
	add("batched produce / NATS JetStream publish (reference)", "produce_batch", "nats_publish", 0)
	add("burn-down 4 instances / NATS JetStream consume (reference)", "burndown_4", "nats_consume", 0)
	add("batched produce / RabbitMQ publish (reference)", "produce_batch", "rabbitmq_publish", 0)
	add("burn-down 4 instances / RabbitMQ consume (reference)", "burndown_4", "rabbitmq_consume", 0)
	add("burn-down 4 instances, json.RawMessage handler / raw keyset drain", "burndown_raw_4", "raw_drain", 0)
	add("burn-down 4 instances, json.RawMessage handler / typed", "burndown_raw_4", "burndown_4", 0)
	add("transactional burn-down 4 instances / typed burn-down 4 instances", "burndown_tx_4", "burndown_4", 0.50)
	for _, peer := range []struct {
		key, name string
		floor     float64
	}{{"river_burndown", "River", 2}, {"watermill_burndown", "Watermill SQL", 5}} {
		add("sqlstreams burn-down 4 instances / "+peer.name+" burn-down", "burndown_4", peer.key, peer.floor)
		add("sqlstreams burn-down 1 instance / "+peer.name+" burn-down", "burndown_1", peer.key, 0)
	}
	add("scale: produce over many streams / one stream", "scale_produce_many", "scale_produce_one", 0.80)
	add("scale: burn-down over many streams / one stream (running sessions)", "scale_burndown_many", "scale_burndown_one", 0.80)
	add("scale: burn-down over many streams / one stream (sessions starting on it)", "scale_burndown_many_cold", "scale_burndown_one_cold", 0)
	add("batched produce / PgQ batched insert_event", "produce_batch", "pgq_produce", 0.80)
	add("sqlstreams burn-down 4 instances / PgQ consumer", "burndown_4", "pgq_consume", 1)
	add("sqlstreams burn-down 1 instance / PgQ consumer", "burndown_1", "pgq_consume", 0)
	for _, t := range r.Results {
		if strings.HasPrefix(t.Key, "growth_") && t.Key != "growth_1000000" {
			add(t.Name+" / at 1000000 retained", t.Key, "growth_1000000", 0.8)
		}
	}
	add("fan-out 4 groups / 1 group (deliveries/s)", "fanout_4", "fanout_1", 0)
	add("fan-out 16 groups / 1 group (deliveries/s)", "fanout_16", "fanout_1", 0)
	for _, v := range keysVariants[1:] {
		add("failures/keys: "+v.short+" / parallel baseline", v.key, keysVariants[0].key, v.floor)
	}
}

func (p peerInfo) versions() string {
	mods := slices.Sorted(maps.Keys(p.Modules))
	for i, m := range mods {
		mods[i] = m + " " + p.Modules[m]
	}
	return strings.Join(mods, ", ")
}

func (q ratio) verdict() string {
	switch {
	case q.Met == nil:
		return "-"
	case *q.Met:
		return fmt.Sprintf("floor %.0f%%: met", q.Floor*100)
	default:
		return fmt.Sprintf("floor %.0f%%: MISSED", q.Floor*100)
	}
}

func (r *report) print(w io.Writer) {
	fmt.Fprintln(w, "\nresults (median of runs):")
	for _, t := range r.Results {
		cpu := ""
		if t.ServerCPUMedian > 0 {
			cpu = fmt.Sprintf("   CPU per %s: server %.1f µs, client %.1f µs", strings.TrimSuffix(t.Unit, "/s"), t.ServerCPUMedian, t.ClientCPUMedian)
		}
		fmt.Fprintf(w, "  %-72s %9.0f %s%s\n", t.Name, t.Median, t.Unit, cpu)
	}
	for _, l := range r.Latency {
		fmt.Fprintf(w, "  %-72s p50 %.1f ms  p99 %.1f ms  p99.9 %.1f ms  max %.1f ms\n", l.Name, l.P50ms, l.P99ms, l.P999ms, l.MaxMs)
	}
	for _, c := range r.latencyAgainstFloor() {
		fmt.Fprintf(w, "  %-72s %s\n", c.name, c.verdict)
	}
	for _, p := range r.Peers {
		fmt.Fprintf(w, "  peer %s (%s): %s\n", p.Name, p.versions(), p.Config)
	}
	if g, ok := r.selectiveCost(); ok {
		fmt.Fprintf(w, "  %-72s %6.1f×   target ≤ 2×\n", "selective: server CPU of a 1%-bound group / of an idle group", g)
	}
	if r.Scale != nil {
		fmt.Fprintln(w)
		r.Scale.table(func(f string, a ...any) { fmt.Fprintf(w, f, a...) })
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w, "ratios:")
	}
	for _, q := range r.Ratios {
		fmt.Fprintf(w, "  %-72s %6.1f%%   %s\n", q.Name, q.Value*100, q.verdict())
	}
}

func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# sqlstreams benchmark results\n\n")
	p("- date: %s\n- command: `%s`", r.Date, r.Command)
	if r.Via != "" {
		p(" (via `%s`)", r.Via)
	}
	p("\n- library revision: %s\n- database: %s\n- elapsed: %s\n", r.Library, r.Database, r.Elapsed)
	p("- machine: %d CPUs (%s), %d MB memory, kernel %s\n", r.Machine.NProc, r.Machine.CPU, r.Machine.MemoryMB, r.Machine.Kernel)
	p("- Go: %s %s/%s, GOMAXPROCS %d\n", r.Go.Version, r.Go.GOOS, r.Go.GOARCH, r.Go.GOMAXPROCS)
	p("- PostgreSQL: %s;", r.Postgres.Version)
	for _, s := range pgSettings {
		p(" %s=%s", s, r.Postgres.Settings[s])
	}
	p("\n- parameters: -n %d, -runs %d, -singles %d, payload %d bytes of JSON, latency windows of %s",
		r.Params.N, r.Params.Runs, r.Params.Singles, r.Params.PayloadBytes, r.Params.LatencyFor)
	if r.Params.LatencyRate > 0 {
		p(" at -rate %d msg/s", r.Params.LatencyRate)
	}
	if r.Params.KeysN > 0 {
		p(", failures/keys -keysn %d", r.Params.KeysN)
	}
	if len(r.Sections) > 0 {
		p("\n- wall time by section:")
		for i, sec := range r.Sections {
			sep := ","
			if i == 0 {
				sep = ""
			}
			p("%s %s %.0f s", sep, sec.Name, sec.Seconds)
		}
	}
	p("\n\n")
	if len(r.Results) > 0 {
		p("| workload | median | unit | runs | CPU per unit, server / client (median) |\n|---|---:|---|---|---:|\n")
		for _, t := range r.Results {
			runs := make([]string, len(t.Runs))
			for i, v := range t.Runs {
				runs[i] = fmt.Sprintf("%.0f", v)
			}
			cpu := ""
			if t.ServerCPUMedian > 0 {
				cpu = fmt.Sprintf("%.1f / %.1f µs", t.ServerCPUMedian, t.ClientCPUMedian)
			}
			p("| %s | %.0f | %s | %s | %s |\n", t.Name, t.Median, t.Unit, strings.Join(runs, ", "), cpu)
		}
		p("\n")
	}
	if cs := r.latencyAgainstFloor(); len(cs) > 0 {
		p("| latency against the floor | verdict |\n|---|---|\n")
		for _, c := range cs {
			p("| %s | %s |\n", c.name, c.verdict)
		}
		p("\n")
	}
	if len(r.Latency) > 0 {
		p("| latency workload | p50 ms | p99 ms | p99.9 ms | max ms | runs (p50/p99/p99.9/max ms, achieved msg/s) |\n|---|---:|---:|---:|---:|---|\n")
		for _, l := range r.Latency {
			runs := make([]string, len(l.Runs))
			for i, run := range l.Runs {
				runs[i] = fmt.Sprintf("%.1f/%.1f/%.1f/%.1f @%.0f", run.P50ms, run.P99ms, run.P999ms, run.MaxMs, run.ProducedPerSec)
			}
			p("| %s, for %s | %.1f | %.1f | %.1f | %.1f | %s |\n", l.Name, l.For, l.P50ms, l.P99ms, l.P999ms, l.MaxMs, strings.Join(runs, "; "))
		}
		p("\n")
	}
	if len(r.Peers) > 0 {
		p("| peer | versions | configuration |\n|---|---|---|\n")
		for _, q := range r.Peers {
			p("| %s | %s | %s |\n", q.Name, q.versions(), q.Config)
		}
		p("\n")
	}
	p("%s", r.keysMarkdown())
	if len(r.DeadTuples) > 0 {
		p("| table (dead tuples at the end of the run) | dead | live | last autovacuum |\n|---|---:|---:|---|\n")
		for _, d := range r.DeadTuples {
			p("| %s | %d | %d | %s |\n", d.Table, d.Dead, d.Live, d.LastAutovacuum)
		}
		p("\n")
	}
	if len(r.Selective) > 0 {
		p("| selective bindings run | window | offered | server CPU: producer alone | + idle group | + 1%% group | 1%% group handled |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range r.Selective {
			p("| %s | %.0f s | %d msg/s | %.2f s | %.2f s | %.2f s | %d |\n", x.Label, x.Seconds, x.Rate, x.ProducerCPU, x.IdleCPU, x.OnePctCPU, x.Handled)
		}
		if g, ok := r.selectiveCost(); ok {
			p("\nMedian group cost (window CPU minus the producer-alone window): the 1%%-bound group costs %.1f× the idle group (target ≤ 2×).\n", g)
		}
		p("\n")
	}
	if len(r.Capacity) > 0 {
		p("Capacity: %d msg/s offered for %s per window; medians of %d runs. Per message produced (each delivered to every group of its stream); idle rows: per session-second.\n\n",
			r.CapacityRate, r.CapacityWindow, r.Params.Runs)
		p("| scenario | offered msg/s | processes | sessions | messages | deliveries | server CPU µs | client CPU µs | WAL bytes | WAL fsyncs | connections a process | a session |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range r.Capacity {
			rate := strconv.Itoa(x.Rate)
			if x.Messages == 0 {
				rate = "idle"
			}
			p("| %s | %s | %d | %d | %d | %d | %.1f | %.1f | %.0f | %.3f | %.1f | %.2f |\n", x.Scenario, rate, x.Processes, x.Sessions, x.Messages, x.Deliveries,
				x.ServerCPUus, x.ClientCPUus, x.WALBytes, x.WALSyncs, x.ConnsPerProcess, x.ConnsPerSession)
		}
		p("\n")
	}
	if r.Scale != nil {
		r.Scale.table(p)
	}
	if len(r.Ratios) > 0 {
		p("| ratio (of medians) | value | floor |\n|---|---:|---|\n")
		for _, q := range r.Ratios {
			p("| %s | %.1f%% | %s |\n", q.Name, q.Value*100, q.verdict())
		}
	}
	return b.String()
}

// write replaces results/latest.md and latest.json, each through a temporary
// file so a reader never sees half a file.
func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return err
	}
	for name, body := range map[string][]byte{"latest.md": []byte(r.markdown()), "latest.json": js.Bytes()} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path+".tmp", body, 0o644); err != nil {
			return err
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %s and %s\n", filepath.Join(dir, "latest.md"), filepath.Join(dir, "latest.json"))
	return nil
}

// selectiveCost is the median over runs of (1%-group window − producer
// window) / (idle-group window − producer window), floored at 10 ms of CPU
// for the idle group so that noise cannot divide by zero.
func (r *report) selectiveCost() (float64, bool) {
	var gs []float64
	for _, x := range r.Selective {
		idle := max(x.IdleCPU-x.ProducerCPU, 0.01)
		gs = append(gs, max(x.OnePctCPU-x.ProducerCPU, 0)/idle)
	}
	if len(gs) == 0 {
		return 0, false
	}
	return median(gs), true
}

// table writes the scale section as a markdown table through p.
func (x *scaleResult) table(p func(string, ...any)) {
	p("Scale: %d streams, %d groups each, %d processes.\n\n", x.Streams, x.Groups, x.Processes)
	p("| measure | value | target |\n|---|---:|---|\n")
	p("| register %d streams | %.1f s | under 60 s |\n", x.Streams, x.RegisterStreamsSeconds)
	p("| register %d groups | %.1f s | |\n", x.Streams*x.Groups, x.RegisterGroupsSeconds)
	p("| catalog added: tables / indexes / relations with files | %d / %d / %d | |\n", x.Tables, x.Indexes, x.Files)
	p("| catalog added: bytes on disk | %.1f MB | |\n", float64(x.Bytes)/1e6)
	p("| idle: %d sessions for %.0f s, server CPU | %.1f%% of one core (%.0f µs a session-second) | at most 5%% |\n",
		x.IdleSessions, x.IdleSeconds, 100*x.IdleServerCore, x.IdleServerPerSess)
	p("| idle: client CPU, all processes | %.1f%% of one core | |\n", 100*x.IdleClientCore)
	p("| idle: connections a process | %.1f | |\n\n", x.IdleConnsPerProc)
}

type floorComparison struct{ name, verdict string }

// latencyAgainstFloor compares each load's latency with the floor's at the
// same load (issue 64's targets): p99 within 1.5× of the floor's; where the
// floor's p99 is under 6 ms, also p99 ≤ 10 ms and p99.9 ≤ 20 ms; at 90%
// load, p99 ≤ 25 ms.
func (r *report) latencyAgainstFloor() []floorComparison {
	var out []floorComparison
	for _, l := range r.Latency {
		pct, ok := strings.CutPrefix(l.Key, "latency_")
		if !ok || strings.HasPrefix(pct, "floor_") {
			continue
		}
		var f *latencyResult
		for _, x := range r.Latency {
			if x.Key == "latency_floor_"+pct {
				f = x
			}
		}
		if f == nil || f.P99ms == 0 {
			continue
		}
		q := l.P99ms / f.P99ms
		met := q <= 1.5
		target := "p99 ≤ 1.5× the floor's"
		if f.P99ms < 6 {
			met = met && l.P99ms <= 10 && l.P999ms <= 20
			target += ", ≤ 10 ms, p99.9 ≤ 20 ms"
		}
		if pct == "90" {
			met, target = l.P99ms <= 25, "p99 ≤ 25 ms"
		}
		verdict := "met"
		if !met {
			verdict = "MISSED"
		}
		out = append(out, floorComparison{
			name:    fmt.Sprintf("latency at %s%% load: p99 %.1f ms / floor p99 %.1f ms", pct, l.P99ms, f.P99ms),
			verdict: fmt.Sprintf("%.2f× (p99.9 %.1f / %.1f ms); target %s: %s", q, l.P999ms, f.P999ms, target, verdict)})
	}
	return out
}
