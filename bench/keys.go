package main

// The failures/keys family (-only keys): what failing handlers and per-key
// concurrency cost a burn-down. Every variant is the burn-down of -keysn
// messages by one instance with the burn-down's options, on a stream of its
// own, and is reported as a ratio to the parallel, failure-free baseline
// measured in the same process.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams"
)

// keysVariant is one workload of the family.
type keysVariant struct {
	key   string // report key
	tag   string // in progress lines
	short string // in ratio names
	name  string
	// failMod: a message whose index % failMod == 0 fails its first attempt
	// and succeeds on the retry. 0: nothing fails.
	failMod int
	// keys: messages are Exclusive with key "k<index % keys>". 0: Parallel,
	// no key.
	keys  int
	floor float64 // of the ratio to the baseline; 0 = none
	// parallel: the keyed messages are Parallel instead (a reference: what
	// carrying a key and an options document costs, without exclusivity).
	parallel bool
}

// keysVariants; the first is the baseline of the others.
var keysVariants = []keysVariant{
	{key: "keys_parallel", tag: "parallel", short: "parallel", name: "parallel, no failures (baseline)"},
	{key: "keys_fail_1pct", tag: "fail 1%", short: "1% failing once", name: "parallel, 1% fail their first attempt", failMod: 100},
	{key: "keys_fail_10pct", tag: "fail 10%", short: "10% failing once", name: "parallel, 10% fail their first attempt", failMod: 10, floor: 0.50},
	{key: "keys_exclusive_100", tag: "excl 100 keys", short: "exclusive, 100 keys", name: "exclusive, 100 distinct keys", keys: 100, floor: 0.60},
	{key: "keys_exclusive_10000", tag: "excl 10000 keys", short: "exclusive, 10,000 keys", name: "exclusive, 10,000 distinct keys", keys: 10000, floor: 0.85},
	{key: "keys_parallel_keyed", tag: "parallel keyed", short: "parallel, keyed (reference)", name: "parallel, 10,000 distinct keys (reference: a key's cost without exclusivity)", keys: 10000, parallel: true},
}

// keysGroupConfig is every variant's group: retries after a failure come 1ms
// later instead of the default 1s, so the failing variants time the retry
// path rather than the backoff. It changes nothing where nothing fails.
var keysGroupConfig = sqlstreams.ConsumerConfig{Start: sqlstreams.StartBeginning, ExceptionInitialBackoff: time.Millisecond}

// runStats are the consumer's counters after one run, and what the handler
// saw.
type runStats struct {
	Label      string  `json:"label"`
	Seconds    float64 `json:"seconds"`
	Succeeded  int64   `json:"succeeded"`
	Failed     int64   `json:"failed"`
	Retried    int64   `json:"retried"`
	Deferred   int64   `json:"deferred"`
	Dead       int64   `json:"dead"`
	Committed  int64   `json:"ranges_committed"`
	Duplicates int64   `json:"duplicates"`   // successful handler calls for a message that had already succeeded
	Overlaps   int64   `json:"key_overlaps"` // handler calls that started while another of the same key ran
	// KeyGates and KeyGatesGivenUp: the consumer's key gate counters
	// (decision 0051). Without a granted gate, every exclusive key is
	// leased with a row of its own.
	KeyGates        int64 `json:"key_gates"`
	KeyGatesGivenUp int64 `json:"key_gates_given_up"`
	// FirstSeconds is when the first handler call began, from the
	// Consume call: a run's start (registration, the first claim, and for
	// exclusive keys the key gate's acquisition), which weighs more in a
	// 0.25 s run at -keysn 20000 than in a 2.5 s one.
	FirstSeconds float64 `json:"first_seconds"`
}

func (s runStats) String() string {
	return fmt.Sprintf("%.1fs (first handler call after %.1f ms); succeeded %d, failed %d, retried %d, deferred %d, dead %d, ranges committed %d, duplicates %d, key overlaps %d, key gates %d (given up %d)",
		s.Seconds, 1000*s.FirstSeconds, s.Succeeded, s.Failed, s.Retried, s.Deferred, s.Dead, s.Committed, s.Duplicates, s.Overlaps, s.KeyGates, s.KeyGatesGivenUp)
}

var errPlanned = errors.New("bench: planned first-attempt failure")

