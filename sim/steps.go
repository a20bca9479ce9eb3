package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/policy"
)

// The steps an instance's actors take: claims, key acquisitions, handler
// runs and their outcomes, retries, flushes and reconciles.

// handOut records jobs leaving a claimer: keyed ones count as in flight.
func (w *World) handOut(in *instance, jobs []claimer.Job, exc bool) error {
	for _, j := range jobs {
		m := w.byID[j.Delivery.Msg.ID]
		if m == nil {
			return fmt.Errorf("%s was handed message id %d, which the simulator never produced", in.name, j.Delivery.Msg.ID)
		}
		if err := w.checkHandOut(in, j, m); err != nil {
			return err
		}
		if j.Delivery.Concurrency.Keyed() && m.key != "" {
			w.inFlight[m.key]++
		}
		src := "range"
		if exc {
			src = "retry"
		}
		w.tracef("%s %s hands out m%d attempt %d", in.name, src, m.n, j.Delivery.Attempt)
	}
	if exc {
		in.exJobs = append(in.exJobs, jobs...)
	} else {
		in.jobs = append(in.jobs, jobs...)
	}
	return nil
}

func (w *World) finish(j claimer.Job) {
	m := w.byID[j.Delivery.Msg.ID]
	if j.Delivery.Concurrency.Keyed() && m.key != "" {
		w.inFlight[m.key]--
	}
}

// Claim makes one range claim for the instance and applies the key
// acquisitions pending at once.
func (w *World) Claim(ctx context.Context, in *instance) error {
	if err := w.claim(ctx, in); err != nil {
		return err
	}
	for in.cl.Acquiring() {
		if err := w.Acquire(ctx, in); err != nil {
			return err
		}
	}
	return nil
}

// Acquire applies the oldest key acquisition an instance's claims left
// pending, as the serve loop does when the acquisition it ran on another
// connection comes back: the messages queued behind its keys start or park.
func (w *World) Acquire(ctx context.Context, in *instance) error {
	if !in.cl.Acquiring() {
		return nil
	}
	jobs, err := in.cl.Acquire(ctx)
	if err != nil {
		return err
	}
	return w.handOut(in, jobs, false)
}

// Flush runs the instance's range claimer's flush tick: failed commits
// retried, progress recorded, kept keys let go, and the look at whether
// another instance or a keyed retry wants its key gate (decision 0051).
func (w *World) Flush(ctx context.Context, in *instance) error {
	return in.cl.Flush(ctx)
}

// Reconcile runs the instance's range claimer's reconcile tick: what the
// database says it holds without its knowing is let go.
func (w *World) Reconcile(ctx context.Context, in *instance) error {
	return in.cl.Reconcile(ctx)
}

// claim makes one range claim for the instance, leaving the key
// acquisition it needs pending (Acquire applies it).
func (w *World) claim(ctx context.Context, in *instance) error {
	decl, set, err := w.db.BindingsInForce(ctx)
	if err != nil {
		return err
	}
	w.claimDecl, w.claimSet, w.skipErr = decl, set, nil
	reclaimed, quarantined := in.stats.Reclaimed.Load(), in.stats.Quarantined.Load()
	jobs, err := in.cl.Claim(ctx)
	if err != nil {
		return err
	}
	if in.stats.Reclaimed.Load() > reclaimed {
		w.tracef("%s reclaims an expired range", in.name)
	}
	if in.stats.Quarantined.Load() > quarantined {
		w.tracef("%s quarantines the range: its messages become exception rows", in.name)
	}
	if w.skipErr != nil {
		return w.skipErr
	}
	for _, j := range jobs {
		if err := w.checkClaimSet(in, j.Delivery.Msg, j.Delivery.Bindings, true); err != nil {
			return err
		}
	}
	return w.handOut(in, jobs, false)
}

// Retry claims due exception rows for the instance.
func (w *World) Retry(ctx context.Context, in *instance) error {
	jobs, err := in.ex.Claim(ctx)
	if err != nil {
		return err
	}
	return w.handOut(in, jobs, true)
}

// results are the handler outcomes a run step picks from.
var results = []struct {
	weight int
	name   string
	err    error
}{
	{85, "ok", nil},
	{9, "fails", fmt.Errorf("sim: handler fails")},
	{2, "terminal", &policy.TerminalError{Err: fmt.Errorf("sim: terminal")}},
	{4, "delays", &policy.DelayError{D: 500 * time.Millisecond}},
}

func (w *World) pickResult() (string, error) {
	r := w.rng.IntN(100)
	for _, c := range results {
		if r < c.weight {
			return c.name, c.err
		}
		r -= c.weight
	}
	return "ok", nil
}

// RunOne runs the instance's oldest handed-out job with the given result
// (from the PRNG when name is "").
func (w *World) RunOne(ctx context.Context, in *instance, exc bool, name string) error {
	queue := &in.jobs
	if exc {
		queue = &in.exJobs
	}
	if len(*queue) == 0 {
		return nil
	}
	j := (*queue)[0]
	*queue = (*queue)[1:]
	var err error
	if name == "" {
		name, err = w.pickResult()
	} else {
		for _, c := range results {
			if c.name == name {
				err = c.err
			}
		}
	}
	w.nextResult = err
	var o claimer.Outcome
	if exc {
		o = in.ex.Run(ctx, j)
	} else {
		o = in.cl.Run(ctx, j)
	}
	w.nextResult = nil
	w.finish(j)
	m := w.byID[j.Delivery.Msg.ID]
	if o.Err == nil {
		m.succeeded = true
	}
	w.tracef("%s runs m%d: %s", in.name, m.n, name)
	if exc {
		more, oerr := in.ex.Outcome(ctx, o)
		if len(more) > 0 {
			w.Chained += len(more)
			w.tracef("%s retry chain goes on", in.name)
		}
		if herr := w.handOut(in, more, true); herr != nil {
			return herr
		}
		return oerr
	}
	more, oerr := in.cl.Outcome(ctx, o)
	if herr := w.handOut(in, more, false); herr != nil {
		return herr
	}
	return oerr
}
