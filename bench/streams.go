package main

// The sqlstreams workloads: produce (single and batched), burn-down of a
// backlog by one and by four instances of a group, and end-to-end latency.
// The failures/keys family is in keys.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5"
)

const (
	produceWorkers  = 4
	produceBatchLen = 100
	burnTimeout     = 15 * time.Minute
)

// burnOptions are the burn-down's instance options.
var burnOptions = sqlstreams.ConsumeOptions{BatchLimit: 1000, QueueSize: 2000, MessageConcurrency: 8, ClaimPollRate: 5 * time.Millisecond}

// benchDecoder is the Decoder of the harness's clients and of the PgQ
// consumer: go-json, as the recorded figures were measured with (it was the
// default until decision 0086; StandardJSON, the default now, costs about
// 5.5 times as much a decode: decision 0033).
type benchDecoder = sqlstreams.FastJSON

// clientConfig is the harness's client configuration.
func (b *bench) clientConfig() *sqlstreams.ClientConfig {
	return &sqlstreams.ClientConfig{Schema: "sqlstreams_bench", Logger: b.logger, Decoder: benchDecoder{}}
}

func (b *bench) streams(ctx context.Context) error {
	client, err := sqlstreams.NewClient(ctx, b.pool, b.clientConfig())
	if err != nil {
		return err
	}
	newStream := func(name string) (*sqlstreams.StreamHandle[Order], error) {
		s := sqlstreams.Stream[Order](client, name)
		return s, s.Register(ctx, nil)
	}
	var backlog *sqlstreams.StreamHandle[Order]
	if b.c.want("produce") {
		single := b.rep.throughput("produce_single", fmt.Sprintf("sqlstreams Produce, single messages, %d goroutines, %d messages", produceWorkers, b.c.singles), "msg/s")
		for r := 1; r <= b.c.runs; r++ {
			s, err := newStream(fmt.Sprintf("bench.single.%d", r))
			if err != nil {
				return err
			}
			b.checkpoint(ctx)
			label := fmt.Sprintf("produce single run %d/%d", r, b.c.runs)
			c0, _ := b.cpuNow(ctx)
			rate, err := produceSingle(ctx, s, b.c.singles, label)
			if err != nil {
				return err
			}
			c1, ok := b.cpuNow(ctx)
			single.add(label, rate)
			single.addCPU(c0, c1, ok, b.c.singles)
		}
		batch := b.rep.throughput("produce_batch", fmt.Sprintf("sqlstreams ProduceBatch, %d items/call, %d goroutines", produceBatchLen, produceWorkers), "msg/s")
		for r := 1; r <= b.c.runs; r++ {
			s, err := newStream(fmt.Sprintf("bench.batch.%d", r))
			if err != nil {
				return err
			}
			b.checkpoint(ctx)
			label := fmt.Sprintf("produce batch run %d/%d", r, b.c.runs)
			c0, _ := b.cpuNow(ctx)
			rate, err := produceBatch(ctx, s, b.c.n, label)
			if err != nil {
				return err
			}
			c1, ok := b.cpuNow(ctx)
			batch.addCPU(c0, c1, ok, b.c.n)
			batch.add(label, rate)
			backlog = s // the last run's stream holds exactly n messages
		}
		b.lap("produce")
	}
	ensureBacklog := func() error {
		if backlog != nil {
			return nil
		}
		if backlog, err = newStream("bench.backlog"); err != nil {
			return err
		}
		_, err := produceBatch(ctx, backlog, b.c.n, "backlog (not timed)")
		return err
	}
	if b.c.want("burndown") {
		if err := ensureBacklog(); err != nil {
			return err
		}
		fmt.Printf("burn-down reads stream %q (%d messages) with a fresh group per run\n", backlog.Name(), b.c.n)
		insts := []int{1, 2, 4}
		res := map[int]*throughputResult{}
		for _, inst := range insts {
			name := fmt.Sprintf("sqlstreams burn-down, %d instances in one process", inst)
			if inst == 1 {
				name = "sqlstreams burn-down, 1 instance"
			}
			res[inst] = b.rep.throughput(fmt.Sprintf("burndown_%d", inst), name, "msg/s")
		}
		// The same with a json.RawMessage handler: what the typed decode costs.
		rawRes := b.rep.throughput("burndown_raw_4", "sqlstreams burn-down, 4 instances, json.RawMessage handler (no decode)", "msg/s")
		// And with a transactional handler writing one row a message
		// (ConsumeTx, decision 0087): exactly-once effects' cost.
		txRes := b.rep.throughput("burndown_tx_4", "sqlstreams transactional burn-down, 4 instances, typed, one row written a message", "msg/s")
		for r := 1; r <= b.c.runs; r++ {
			for _, inst := range insts {
				b.checkpoint(ctx)
				label := fmt.Sprintf("burn-down %d instance(s) run %d/%d", inst, r, b.c.runs)
				c0, _ := b.cpuNow(ctx)
				rate, err := burnDown(ctx, backlog, fmt.Sprintf("burn%d-run%d", inst, r), inst, b.c.n, label)
				if err != nil {
					return err
				}
				c1, ok := b.cpuNow(ctx)
				res[inst].add(label, rate)
				res[inst].addCPU(c0, c1, ok, b.c.n)
				if ok {
					fmt.Printf("  %-34s CPU a message: %s\n", "", c0.perMessage(c1, b.c.n))
				}
			}
			b.checkpoint(ctx)
			label := fmt.Sprintf("burn-down 4 raw run %d/%d", r, b.c.runs)
			cons, err := sqlstreams.Stream[json.RawMessage](client, backlog.Name()).Consumer(fmt.Sprintf("burnraw-run%d", r)).
				Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartBeginning})
			if err != nil {
				return err
			}
			c0, _ := b.cpuNow(ctx)
			rate, err := runBurn(ctx, cons, 4, b.c.n, label)
			if err != nil {
				return err
			}
			c1, ok := b.cpuNow(ctx)
			rawRes.add(label, rate)
			rawRes.addCPU(c0, c1, ok, b.c.n)
			if ok {
				fmt.Printf("  %-34s CPU a message: %s\n", "", c0.perMessage(c1, b.c.n))
			}

			b.checkpoint(ctx)
			label = fmt.Sprintf("burn-down 4 tx run %d/%d", r, b.c.runs)
			txCons, err := backlog.Consumer(fmt.Sprintf("burntx-run%d", r)).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartBeginning})
			if err != nil {
				return err
			}
			table := fmt.Sprintf("%s.tx_effects_run%d", client.Schema(), r)
			if _, err := b.pool.Exec(ctx, "CREATE TABLE "+table+" (order_id bigint NOT NULL, customer text NOT NULL)"); err != nil {
				return err
			}
			c0, _ = b.cpuNow(ctx)
			rate, err = runBurnTx(ctx, txCons, 4, b.c.n, table, label)
			if err != nil {
				return err
			}
			c1, ok = b.cpuNow(ctx)
			txRes.add(label, rate)
			txRes.addCPU(c0, c1, ok, b.c.n)
			if ok {
				fmt.Printf("  %-34s CPU a message: %s\n", "", c0.perMessage(c1, b.c.n))
			}
			if _, err := b.pool.Exec(ctx, "DROP TABLE "+table); err != nil {
				return err
			}
		}
		b.lap("burndown")
	}
	if b.c.want("latency") {
		// The offered loads are fractions of our maximum single-message
		// produce rate, measured in this run (or now, untimed, when the
		// produce workload did not run); -rate overrides with one load.
		maxRate := 0.0
		if t := b.rep.find("produce_single"); t != nil {
			maxRate = median(t.Runs)
		} else if b.c.rate == 0 {
			s, err := newStream("bench.latency.max")
			if err != nil {
				return err
			}
			if maxRate, err = produceSingle(ctx, s, b.c.singles, "single produce, for the latency loads (not a result)"); err != nil {
				return err
			}
		}
		type load struct {
			pct  int
			rate int
		}
		var loads []load
		if b.c.rate > 0 {
			loads = []load{{0, b.c.rate}}
		} else {
			for _, pct := range []int{10, 50, 90} {
				loads = append(loads, load{pct, max(1, int(maxRate*float64(pct)/100))})
			}
		}
		lat := make([]*latencyResult, len(loads))
		floor := make([]*latencyResult, len(loads))
		for i, l := range loads {
			name := fmt.Sprintf("end-to-end latency, 1 instance, %d msg/s offered", l.rate)
			if l.pct > 0 {
				name = fmt.Sprintf("end-to-end latency, 1 instance, %d%% of max single produce (%d msg/s)", l.pct, l.rate)
			}
			lat[i] = b.rep.latency(fmt.Sprintf("latency_%d", l.pct), name, sqlstreams.DefaultClaimPollRate, l.rate, b.c.latencyFor)
			floor[i] = b.rep.latency(fmt.Sprintf("latency_floor_%d", l.pct),
				fmt.Sprintf("floor: INSERT + NOTIFY, read by a LISTENing connection, %d msg/s", l.rate), 0, l.rate, b.c.latencyFor)
		}
		for r := 1; r <= b.c.runs; r++ {
			for i, l := range loads {
				b.checkpoint(ctx)
				frun, err := b.latencyFloor(ctx, l.rate, b.c.latencyFor, fmt.Sprintf("floor %d msg/s run %d/%d", l.rate, r, b.c.runs))
				if err != nil {
					return err
				}
				floor[i].Runs = append(floor[i].Runs, frun)
				s, err := newStream(fmt.Sprintf("bench.latency.%d.%d", l.pct, r))
				if err != nil {
					return err
				}
				b.checkpoint(ctx)
				label := fmt.Sprintf("latency %d msg/s run %d/%d", l.rate, r, b.c.runs)
				run, err := latency(ctx, s, sqlstreams.DefaultClaimPollRate, l.rate, b.c.latencyFor, label)
				if err != nil {
					return err
				}
				lat[i].Runs = append(lat[i].Runs, run)
			}
		}
		b.lap("latency")
	}
	if b.c.want("fanout") {
		if err := ensureBacklog(); err != nil {
			return err
		}
		per := min(b.c.fanoutN, b.c.n)
		fmt.Printf("fan-out: each group reads the first %d messages of stream %q, fresh groups per run, 1 instance each\n", per, backlog.Name())
		groups := []int{1, 4, 16}
		res := make([]*throughputResult, len(groups))
		for i, g := range groups {
			res[i] = b.rep.throughput(fmt.Sprintf("fanout_%d", g), fmt.Sprintf("fan-out: %d group(s) read %d messages each at once, deliveries in total", g, per), "deliveries/s")
		}
		for r := 1; r <= b.c.runs; r++ {
			for i, g := range groups {
				b.checkpoint(ctx)
				label := fmt.Sprintf("fan-out %d group(s) run %d/%d", g, r, b.c.runs)
				rate, err := fanOut(ctx, backlog, fmt.Sprintf("fan%d-run%d", g, r), g, per, label)
				if err != nil {
					return err
				}
				res[i].add(label, rate)
			}
		}
		b.lap("fanout")
	}
	if b.c.want("selective") {
		for r := 1; r <= b.c.runs; r++ {
			rate := b.c.rate
			if rate == 0 {
				rate = 500
			}
			x, err := b.selective(ctx, newStream, rate, b.c.latencyFor, r)
			if err != nil {
				return fmt.Errorf("selective: %w", err)
			}
			b.rep.Selective = append(b.rep.Selective, x)
		}
		b.lap("selective")
	}
	// Last, so the workloads above run exactly as they did before it existed.
	if b.c.want("keys") {
		if err := b.keys(ctx, newStream); err != nil {
			return fmt.Errorf("failures/keys: %w", err)
		}
		b.lap("keys")
	}
	if b.c.want("growth") {
		var sizes []int
		for _, f := range strings.Split(b.c.growth, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("-growth %q: want comma-separated row counts", b.c.growth)
			}
			sizes = append(sizes, n)
		}
		if err := b.growth(ctx, newStream, sizes); err != nil {
			return fmt.Errorf("growth: %w", err)
		}
		b.lap("growth")
	}
	return b.deadTuples(ctx)
}

