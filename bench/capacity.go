package main

// Capacity: what one message costs the primary and the client at a steady
// offered rate (single Produce calls, each its own transaction, as an
// application sends them), and how that grows with the instances of a
// group, the groups reading a stream, the streams the load is spread over
// and the rows a stream retains; and what idle sessions cost. The figures
// behind docs/scaling.md. Run only when named: -only capacity.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5/pgxpool"
)

// capacityRun is one measured window.
type capacityRun struct {
	Scenario  string `json:"scenario"`
	Processes int    `json:"processes"` // clients, each with its own pool, as separate processes would have
	Sessions  int    `json:"sessions"`  // Consume sessions over all processes
	Streams   int    `json:"streams"`
	Groups    int    `json:"groups"` // groups per stream
	Retained  int    `json:"retained_rows"`
	Batch     int    `json:"produce_batch"` // messages per Produce call (1: single)
	Rate      int    `json:"offered_per_sec"`
	// Messages produced in the window; each is delivered to every group of
	// its stream (Deliveries).
	Messages   int     `json:"messages"`
	Deliveries int     `json:"deliveries"`
	Seconds    float64 `json:"seconds"`
	// Per message produced (idle windows: per session-second).
	ServerCPUus float64 `json:"server_cpu_us"`
	ClientCPUus float64 `json:"client_cpu_us"`
	WALBytes    float64 `json:"wal_bytes"`
	WALSyncs    float64 `json:"wal_fsyncs"`
	// Connections the processes' pools and notification listeners hold at
	// the end of the window, per process and per session.
	ConnsPerProcess float64 `json:"connections_per_process"`
	ConnsPerSession float64 `json:"connections_per_session"`
}

// capacityScenario is one configuration, run -runs times.
type capacityScenario struct {
	name                       string
	processes, streams, groups int
	sessionsPerGroup, retained int
	batch                      int
	idle                       bool
	rate                       int // offered msg/s; 0: -capacity-rate
	// settle is how long an idle window waits after the warm-up before it
	// begins (scale: one reconcile tick, InstanceTTL/3, in which the
	// sessions let go of what the warm-up's claims took).
	settle time.Duration
}

func (b *bench) capacity(ctx context.Context) error {
	rate, window, many := b.c.capacityRate, b.c.capacityWindow, b.c.capacityStreams
	scenarios := []capacityScenario{
		{name: "base: 1 stream, 1 group, 1 instance", processes: 1, streams: 1, groups: 1, sessionsPerGroup: 1, batch: 1},
		{name: "base at a quarter of the rate", processes: 1, streams: 1, groups: 1, sessionsPerGroup: 1, batch: 1, rate: rate / 4},
		{name: "base at 4× the rate", processes: 1, streams: 1, groups: 1, sessionsPerGroup: 1, batch: 1, rate: rate * 4},
		{name: "batched produce (100 a call)", processes: 1, streams: 1, groups: 1, sessionsPerGroup: 1, batch: 100},
		{name: "instances: 2 of the group", processes: 2, streams: 1, groups: 1, sessionsPerGroup: 2, batch: 1},
		{name: "instances: 4 of the group", processes: 4, streams: 1, groups: 1, sessionsPerGroup: 4, batch: 1},
		{name: "groups: 4 read the stream", processes: 4, streams: 1, groups: 4, sessionsPerGroup: 1, batch: 1},
		{name: "groups: 16 read the stream", processes: 4, streams: 1, groups: 16, sessionsPerGroup: 1, batch: 1},
		{name: "streams: load over 10", processes: 4, streams: 10, groups: 1, sessionsPerGroup: 1, batch: 1},
		{name: fmt.Sprintf("streams: load over %d", many), processes: 4, streams: many, groups: 1, sessionsPerGroup: 1, batch: 1},
		{name: fmt.Sprintf("retained: stream holds %d rows", b.c.capacityRetained), processes: 1, streams: 1, groups: 1, sessionsPerGroup: 1, batch: 1, retained: b.c.capacityRetained},
		{name: fmt.Sprintf("idle: %d sessions, nothing produced", many), processes: 4, streams: many, groups: 1, sessionsPerGroup: 1, idle: true},
	}
	fmt.Printf("capacity: %d msg/s offered for %s per window (idle windows: %s with nothing produced)\n", rate, window, window)
	for i, sc := range scenarios {
		var runs []capacityRun
		for r := 1; r <= b.c.runs; r++ {
			offered := rate
			if sc.rate > 0 {
				offered = sc.rate
			}
			run, err := b.capacityWindow(ctx, fmt.Sprintf("cap%d_%d", i, r), sc, offered, window)
			if err != nil {
				return fmt.Errorf("capacity %q run %d: %w", sc.name, r, err)
			}
			run.Scenario = sc.name
			runs = append(runs, run)
			if sc.idle {
				fmt.Printf("  %-40s run %d/%d: %d sessions idle %.0f s: server %.0f µs, client %.0f µs CPU per session-second; %.1f connections a process\n",
					sc.name, r, b.c.runs, run.Sessions, run.Seconds, run.ServerCPUus, run.ClientCPUus, run.ConnsPerProcess)
			} else {
				fmt.Printf("  %-40s run %d/%d: %d messages, %d deliveries in %.1f s: server %.1f µs, client %.1f µs CPU, %.0f WAL bytes, %.2f WAL fsyncs a message; %.1f connections a process\n",
					sc.name, r, b.c.runs, run.Messages, run.Deliveries, run.Seconds, run.ServerCPUus, run.ClientCPUus, run.WALBytes, run.WALSyncs, run.ConnsPerProcess)
			}
		}
		b.rep.Capacity = append(b.rep.Capacity, capacityMedian(runs))
		b.rep.CapacityRuns = append(b.rep.CapacityRuns, runs...)
	}
	b.rep.CapacityRate, b.rep.CapacityWindow = rate, window.String()
	return nil
}

