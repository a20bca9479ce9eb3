package claimer

import (
	"context"
	"errors"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Outcome records one finished job, releases the next message of its key,
// and commits the range when every message has an outcome. A canceled
// outcome settles nothing: the message is handed back with its range. A
// transactional attempt's outcome was written with its handler's writes
// (tx.recorded), or committed nothing known (tx.lost: the range is let go
// of).
func (a *Actor) Outcome(ctx context.Context, o Outcome) ([]Job, error) {
	a.cfg.Hooks.Point(hooks.ClaimerOutcome)
	rf := o.Ref
	if o.tx.lost && !o.Canceled {
		a.cfg.Hooks.TraceOne(hooks.TraceLost, o.msgID)
		return a.letGo(ctx, rf)
	}
	if o.Canceled || !a.b.running(rf) {
		a.cfg.Hooks.TraceOne(hooks.TraceDropped, o.msgID)
		return nil, nil // a range dropped after a lost lease or a hand-back, or an earlier incarnation's job
	}
	in := a.b.ranges.of(rf)
	i := rf.index
	m := &in.r.Messages[i]
	a.cfg.Hooks.TraceOne(hooks.TraceApplied, m.ID)
	d := o.tx.decided
	concurrency := in.eff[i].Concurrency
	if !o.tx.recorded {
		d = a.decideNow(in.eff[i], m, o.Err)
	}
	in.handlerLeft = in.handlerLeft || o.handlerLeft
	if d.log != nil && !o.tx.recorded {
		in.log = append(in.log, *d.log)
	}
	a.cfg.Stats.count(d.next, o.Err, 0)
	a.cfg.observeAttempt(o, d.next, 0, m.ProducedAt)
	holdBack := concurrency == policy.Ordered && !d.next.Delete && !a.cfg.Hooks.Breaks().IgnoresOrderedFailure()
	jobs, complete := a.b.outcome(rf, d.write, holdBack)
	if o.tx.recorded {
		a.cfg.Hooks.TraceOne(hooks.TraceRecorded, m.ID)
		a.b.recordedAt(rf)
		if d.write != nil {
			a.cfg.Nudge.give() // written: the exception claimer's probe must look
		}
	}
	if !complete {
		return jobs, nil
	}
	return jobs, a.settle(ctx, rf.rangeID)
}

// decideNow decides an attempt's result on the actor's loop, with its memo
// of parsed options (decide is the tx workers' form).
func (a *Actor) decideNow(claimed policy.Effective, m *store.Message, err error) decided {
	group := a.cfg.Group()
	return rangeDecision(a.atWrite(claimed, m, group), m, group, err)
}

// rangeDecision is a range message's first attempt's result under e (the
// policy at the exception write): its exception row unless it succeeded,
// and its delivery-log row when the group logs the outcome.
func rangeDecision(e policy.Effective, m *store.Message, group policy.Group, err error) decided {
	next := policy.Decide(e, group.InitialBackoffOrDefault(), 0, 0, err)
	d := decided{next: next}
	if !next.Delete {
		d.write = &store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: string(e.Concurrency),
			Status: next.Status, Attempts: next.Attempts, Delays: next.Delays, Error: errText(err), After: next.After}
	}
	if outcome := policy.OutcomeOf(next, err, 0); group.Logs(outcome) {
		d.log = &store.DeliveryWrite{Position: m.Position, Attempt: 1, Outcome: outcome, Error: errText(err)}
	}
	return d
}

// settle commits a complete range; a commit that fails stays due (the
// range book keeps it) and is retried at the next flush.
func (a *Actor) settle(ctx context.Context, id int64) error { return a.commit(ctx, id) }