// produceSingle sends n messages with one Produce call each from
// produceWorkers goroutines.
func produceSingle(ctx context.Context, s *sqlstreams.StreamHandle[Order], n int, label string) (float64, error) {
	return parallel(ctx, n, 1, label, func(ctx context.Context, _, k int) error {
		_, err := s.Produce(ctx, baseOrder, nil)
		return err
	})
}

// produceBatch sends n messages with ProduceBatch calls of produceBatchLen
// items from produceWorkers goroutines.
func produceBatch(ctx context.Context, s *sqlstreams.StreamHandle[Order], n int, label string) (float64, error) {
	items := make([]sqlstreams.BatchItem[Order], produceBatchLen)
	for i := range items {
		items[i].Msg = baseOrder
	}
	return parallel(ctx, n, produceBatchLen, label, func(ctx context.Context, _, k int) error {
		_, err := s.ProduceBatch(ctx, items[:k], nil)
		return err
	})
}

// parallel runs call from produceWorkers goroutines until n messages, in
// calls of per messages, are written, and returns messages per second. A call
// writes k messages, numbered first to first+k-1 of the n.
func parallel(ctx context.Context, n, per int, label string, call func(ctx context.Context, first, k int) error) (float64, error) {
	var done atomic.Int64
	stop := progress(label, "msgs", int64(n), &done)
	start := wall.Now()
	err := eachCall((n+per-1)/per, func(c int) error {
		k := min(per, n-c*per)
		if err := call(ctx, c*per, k); err != nil {
			return err
		}
		done.Add(int64(k))
		return nil
	})
	elapsed := wall.Since(start)
	stop()
	if err != nil {
		return 0, err
	}
	return report1(label, "msgs", n, elapsed), nil
}