// capacityMedian is the field-wise median of a scenario's runs.
func capacityMedian(runs []capacityRun) capacityRun {
	m := runs[0]
	med := func(f func(capacityRun) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	m.Messages = int(med(func(r capacityRun) float64 { return float64(r.Messages) }))
	m.Deliveries = int(med(func(r capacityRun) float64 { return float64(r.Deliveries) }))
	m.Seconds = med(func(r capacityRun) float64 { return r.Seconds })
	m.ServerCPUus = med(func(r capacityRun) float64 { return r.ServerCPUus })
	m.ClientCPUus = med(func(r capacityRun) float64 { return r.ClientCPUus })
	m.WALBytes = med(func(r capacityRun) float64 { return r.WALBytes })
	m.WALSyncs = med(func(r capacityRun) float64 { return r.WALSyncs })
	m.ConnsPerProcess = med(func(r capacityRun) float64 { return r.ConnsPerProcess })
	m.ConnsPerSession = med(func(r capacityRun) float64 { return r.ConnsPerSession })
	return m
}

// walPosition reads the server's WAL insert position and its WAL sync
// count (pg_stat_wal, PostgreSQL 14 and later).
func (b *bench) walPosition(ctx context.Context) (lsn string, syncs int64, err error) {
	err = b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, (SELECT wal_sync FROM pg_stat_wal)").Scan(&lsn, &syncs)
	return lsn, syncs, err
}

// capacityWindow sets a scenario up under prefix (its own streams and
// groups), starts its sessions, and measures one window.
func (b *bench) capacityWindow(ctx context.Context, prefix string, sc capacityScenario, rate int, window time.Duration) (run capacityRun, err error) {
	run = capacityRun{Processes: sc.processes, Streams: sc.streams, Groups: sc.groups, Retained: sc.retained, Batch: sc.batch, Rate: rate}
	app := "bench-" + prefix
	// The processes: a client each, on its own pool.
	var clients []*sqlstreams.Client
	var pools []*pgxpool.Pool
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	newClient := func(name string) (*sqlstreams.Client, error) {
		cfg := b.pool.Config()
		cfg.MaxConns = 16
		cfg.ConnConfig.RuntimeParams["application_name"] = name
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		pools = append(pools, p)
		return sqlstreams.NewClient(ctx, p, b.clientConfig())
	}
	producer, err := newClient(app + "-producer")
	if err != nil {
		return run, err
	}
	for range sc.processes {
		c, err := newClient(app)
		if err != nil {
			return run, err
		}
		clients = append(clients, c)
	}
	// Streams and groups, registered through the producer's client.
	streams := make([]*sqlstreams.StreamHandle[Order], sc.streams)
	for i := range streams {
		name := fmt.Sprintf("bench.%s.s%d", prefix, i)
		s := sqlstreams.Stream[Order](producer, name)
		if err := s.Register(ctx, nil); err != nil {
			return run, err
		}
		if sc.retained > 0 {
			if err := b.fillRetained(ctx, name, sc.retained); err != nil {
				return run, err
			}
		}
		for g := range sc.groups {
			if _, err := s.Consumer(fmt.Sprintf("%s-s%d-g%d", prefix, i, g)).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartHead}); err != nil {
				return run, err
			}
		}
		streams[i] = s
	}
	// The sessions, spread over the processes; each counts its deliveries
	// into its stream's group counter.
	counts := make([][]atomic.Int64, sc.streams)
	for i := range counts {
		counts[i] = make([]atomic.Int64, sc.groups)
	}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, sc.streams*sc.groups*sc.sessionsPerGroup)
	defer func() {
		cancel()
		wg.Wait()
		close(errs)
		for e := range errs {
			if e != nil && err == nil {
				err = e
			}
		}
	}()
	n := 0
	// Starting thousands of sessions takes minutes on a small server: the
	// progress line says how far it got.
	var registered atomic.Int64
	stopOnce := progress(prefix+" sessions", "sessions", int64(sc.streams*sc.groups*sc.sessionsPerGroup), &registered)
	var once sync.Once
	stopProgress := func() { once.Do(stopOnce) }
	defer stopProgress()
	for si := range sc.streams {
		for g := range sc.groups {
			for range sc.sessionsPerGroup {
				client := clients[n%len(clients)]
				n++
				registered.Add(1)
				cons, err := sqlstreams.Stream[Order](client, fmt.Sprintf("bench.%s.s%d", prefix, si)).Consumer(fmt.Sprintf("%s-s%d-g%d", prefix, si, g)).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartHead})
				if err != nil {
					return run, err
				}
				counter := &counts[si][g]
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- cons.Consume(cctx, func(context.Context, *Order) error { counter.Add(1); return nil }, nil)
				}()
			}
		}
	}
	run.Sessions = n
	stopProgress()
	// Warm up: one message to each stream, handled by each of its groups.
	for _, s := range streams {
		if _, err := s.Produce(ctx, baseOrder, nil); err != nil {
			return run, err
		}
	}
	want := make([]int64, sc.streams)
	for i := range want {
		want[i] = 1
	}
	if err := waitHandled(ctx, counts, want, time.Minute); err != nil {
		return run, fmt.Errorf("warm-up: %w", err)
	}
	if sc.idle && sc.settle > 0 {
		sleep(sc.settle)
	}
	b.checkpoint(ctx)
	lsn0, sync0, err := b.walPosition(ctx)
	if err != nil {
		return run, err
	}
	c0, ok := b.cpuNow(ctx)
	if !ok {
		return run, errors.New("server CPU is not readable from /proc (the server is not local)")
	}
	start := wall.Now()
	if sc.idle {
		if err := b.windowStart(ctx, false); err != nil { // what the idle window itself runs
			return run, err
		}
		sleep(window) // the measurement is the window itself: nothing is produced
		if err := b.windowEnd(ctx, fmt.Sprintf("the idle window's statements (%s)", window)); err != nil {
			return run, err
		}
	} else {
		produced, err := produceAtRate(ctx, streams, rate, window, sc.batch)
		if err != nil {
			return run, err
		}
		for i := range want {
			want[i] += produced[i]
			run.Messages += int(produced[i])
		}
		run.Deliveries = run.Messages * sc.groups
		if err := waitHandled(ctx, counts, want, 2*time.Minute); err != nil {
			return run, err
		}
	}
	run.Seconds = wall.Since(start).Seconds()
	c1, _ := b.cpuNow(ctx)
	lsn1, sync1, err := b.walPosition(ctx)
	if err != nil {
		return run, err
	}
	var walBytes float64
	if err := b.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)", lsn1, lsn0).Scan(&walBytes); err != nil {
		return run, err
	}
	var conns int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&conns); err != nil {
		return run, err
	}
	run.ConnsPerProcess = float64(conns) / float64(sc.processes)
	run.ConnsPerSession = float64(conns) / float64(run.Sessions)
	per := float64(run.Messages)
	if sc.idle {
		per = float64(run.Sessions) * run.Seconds // per session-second
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / per }
	run.ServerCPUus, run.ClientCPUus = us(c1.server-c0.server), us(c1.client-c0.client)
	run.WALBytes, run.WALSyncs = walBytes/per, float64(sync1-sync0)/per
	return run, nil
}

