package claimer

import (
	"context"
	"errors"
	"time"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// HandBack returns unfinished rows, and the chains queued behind them, to
// pending without spending a retry (or writes a finished row's result that
// failed to write); a drain and the simulator's graceful stop call it. The
// rows with nothing to write go back in one statement, the unwritten
// results of batchable rows in another (a drain that hands back a
// prefetched batch is not a statement a row).
func (a *ExceptionActor) HandBack(ctx context.Context) error {
	var plain []store.ExceptionRun
	var errs []error
	for pos, r := range a.running {
		switch {
		case r.unwritten == nil:
			plain = append(plain, r.run)
			plain = append(plain, r.queued...)
		case r.batchable():
			a.pending = append(a.pending, r)
		default:
			if err := a.handBackRun(ctx, r); err != nil {
				errs = append(errs, err) // kept: a later handBack tries again
				continue
			}
			delete(a.running, pos)
		}
	}
	if err := a.writePending(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := a.giveBack(ctx, plain); err != nil {
		return errors.Join(append(errs, err)...) // every plain row kept: a later handBack tries again
	}
	for pos, r := range a.running {
		if r.unwritten == nil {
			delete(a.running, pos)
		}
	}
	return errors.Join(errs...)
}

// handBackRun writes one leased row's hand-back: its result when it has one
// not yet written, else back to pending without spending a retry; and the
// rows queued behind it back to pending.
func (a *ExceptionActor) handBackRun(ctx context.Context, r *excRun) error {
	s := store.Settlement{Status: policy.StatusPending, Attempts: r.run.Attempts, Delays: r.run.Delays, Error: "handed back at shutdown"}
	if r.unwritten != nil {
		s = *r.unwritten
	}
	s.Next = nil // nothing more starts
	s.Position, s.Token, s.Now = r.run.Position, r.run.Token, a.cfg.DBNow()
	_, err := a.db.SettleException(ctx, s)
	if errors.Is(err, store.ErrLeaseLost) {
		a.cfg.Stats.LeasesLost.Add(1)
		err = nil
	}
	if err == nil {
		err = a.giveBack(ctx, r.queued)
	}
	return err
}

// Serve runs the actor until ctx ends or until the session's drain
// finishes; see serve.
func (a *ExceptionActor) Serve(ctx context.Context) error {
	return serve(ctx, a, a.outage, a.runner, a.cfg.Concurrency, a.cfg.Concurrency+a.cfg.Prefetch, a.cfg.Wake)
}

// The loop methods serve drives.

func (a *ExceptionActor) common() *Common  { return &a.cfg.Common }
func (a *ExceptionActor) what() string     { return "exception rows" }
func (a *ExceptionActor) handlers() string { return "exception handlers" }
func (a *ExceptionActor) eager() bool      { return false }
func (a *ExceptionActor) inFlight() int    { return len(a.running) }
func (a *ExceptionActor) draining()        { a.draining_ = true }
func (a *ExceptionActor) reset() {
	a.running, a.draining_, a.pending = map[store.Position]*excRun{}, false, nil
	a.noneDue = false
	a.leasing(a.cfg.Holdings)
}

// quiet: nothing for a poll tick to do while the listener is up (quiet.go).
func (a *ExceptionActor) quiet() bool {
	return a.noneDue && len(a.running) == 0 && len(a.pending) == 0 && len(a.adopted) == 0 &&
		a.cfg.Leftovers.Len() == 0 && !a.cfg.Nudge.peek() &&
		(a.dueAt.IsZero() || a.cfg.Clock.Now().Before(a.dueAt))
}

// woken: rows fell due by an operator's action (a redrive): the next claim
// probes and claims them, however quiet the claimer was.
func (a *ExceptionActor) woken() { a.noneDue, a.idle, a.empty = false, 0, true }

// left: the rows a failed hand-back leaves, and how many of them have a
// result not yet written.
func (a *ExceptionActor) left() []any {
	unwritten := 0
	for _, r := range a.running {
		if r.unwritten != nil {
			unwritten++
		}
	}
	return []any{"rows", len(a.running), "results_unwritten", unwritten}
}

// nextDue: when the earliest pending row falls due, as the last probe that
// found none due said.
func (a *ExceptionActor) nextDue() time.Time {
	if !a.noneDue {
		return time.Time{}
	}
	return a.dueAt
}

// alarmed: a peer instance lapsed: probe for its rows.
func (a *ExceptionActor) alarmed() { a.noneDue, a.idle, a.empty = false, 0, true }

// skipTick: see Actor.skipTick.
func (a *ExceptionActor) skipTick() bool {
	return a.leaseBook.skipTick(&a.cfg.Common, a.quiet())
}

// claimAfter: a chain's next row keeps the slot its head freed, so only an
// outcome that started nothing makes a claim due.
func (a *ExceptionActor) claimAfter(jobs []Job) bool {
	if len(jobs) > 0 {
		return false
	}
	a.idle = 0 // a freed slot: claim now
	return true
}

// begin releases what a restarted claimer's earlier run held.
func (a *ExceptionActor) begin(ctx context.Context) error {
	a.begunAt, a.empty = a.cfg.Clock.Now(), true // the first claim probes first (see Actor.begin)
	if err := a.cfg.Store.ExpireOwnedRanges(ctx, a.cfg.InstanceID, a.cfg.StreamID, a.cfg.DBNow()); err != nil {
		return err
	}
	if err := a.writeAdopted(ctx); err != nil {
		return err
	}
	a.settled() // the instance's leases were all let go of
	return nil
}

// settled: nothing of this instance's is left in the database that the
// actor does not know of (a begin, a reconcile); with nothing in memory
// either, the heartbeat renews no leases.
func (a *ExceptionActor) settled() { a.cleared(a.cfg.Holdings, len(a.running) > 0) }

func (a *ExceptionActor) claim(ctx context.Context) ([]Job, bool, error) {
	if a.idle > 0 {
		return nil, false, nil
	}
	before := len(a.running)
	free, prefetch := a.room()
	jobs, err := a.Claim(ctx)
	if err == nil && free+prefetch > 0 && a.cfg.Liveness.Valid() && len(a.running)-before < free+prefetch {
		a.idle = sweepTicks(a.cfg.PollRate) - 1 // the claim ran and took every row due
	}
	return jobs, false, err
}

func (a *ExceptionActor) outcome(ctx context.Context, o Outcome) ([]Job, error) {
	return a.apply(ctx, o) // written by written, once the outcomes waiting are in
}
func (a *ExceptionActor) written(ctx context.Context) error { return a.writePending(ctx) }
func (a *ExceptionActor) flush(ctx context.Context, _ bool) ([]Job, error) {
	a.idle = max(a.idle-1, 0) // the poll tick
	jobs, err := a.Flush(ctx)
	if err != nil {
		return jobs, err
	}
	return jobs, a.writeAdopted(ctx)
}
func (a *ExceptionActor) reconcile(ctx context.Context) error {
	a.idle = 0 // every Lease/3 the claim runs, as the range claimer's sweep
	a.noneDue = false
	if !a.touched && len(a.running) == 0 {
		return nil // nothing taken since the last reconcile: nothing unknown to let go of
	}
	if err := a.Reconcile(ctx); err != nil {
		return err
	}
	a.settled()
	return nil
}
func (a *ExceptionActor) handBack(ctx context.Context) error { return a.HandBack(ctx) }
func (a *ExceptionActor) abandon() {
	for _, r := range a.running {
		if r.unwritten != nil {
			a.cfg.Hooks.TraceOne(hooks.TraceAbandoned, r.run.Message.ID)
		}
	}
}

// Reconcile returns to pending the rows this instance holds as running
// without knowing (a claim whose reply was lost to a cut connection) and
// releases key leases under tokens it does not hold; see Actor.Reconcile.
func (a *ExceptionActor) Reconcile(ctx context.Context) error {
	tokens := make([]string, 0, len(a.running))
	for _, r := range a.running {
		tokens = append(tokens, r.run.Token)
		for _, q := range r.queued {
			tokens = append(tokens, q.Token)
		}
	}
	runs, leases, err := a.db.ForgetUnknownRuns(ctx, a.cfg.InstanceID, tokens, a.cfg.DBNow())
	if err != nil {
		return err
	}
	if runs+leases > 0 {
		codes.UnknownLeasesReleased.Log(ctx, a.cfg.Logger, "let go of exception rows this instance held without knowing (a reply lost to a cut connection)",
			"rows", runs, "key_leases", leases)
	}
	return nil
}

// positionOrder orders positions as the log does (the exception rows' lock
// order).
func positionOrder(p, q store.Position) int {
	switch {
	case p.Less(q):
		return -1
	case q.Less(p):
		return 1
	}
	return 0
}

// The exception claimer takes a row's key with the row's claim: it leaves
// no acquisition pending.
func (a *ExceptionActor) acquisition() func(context.Context) Acquired { return nil }
func (a *ExceptionActor) acquired(context.Context, Acquired) ([]Job, error) {
	return nil, nil
}
func (a *ExceptionActor) acquiringAtOnce() int { return 0 }