// eachCall runs do(0) … do(calls-1) from produceWorkers goroutines, each
// taking the next index, and stops at the first error, which it returns.
func eachCall(calls int, do func(c int) error) error { return eachOf(calls, produceWorkers, do) }

// burnDown times a fresh group consuming the whole backlog of n messages
// with the given number of Consume calls, from the first Consume call until
// the n-th handler call.
func burnDown(ctx context.Context, s *sqlstreams.StreamHandle[Order], group string, instances, n int, label string) (float64, error) {
	cons, err := s.Consumer(group).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartBeginning})
	if err != nil {
		return 0, err
	}
	return runBurn(ctx, cons, instances, n, label)
}

// runBurn runs instances instances of cons until n messages were handled.
func runBurn[T any](ctx context.Context, cons *sqlstreams.Consumer[T], instances, n int, label string) (float64, error) {
	var count atomic.Int64
	all := make(chan struct{})
	handler := func(ctx context.Context, m *T) error {
		if count.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}
	return burnWith(ctx, cons, instances, n, label, &count, all, func(ctx context.Context) error {
		opts := burnOptions
		return cons.Consume(ctx, handler, &opts)
	})
}

// runBurnTx runs instances transactional sessions of cons until n messages
// were handled, each handler inserting one row into table in the
// transaction that settles its message. A handler call is counted when it
// returns: its transaction commits a little later, with its batch.
func runBurnTx(ctx context.Context, cons *sqlstreams.Consumer[Order], instances, n int, table, label string) (float64, error) {
	var count atomic.Int64
	all := make(chan struct{})
	insert := "INSERT INTO " + table + " (order_id, customer) VALUES ($1, $2)"
	handler := func(ctx context.Context, tx pgx.Tx, m *Order) error {
		if _, err := tx.Exec(ctx, insert, m.OrderID, m.Customer); err != nil {
			return err
		}
		if count.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}
	return burnWith(ctx, cons, instances, n, label, &count, all, func(ctx context.Context) error {
		opts := burnOptions
		opts.MessageConcurrency = 4 // each worker holds a connection for its transaction
		return cons.ConsumeTx(ctx, handler, &opts)
	})
}