func (b *bench) keys(ctx context.Context, newStream func(string) (*sqlstreams.StreamHandle[Order], error)) error {
	n := b.c.keysN
	fmt.Printf("failures/keys: -keysn %d messages per variant, each on a fresh stream with a fresh group; 1 instance, %s; backlogs are not timed\n", n, describeOptions(burnOptions))
	results := make([]*throughputResult, len(keysVariants))
	for i, v := range keysVariants {
		results[i] = b.rep.throughput(v.key, "failures/keys, 1 instance: "+v.name, "msg/s")
	}
	want := map[string]bool{}
	for _, k := range strings.Split(b.c.keysVariants, ",") {
		if k = strings.TrimSpace(k); k != "" {
			want["keys_"+k] = true
		}
	}
	for r := 1; r <= b.c.runs; r++ {
		for i, v := range keysVariants {
			if i > 0 && len(want) > 0 && !want[v.key] {
				continue
			}
			s, err := newStream(fmt.Sprintf("bench.keys.%s.%d", strings.TrimPrefix(v.key, "keys_"), r))
			if err != nil {
				return err
			}
			if _, err := produceKeyed(ctx, s, n, v.keys, v.parallel, fmt.Sprintf("keys %s backlog", v.tag)); err != nil {
				return err
			}
			b.checkpoint(ctx)
			label := fmt.Sprintf("keys %s run %d/%d", v.tag, r, b.c.runs)
			av0 := b.autovacuums(ctx)
			// With -statements, each run's own statements: the keyed runs'
			// rates differ by half from run to run on a slow host (the keys runs
			// at 83f4b7e: bench/results/INDEX.md).
			if err := b.windowStart(ctx, true); err != nil {
				return err
			}
			c0, _ := b.cpuNow(ctx)
			rate, st, err := keysBurn(ctx, s, fmt.Sprintf("keys-%s-run%d", strings.TrimPrefix(v.key, "keys_"), r), v, n, label)
			if err != nil {
				return err
			}
			c1, ok := b.cpuNow(ctx)
			if err := b.windowEnd(ctx, label+", its statements"); err != nil {
				return err
			}
			if av := autovacuumed(av0, b.autovacuums(ctx)); len(av) > 0 {
				fmt.Printf("  %-34s autovacuumed or autoanalyzed during the run: %s\n", "", strings.Join(av, ", "))
			}
			results[i].add(label, rate)
			results[i].addCPU(c0, c1, ok, n)
			if ok {
				fmt.Printf("  %-34s CPU a message: %s\n", "", c0.perMessage(c1, n))
			}
			results[i].RunStats = append(results[i].RunStats, st)
		}
	}
	return nil
}

func describeOptions(o sqlstreams.ConsumeOptions) string {
	return fmt.Sprintf("BatchLimit %d, QueueSize %d, MessageConcurrency %d, ClaimPollRate %s",
		o.BatchLimit, o.QueueSize, o.MessageConcurrency, o.ClaimPollRate)
}

// produceKeyed writes n messages numbered 0..n-1 (the number is the
// message's OrderID) with ProduceBatch calls of produceBatchLen items from
// produceWorkers goroutines. With keys > 0 every message is Exclusive (or
// Parallel, with unordered), keyed "k<number % keys>".
func produceKeyed(ctx context.Context, s *sqlstreams.StreamHandle[Order], n, keys int, unordered bool, label string) (float64, error) {
	var opts *sqlstreams.BatchOptions
	if keys > 0 {
		c := sqlstreams.Exclusive
		if unordered {
			c = sqlstreams.Parallel
		}
		opts = &sqlstreams.BatchOptions{Message: &sqlstreams.MessageOptions{Concurrency: c}}
	}
	return parallel(ctx, n, produceBatchLen, label, func(ctx context.Context, first, k int) error {
		items := make([]sqlstreams.BatchItem[Order], k)
		for j := range items {
			i := first + j
			items[j].Msg = baseOrder
			items[j].Msg.OrderID = int64(i)
			if keys > 0 {
				items[j].Key = fmt.Sprintf("k%d", i%keys)
			}
		}
		_, err := s.ProduceBatch(ctx, items, opts)
		return err
	})
}