func (a *Actor) commit(ctx context.Context, id int64) error {
	in := a.b.ranges.get(id)
	s := a.b.commitPlan(in, a.cfg.Clock.Now())
	s.Now = a.cfg.DBNow()
	err := a.db.CommitRange(ctx, s)
	if len(s.Exceptions) > 0 {
		a.cfg.Nudge.give() // after the write: the exception claimer's probe must see its rows
	}
	if a.cfg.Hooks.Tracing() {
		switch {
		case err == nil || (errors.Is(err, store.ErrRangeGone) && in.uncertain):
			a.cfg.Hooks.TraceAll(hooks.TraceRecorded, in.doneUnrecorded())
		case errors.Is(err, store.ErrRangeGone) || errors.Is(err, store.ErrLeaseLost):
			a.cfg.Hooks.TraceAll(hooks.TraceLost, in.doneUnrecorded())
		}
	}
	switch {
	case errors.Is(err, store.ErrRangeGone) && in.uncertain:
		// No one holds the range and its row is gone: the earlier attempt
		// whose outcome was unknown applied. Nothing is delivered again.
		a.cfg.Logger.Info("range committed by an earlier attempt whose reply was lost", "range", id)
		a.cfg.Stats.Committed.Add(1)
		a.b.ranges.forget(id)
		return nil
	case errors.Is(err, store.ErrRangeGone):
		a.cfg.Stats.LeasesLost.Add(1)
		codes.RangeLeaseLost.Log(ctx, a.cfg.Logger, "range lease lost before commit; another instance reclaimed the range and has settled it", "range", id)
		a.b.ranges.forget(id)
		return nil
	case errors.Is(err, store.ErrLeaseLost):
		a.cfg.Stats.LeasesLost.Add(1)
		codes.RangeLeaseLost.Log(ctx, a.cfg.Logger, "range lease lost before commit; a reclaimer delivers it again", "range", id)
		a.b.ranges.forget(id)
		return nil
	case err != nil:
		in.uncertain = true
		return err
	}
	a.cfg.Stats.Committed.Add(1)
	if in.pending == 0 && !in.handlerLeft && !in.adopted {
		in.r.Recycle(a.cfg.Slabs) // every handler of it has returned
	}
	a.b.ranges.forget(id)
	return nil
}

// releaseKept lets go of the kept keys that are due (all of them when asked
// or a key was busy lately) in a statement of their own: the flush tick's,
// when no commit came to carry them. A tick between two ranges lets go of
// only the due ones: the claim that finds the stream drained releases the
// rest (claimWith).
func (a *Actor) releaseKept(ctx context.Context, all bool) error {
	if a.b.keys.nkept == 0 {
		return nil
	}
	now := a.cfg.Clock.Now()
	keys := a.b.keys.dueKept(now, all || !a.b.keys.keeping(now))
	_, err := a.db.ReleaseKeys(ctx, keys)
	return err // on failure the rows stay under tokens the claimer no longer holds: Reconcile lets them go
}

// Reconcile lets go of what the database says this instance holds but the
// claimer does not know of: a claim or key acquisition whose reply was lost
// to a cut connection committed all the same, and the heartbeat would keep
// it alive forever. The claimer's state is exact between steps (it alone
// claims for its instance), so anything else is such a leftover.
func (a *Actor) Reconcile(ctx context.Context) error {
	if err := a.cfg.Hooks.At(hooks.ClaimerReconcile); err != nil {
		return err
	}
	known := make([]int64, 0, a.b.ranges.len())
	for id := range a.b.ranges.m {
		known = append(known, id)
	}
	ranges, leases, err := a.db.ForgetUnknownRanges(ctx, store.ForgetRanges{Owner: a.cfg.InstanceID, Ranges: known,
		Keys: a.b.keys.leases(), Now: a.cfg.DBNow()})
	if err != nil {
		return err
	}
	if ranges+leases > 0 {
		codes.UnknownLeasesReleased.Log(ctx, a.cfg.Logger, "let go of leases this instance held without knowing (a reply lost to a cut connection)",
			"ranges", ranges, "key_leases", leases)
	}
	return nil
}

// Flush retries commits that failed earlier (a database restart, say), then
// records the settled prefixes of the ranges still in flight.
func (a *Actor) Flush(ctx context.Context) error {
	if err := a.cfg.Hooks.At(hooks.ClaimerFlush); err != nil {
		return err
	}
	if err := a.retryCommits(ctx); err != nil {
		return err
	}
	if err := a.RecordProgress(ctx); err != nil {
		return err
	}
	if err := a.checkKeyGate(ctx); err != nil {
		return err
	}
	return a.releaseKept(ctx, false)
}