// burnWith runs consume as instances sessions of cons until all is closed
// (count reached n), and reports the rate; a handler failure fails the run.
func burnWith[T any](ctx context.Context, cons *sqlstreams.Consumer[T], instances, n int, label string, count *atomic.Int64, all <-chan struct{}, consume func(context.Context) error) (float64, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, instances)
	stop := progress(label, "msgs", int64(n), count)
	start := wall.Now()
	for range instances {
		go func() { errs <- consume(cctx) }()
	}
	elapsed, err := awaitRun(ctx, start, all, errs, instances, count, int64(n), "handled", stop, cancel)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", label, err)
	}
	if st := cons.Stats(); st.Failed > 0 {
		return 0, fmt.Errorf("%s: %d handler failures", label, st.Failed)
	}
	rate := report1(label, "msgs", n, elapsed)
	if extra := count.Load() - int64(n); extra > 0 {
		fmt.Printf("  %-34s note: %d messages delivered more than once\n", "", extra)
	}
	return rate, nil
}

// awaitRun waits until all is closed (the run's work is done), an instance
// returns early, burnTimeout passes or ctx ends; then it stops the progress
// line, cancels the instances and collects every one's return. It returns
// the time from start to all's closing.
func awaitRun(ctx context.Context, start time.Time, all <-chan struct{}, errs <-chan error, instances int, count *atomic.Int64, total int64, done string, stop, cancel func()) (time.Duration, error) {
	var elapsed time.Duration
	returned, failed := 0, error(nil)
	select {
	case <-all:
		elapsed = wall.Since(start)
	case err := <-errs: // an instance stopped before the work was done
		returned, failed = 1, fmt.Errorf("an instance returned early: %v", err)
	case <-after(burnTimeout):
		failed = fmt.Errorf("timed out after %s with %d of %d %s", burnTimeout, count.Load(), total, done)
	case <-ctx.Done():
		failed = ctx.Err()
	}
	stop()
	cancel()
	for ; returned < instances; returned++ {
		if err := <-errs; err != nil && failed == nil && !errors.Is(err, context.Canceled) {
			failed = err
		}
	}
	return elapsed, failed
}