// keysBurn times a fresh group (keysGroupConfig) consuming the n messages of
// s with one Consume call, from that call until every message has succeeded
// once. Planned failures return an error on a message's first attempt only.
func keysBurn(ctx context.Context, s *sqlstreams.StreamHandle[Order], group string, v keysVariant, n int, label string) (float64, runStats, error) {
	cfg := keysGroupConfig
	cons, err := s.Consumer(group).Register(ctx, &cfg)
	if err != nil {
		return 0, runStats{}, err
	}
	attempts := make([]atomic.Int32, n)
	succeeded := make([]atomic.Bool, n)
	var running []atomic.Int32 // per key: handler calls in progress
	if v.keys > 0 {
		running = make([]atomic.Int32, v.keys)
	}
	var count, dups, overlaps, strays atomic.Int64
	var firstNs atomic.Int64 // the first handler call, after start
	var start time.Time      // set before Consume is called
	all := make(chan struct{})
	handler := func(ctx context.Context, m *Order) error {
		if firstNs.Load() == 0 {
			firstNs.CompareAndSwap(0, max(int64(wall.Since(start)), 1))
		}
		i := int(m.OrderID)
		if i < 0 || i >= n {
			strays.Add(1)
			return nil
		}
		if running != nil {
			k := &running[i%v.keys]
			if k.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer k.Add(-1)
		}
		if attempts[i].Add(1) == 1 && v.failMod > 0 && i%v.failMod == 0 {
			return errPlanned
		}
		if succeeded[i].Swap(true) {
			dups.Add(1)
		} else if count.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1)
	stop := progress(label, "msgs", int64(n), &count)
	start = wall.Now()
	go func() {
		opts := burnOptions
		errs <- cons.Consume(cctx, handler, &opts)
	}()
	var elapsed time.Duration
	returned, failed := false, error(nil)
	select {
	case <-all:
		elapsed = wall.Since(start)
	case err := <-errs:
		returned, failed = true, fmt.Errorf("the instance returned early: %v", err)
	case <-after(burnTimeout):
		failed = fmt.Errorf("timed out after %s with %d of %d succeeded", burnTimeout, count.Load(), n)
	case <-ctx.Done():
		failed = ctx.Err()
	}
	stop()
	cancel()
	if !returned {
		if err := <-errs; err != nil && failed == nil && !errors.Is(err, context.Canceled) {
			failed = err
		}
	}
	if failed != nil {
		return 0, runStats{}, fmt.Errorf("%s: %w", label, failed)
	}
	c := cons.Stats()
	st := runStats{Label: label, Seconds: elapsed.Seconds(), Succeeded: c.Succeeded, Failed: c.Failed, Retried: c.Retried,
		Deferred: c.Deferred, Dead: c.Dead, Committed: c.Committed, Duplicates: dups.Load(), Overlaps: overlaps.Load(),
		KeyGates: c.KeyGates, KeyGatesGivenUp: c.KeyGatesGivenUp, FirstSeconds: float64(firstNs.Load()) / 1e9}
	planned := 0
	if v.failMod > 0 {
		planned = (n + v.failMod - 1) / v.failMod
	}
	switch {
	case strays.Load() > 0:
		return 0, st, fmt.Errorf("%s: %d messages that this run did not produce", label, strays.Load())
	case c.Dead > 0:
		return 0, st, fmt.Errorf("%s: %d dead letters", label, c.Dead)
	case c.Failed < int64(planned):
		// The counters are updated after the handler returns; the last
		// few may lag the moment all succeeded.
		fmt.Printf("  %-34s note: %d failures counted, %d planned\n", "", c.Failed, planned)
	}
	rate := report1(label, "msgs", n, elapsed)
	fmt.Printf("  %-34s %s\n", "", st)
	return rate, st, nil
}

// keysMarkdown is the family's per-run counters for latest.md.
func (r *report) keysMarkdown() string {
	var b strings.Builder
	for _, t := range r.Results {
		for _, s := range t.RunStats {
			if b.Len() == 0 {
				b.WriteString("| failures/keys run | seconds | succeeded | failed | retried | deferred | ranges committed | duplicates | key overlaps | key gates (given up) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			}
			fmt.Fprintf(&b, "| %s | %.1f | %d | %d | %d | %d | %d | %d | %d | %d (%d) |\n", s.Label, s.Seconds, s.Succeeded, s.Failed,
				s.Retried, s.Deferred, s.Committed, s.Duplicates, s.Overlaps, s.KeyGates, s.KeyGatesGivenUp)
		}
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
