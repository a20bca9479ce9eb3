package sim

import (
	"context"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
)

// An instance's life: heartbeats, crashes, graceful stops, stalls and the
// resumption after one, and the mock clock advancing.

// Beat runs both heartbeats of an instance.
func (w *World) Beat(ctx context.Context, in *instance) error {
	if err := in.beat.Step(ctx); err != nil {
		return err
	}
	if err := in.exBeat.Step(ctx); err != nil {
		return err
	}
	in.lastBeat = w.clock.Now()
	return nil
}

// Crash drops an instance as a killed process would: nothing is handed
// back; its rows lapse after TTL.
func (w *World) Crash(in *instance) {
	for _, j := range append(in.jobs, in.exJobs...) {
		w.finish(j)
	}
	in.jobs, in.exJobs, in.state = nil, nil, gone
	in.frozen, in.frozenExc, in.stalled = nil, nil, false
	w.tracef("%s crashes", in.name)
}

// Stop stops an instance gracefully: its unfinished work is handed back
// and its instance rows are given back.
func (w *World) Stop(ctx context.Context, in *instance) error {
	for _, j := range append(in.jobs, in.exJobs...) {
		w.finish(j)
	}
	in.jobs, in.exJobs = nil, nil
	if in.cl != nil {
		if err := in.cl.HandBack(ctx); err != nil {
			return err
		}
		if err := in.ex.HandBack(ctx); err != nil {
			return err
		}
	}
	for _, id := range []string{in.msgID, in.excID} {
		if err := w.st.DeleteInstance(ctx, id); err != nil {
			return err
		}
	}
	in.state = gone
	w.tracef("%s stops", in.name)
	return nil
}

// Stall freezes an instance for d of mock time: its actors take no step
// while the others go on (a long GC pause, a frozen VM, SIGSTOP). Its
// handlers in flight stay where they are, frozen.
func (w *World) Stall(in *instance, d time.Duration) {
	for _, j := range in.jobs {
		w.finish(j)
	}
	for _, j := range in.exJobs {
		w.finish(j)
	}
	in.frozen, in.frozenExc, in.jobs, in.exJobs = in.jobs, in.exJobs, nil, nil
	in.stalled, in.stalledUntil = true, w.clock.Now().Add(d)
	w.Stalls++
	w.tracef("%s stalls for %s", in.name, d)
}

// resume wakes a stalled instance as the engine does: nothing of it starts
// before a renewal says whether its incarnation is still valid. A valid one
// goes on with its frozen handlers; a lapsed one (its row expired while it
// slept: the fleet may have taken its work) drops every in-memory state and
// registers again under new ids, binding check included, then refreshes
// its config. IgnoreLapse (a broken variant) goes on regardless.
func (w *World) resume(ctx context.Context, in *instance) error {
	in.stalled = false
	thaw := func() {
		for _, j := range append(in.frozen, in.frozenExc...) {
			if m := w.byID[j.Delivery.Msg.ID]; j.Delivery.Concurrency.Keyed() && m.key != "" {
				w.inFlight[m.key]++
			}
		}
		in.jobs, in.exJobs = append(in.frozen, in.jobs...), append(in.frozenExc, in.exJobs...)
		in.frozen, in.frozenExc = nil, nil
	}
	if in.state != consuming || w.opts.IgnoreLapse {
		w.tracef("%s resumes", in.name)
		thaw()
		return nil
	}
	if err := w.Beat(ctx, in); err != nil {
		return err
	}
	if !in.beat.Lost() && !in.exBeat.Lost() {
		w.tracef("%s resumes", in.name)
		thaw()
		return nil
	}
	// The frozen handlers are abandoned: their outcomes would settle
	// nothing (the token fence), and the tree that ran them is gone.
	in.frozen, in.frozenExc = nil, nil
	in.incarnation++
	w.Lapses++
	in.msgID, in.excID = engine.NewID(), engine.NewID()
	in.reg.SetInstances([]store.InstanceInsert{
		{ID: in.msgID, WorkerConfigID: w.workers[store.WorkerMessageConsumer], TTL: w.opts.TTL},
		{ID: in.excID, WorkerConfigID: w.workers[store.WorkerExceptionConsumer], TTL: w.opts.TTL},
	})
	in.cl, in.ex, in.beat, in.exBeat, in.state = nil, nil, nil, nil, waiting
	w.tracef("%s resumes lapsed: registers again as incarnation %d", in.name, in.incarnation+1)
	if _, err := in.ref.Step(ctx); err != nil {
		return err
	}
	in.lastRefresh = w.clock.Now()
	return w.attempt(ctx, in)
}

// Advance moves the clock by d and runs what falls due: heartbeats,
// refreshes, and the binding attempts of waiting instances. A beat is
// skipped with probability skip as long as the instance stays well inside
// its TTL (a slow beat, not a partition). A stalled instance takes no step
// until its stall is over; then it resumes.
func (w *World) Advance(ctx context.Context, d time.Duration, skip float64) error {
	w.clock.Add(d)
	now := w.clock.Now()
	for _, in := range w.live() {
		if in.stalled {
			if now.Before(in.stalledUntil) {
				continue
			}
			if err := w.resume(ctx, in); err != nil {
				return err
			}
			// Then whatever fell due while it slept (its refresh first of all).
		}
		if in.state == waiting {
			if now.Sub(in.lastTry) >= w.opts.BindingRetryInterval {
				if err := w.attempt(ctx, in); err != nil {
					return err
				}
			}
			continue
		}
		since := now.Sub(in.lastBeat)
		if since >= w.opts.TTL/3 && (since >= w.opts.TTL/2 || w.rng.Float64() >= skip) {
			if err := w.Beat(ctx, in); err != nil {
				return err
			}
		}
		if !w.opts.SkipRefresh && now.Sub(in.lastRefresh) >= w.opts.RefreshInterval {
			if _, err := in.ref.Step(ctx); err != nil {
				return err
			}
			in.lastRefresh = now
		}
	}
	return nil
}