// latencySenders is how many goroutines share the latency workloads'
// schedule. More do not raise the achieved rate on two cores, and they
// lengthen the latency: with 32, p50 at 50% load went from 8.5 to 28 ms, as
// notifying commits serialize and more produce transactions hold the claim
// gate's xmin back (BENCHMARKS.md at 0b447e5).
const latencySenders = 8

// latency produces single messages at rate per second for dur to a fresh
// stream that one instance consumes, each message carrying the time its
// Produce call started, and reports the spread of time-to-handler.
func latency(ctx context.Context, s *sqlstreams.StreamHandle[Order], poll time.Duration, rate int, dur time.Duration, label string) (latencyRun, error) {
	// Group names are unique in a schema, across streams.
	cons, err := s.Consumer("latency-"+s.Name()).Register(ctx, nil)
	if err != nil {
		return latencyRun{}, err
	}
	total := int(float64(rate) * dur.Seconds())
	var mu sync.Mutex
	samples := make([]time.Duration, 0, total)
	var handled atomic.Int64
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consumed := make(chan error, 1)
	go func() {
		consumed <- cons.Consume(cctx, func(ctx context.Context, m *Order) error {
			d := wall.Since(time.Unix(0, m.SentAt))
			mu.Lock()
			samples = append(samples, d)
			mu.Unlock()
			handled.Add(1)
			return nil
		}, &sqlstreams.ConsumeOptions{ClaimPollRate: poll})
	}()
	sleep(time.Second) // let the instance come up before the clock starts

	stop := progress(label, "msgs", int64(total), &handled)
	defer stop()
	produceFor, err := paced(ctx, rate, total, func() error {
		o := baseOrder
		o.SentAt = wall.Now().UnixNano()
		_, err := s.Produce(ctx, o, nil)
		return err
	})
	if err != nil {
		return latencyRun{}, err
	}
	deadline := wall.Now().Add(30 * time.Second)
	for handled.Load() < int64(total) && wall.Now().Before(deadline) && ctx.Err() == nil {
		sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
		return latencyRun{}, err
	}
	if h := handled.Load(); h < int64(total) {
		return latencyRun{}, fmt.Errorf("%s: %d of %d messages handled 30s after the last produce", label, h, total)
	}
	mu.Lock()
	defer mu.Unlock()
	return summarize(label, samples, float64(total)/produceFor.Seconds()), nil
}
