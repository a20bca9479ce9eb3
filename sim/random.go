package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
)

// step is one kind of random step and its weight.
type step struct {
	weight int
	name   string
	do     func(ctx context.Context, w *World) error
}

var steps = []step{
	{12, "produce", func(ctx context.Context, w *World) error {
		n := 1 + w.rng.IntN(4)
		switch r := w.rng.IntN(10); {
		case r < 4:
			return w.Produce(ctx, n, "", "", "")
		case r < 7:
			return w.Produce(ctx, n, fmt.Sprintf("x%d", w.rng.IntN(3)), policy.Exclusive, "")
		default:
			return w.Produce(ctx, n, fmt.Sprintf("o%d", w.rng.IntN(2)), policy.Ordered, "")
		}
	}},
	{2, "begin", func(ctx context.Context, w *World) error {
		if len(w.open) < 2 {
			return w.Begin(ctx, 1+w.rng.IntN(3))
		}
		return nil
	}},
	{3, "commit", func(ctx context.Context, w *World) error { return w.Commit(ctx) }},
	{25, "claim", func(ctx context.Context, w *World) error {
		if in := w.pick(w.consumers()); in != nil {
			// Mostly the acquisition comes back before anything else
			// happens; a third of the time other steps run in between.
			if w.rng.IntN(3) > 0 {
				return w.Claim(ctx, in)
			}
			return w.claim(ctx, in)
		}
		return nil
	}},
	{6, "acquire", func(ctx context.Context, w *World) error {
		var pending []*instance
		for _, in := range w.consumers() {
			if in.cl.Acquiring() {
				pending = append(pending, in)
			}
		}
		if in := w.pick(pending); in != nil {
			return w.Acquire(ctx, in)
		}
		return nil
	}},
	{30, "run", func(ctx context.Context, w *World) error {
		if in := w.pick(w.withJobs(false)); in != nil {
			return w.RunOne(ctx, in, false, "")
		}
		return nil
	}},
	{8, "retry", func(ctx context.Context, w *World) error {
		if in := w.pick(w.consumers()); in != nil {
			return w.Retry(ctx, in)
		}
		return nil
	}},
	{12, "runretry", func(ctx context.Context, w *World) error {
		if in := w.pick(w.withJobs(true)); in != nil {
			return w.RunOne(ctx, in, true, "")
		}
		return nil
	}},
	{8, "advance", func(ctx context.Context, w *World) error {
		return w.Advance(ctx, time.Duration(w.rng.IntN(1500))*time.Millisecond, 0.3)
	}},
	{2, "crash", func(ctx context.Context, w *World) error {
		if in := w.pick(w.live()); in != nil {
			w.Crash(in)
		}
		return nil
	}},
	{2, "start", func(ctx context.Context, w *World) error {
		if len(w.live()) < 4 {
			_, err := w.Start(ctx, nil)
			return err
		}
		return nil
	}},
	{1, "stall", func(ctx context.Context, w *World) error {
		if in := w.pick(w.consumers()); in != nil {
			// Mostly past the TTL (the instance lapses and must come back
			// as a new incarnation), sometimes within it (it goes on).
			ttl := w.opts.TTL
			d := ttl/2 + time.Duration(w.rng.Int64N(int64(ttl/2)))
			if w.rng.IntN(10) < 7 {
				d = ttl + time.Duration(w.rng.Int64N(int64(2*ttl)))
			}
			w.Stall(in, d.Round(100*time.Millisecond))
		}
		return nil
	}},
	{1, "stop", func(ctx context.Context, w *World) error {
		if in := w.pick(w.awake()); in != nil {
			return w.Stop(ctx, in)
		}
		return nil
	}},
	{4, "flush", func(ctx context.Context, w *World) error {
		if in := w.pick(w.consumers()); in != nil {
			return w.Flush(ctx, in)
		}
		return nil
	}},
	{1, "reconcile", func(ctx context.Context, w *World) error {
		if in := w.pick(w.consumers()); in != nil {
			return w.Reconcile(ctx, in)
		}
		return nil
	}},
	{1, "redeclare", func(ctx context.Context, w *World) error {
		d := w.declared
		d.Message.MaxRetries = 1 + w.rng.IntN(5)
		w.tracef("config declared: max_retries=%d", d.Message.MaxRetries)
		return w.declare(ctx, d)
	}},
}

func (w *World) pick(ins []*instance) *instance {
	if len(ins) == 0 {
		return nil
	}
	return ins[w.rng.IntN(len(ins))]
}

func (w *World) withJobs(exc bool) []*instance {
	var out []*instance
	for _, in := range w.consumers() {
		if (!exc && len(in.jobs) > 0) || (exc && len(in.exJobs) > 0) {
			out = append(out, in)
		}
	}
	return out
}

// RandomStep takes one step chosen by the PRNG.
func (w *World) RandomStep(ctx context.Context) error {
	weight := func(s step) int {
		if v, ok := w.opts.Weights[s.name]; ok {
			return v
		}
		return s.weight
	}
	total := 0
	for _, s := range steps {
		total += weight(s)
	}
	r := w.rng.IntN(total)
	for _, s := range steps {
		if r < weight(s) {
			if err := s.do(ctx, w); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			return nil
		}
		r -= weight(s)
	}
	return nil
}

// RunRandom starts two instances, takes n random steps checking the
// invariants after each, then settles: every message must end handled or
// dead.
func (w *World) RunRandom(ctx context.Context, n int) error {
	// Two instances, or, for a third of the seeds, one: a group with a
	// single session is the one whose range claimer takes the key gate
	// (decision 0051), and gives it up when another starts.
	first := 2
	if w.seed%3 == 0 {
		first = 1
	}
	for range first {
		if _, err := w.Start(ctx, nil); err != nil {
			return err
		}
	}
	for i := range n {
		if err := w.RandomStep(ctx); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		if err := w.Check(ctx); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	if len(w.consumers()) == 0 {
		if _, err := w.Start(ctx, nil); err != nil {
			return err
		}
	}
	for len(w.open) > 0 {
		if err := w.Commit(ctx); err != nil {
			return err
		}
	}
	w.tracef("calm: settling")
	if err := w.Settle(ctx, 400); err != nil {
		return err
	}
	sum, err := w.Summary(ctx)
	if err != nil {
		return err
	}
	w.tracef("end: %s", sum)
	return nil
}