// retryCommits retries the commits that failed earlier.
func (a *Actor) retryCommits(ctx context.Context) error {
	pending := a.b.ranges.takeCommits()
	for i, c := range pending {
		if a.b.ranges.of(c) == nil {
			continue // gone, or reclaimed since under a new token
		}
		if err := a.commit(ctx, c.rangeID); err != nil {
			for _, rest := range pending[i:] {
				if in := a.b.ranges.of(rest); in != nil {
					a.b.ranges.commitDue(in)
				}
			}
			return err
		}
	}
	return nil
}

// RecordProgress writes, in one statement for every range still in flight,
// what each has settled since the last record: its low bound moves past its
// settled prefix, the messages settled beyond the prefix join the range's
// settled set, and their exception and delivery-log rows are written, so a
// range reclaimed after this instance dies (or its lease lapses, or the
// actor restarts) delivers only what had not settled. It runs once per
// flush tick: a range that settles whole within a tick is committed instead
// and costs nothing more. Ranges complete and awaiting their commit are left
// to it.
func (a *Actor) RecordProgress(ctx context.Context) error {
	p := a.b.progress()
	if len(p.ps) == 0 {
		return nil
	}
	advanced, err := a.db.RecordProgress(ctx, p.ps, a.cfg.DBNow())
	for _, pr := range p.ps {
		if len(pr.Exceptions) > 0 {
			a.cfg.Nudge.give() // after the write: the exception claimer's probe must see its rows
			break
		}
	}
	if err != nil {
		return err
	}
	if a.cfg.Hooks.Tracing() { // before the marks: what each record wrote, or lost
		for i, pr := range p.ps {
			in := a.b.ranges.get(pr.RangeID)
			switch {
			case in == nil:
			case !advanced[pr.RangeID] || in.r.Token != pr.Token:
				a.cfg.Hooks.TraceAll(hooks.TraceLost, in.doneUnrecorded())
			default:
				ids := make([]int64, 0, len(p.fresh[i]))
				for _, j := range p.fresh[i] {
					ids = append(ids, in.r.Messages[j].ID)
				}
				a.cfg.Hooks.TraceAll(hooks.TraceRecorded, ids)
			}
		}
	}
	for _, ok := range a.b.recorded(p, advanced) {
		if ok {
			a.cfg.Stats.ProgressRecorded.Add(1)
		}
	}
	return nil
}

// HandBack returns every range still in flight: a range whose messages all
// have outcomes is committed; any other has its settled prefix recorded (as
// every flush tick does) and is released with its lease expired now, so
// another instance takes the rest at once.
func (a *Actor) HandBack(ctx context.Context) error {
	if err := a.cfg.Hooks.At(hooks.ClaimerHandBack); err != nil {
		return err
	}
	var errs []error
	if err := a.Flush(ctx); err != nil { // retried commits, then the prefixes
		errs = append(errs, err)
	}
	for _, id := range a.b.ranges.ids() {
		in := a.b.ranges.get(id)
		if in == nil {
			continue
		}
		if in.pending == 0 {
			if err := a.commit(ctx, id); err != nil {
				errs = append(errs, err) // still due: a later HandBack or flush tries again
			}
			continue
		}
		rel := store.Release{RangeID: in.r.ID, Token: in.r.Token, Keys: a.b.releaseKeys(in), Now: a.cfg.DBNow()}
		err := a.db.ReleaseRange(ctx, rel)
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			errs = append(errs, err) // kept: a later HandBack tries again
			continue
		}
		a.released = a.released || err == nil
		a.b.ranges.forget(id)
	}
	// The acquisitions still pending have not run (the serve loop applies
	// a running one before it hands back): their ranges went back with the
	// rest, and the pending keys with them.
	a.b.keys.pruneAcquisitions()
	if err := a.releaseKept(ctx, true); err != nil {
		errs = append(errs, err)
	}
	if err := a.giveUpGate(ctx, false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