// produceAtRate offers rate messages a second for window, spread round-robin
// over the streams, from produceWorkers goroutines, in calls of batch
// messages; it returns how many went to each stream.
func produceAtRate(ctx context.Context, streams []*sqlstreams.StreamHandle[Order], rate int, window time.Duration, batch int) ([]int64, error) {
	calls := max(1, int(float64(rate)*window.Seconds())/batch)
	every := window / time.Duration(calls)
	produced := make([]atomic.Int64, len(streams))
	items := make([]sqlstreams.BatchItem[Order], batch)
	for i := range items {
		items[i].Msg = baseOrder
	}
	start := wall.Now()
	err := eachCall(calls, func(c int) error {
		if d := start.Add(time.Duration(c) * every).Sub(wall.Now()); d > 0 {
			sleep(d) // paced: the offered rate, not the producers' maximum
		}
		s := c % len(streams)
		var err error
		if batch == 1 {
			_, err = streams[s].Produce(ctx, baseOrder, nil)
		} else {
			_, err = streams[s].ProduceBatch(ctx, items, nil)
		}
		if err == nil {
			produced[s].Add(int64(batch))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(streams))
	for i := range produced {
		out[i] = produced[i].Load()
	}
	return out, nil
}

// waitHandled waits until every group of stream i has handled want[i]
// messages, or fails after limit.
func waitHandled(ctx context.Context, counts [][]atomic.Int64, want []int64, limit time.Duration) error {
	deadline := wall.Now().Add(limit)
	for {
		short, done := 0, true
		for i, gs := range counts {
			for g := range gs {
				if gs[g].Load() < want[i] {
					done, short = false, i
				}
			}
		}
		if done {
			return nil
		}
		if wall.Now().After(deadline) {
			return fmt.Errorf("stream %d's groups did not handle their %d messages within %s", short, want[short], limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-after(10 * time.Millisecond):
		}
	}
}
