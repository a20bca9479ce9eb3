package claimer

import (
	"context"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/wakeup"
)

// Serve runs the actor until ctx ends (an abrupt stop: nothing is committed
// or handed back) or until the session's drain finishes (ErrDrained); see
// serve.
func (a *Actor) Serve(ctx context.Context) error {
	a.deferAcquire = true
	return serve(ctx, a, a.outage, a.runner, a.cfg.Concurrency, a.cfg.QueueSize, a.cfg.Wake)
}

// The loop methods serve drives.

func (a *Actor) common() *Common  { return &a.cfg.Common }
func (a *Actor) what() string     { return "in-flight ranges" }
func (a *Actor) handlers() string { return "handlers" }
func (a *Actor) eager() bool      { return a.starved }
func (a *Actor) inFlight() int    { return a.b.ranges.queued }
func (a *Actor) draining()        {}

// claimAfter: an outcome frees a slot, a reason to claim only when the
// queue was what held the last claim back.
func (a *Actor) claimAfter([]Job) bool { return a.starved }

// begin expires the ranges a restarted claimer's earlier run held: they are
// no longer known, and the heartbeat would keep them alive.
func (a *Actor) begin(ctx context.Context) error {
	// The first sweep probes before it claims: a session that starts idle
	// (thousands of them, at a fleet's start) takes no lease it must then
	// renew and reconcile.
	a.sweep, a.empty, a.begunAt = true, true, a.cfg.Clock.Now()
	if err := a.cfg.Store.ExpireOwnedRanges(ctx, a.cfg.InstanceID, a.cfg.StreamID, a.cfg.DBNow()); err != nil {
		return err
	}
	if a.cfg.Leftovers != nil {
		// What an earlier session left is recorded and released now, not
		// at the first poll tick (ClaimPollRate may be long).
		if err := a.flushAdopting(ctx); err != nil {
			return err
		}
	}
	if a.cfg.Hooks.Tracing() {
		a.cfg.Hooks.Trace(hooks.TraceBegun, nil)
	}
	a.settled() // the instance's leases were all let go of
	return nil
}

// settled: nothing of this instance's is left in the database that the
// actor does not know of (a begin, a reconcile); with nothing in memory
// either, the heartbeat renews no leases.
func (a *Actor) settled() {
	a.cleared(a.cfg.Holdings, a.b.holds())
}

// claim is the loop's claim: a sweep (expired leases, the gate probe) only
// when one is due and no takeover is held back (Common.takeoversHeld), and
// again after a reclaim, since more leases may have expired together.
func (a *Actor) claim(ctx context.Context) ([]Job, bool, error) {
	before := a.b.ranges.queued
	held := a.cfg.takeoversHeld(a.begunAt)
	// Held, a sweep still probes (a listening claimer may turn quiet; one
	// that has just begun claims nothing it did not find) but reclaims
	// nothing; a lapsed lease it found keeps the claimer from quiet, and
	// the next sweep tick after the grace reclaims it.
	sweep := a.sweep && (!held || a.cfg.listening() || a.empty)
	if a.wokenQuiet && !sweep && a.cfg.Liveness.Valid() {
		a.wokenQuiet = false
		jobs, _, err := a.claimWith(ctx, false, false)
		if err != nil || a.found { // new positions (or a failure): the wake was a produce's
			return jobs, err == nil && a.more(before), err
		}
		a.sweep, sweep = true, true // none: a hand-back's or a reconnect's wake
	}
	jobs, reclaimed, err := a.claimWith(ctx, sweep, !held)
	if sweep && err == nil && !a.starved && a.cfg.Liveness.Valid() { // the sweep ran
		a.sweep = reclaimed
	}
	return jobs, err == nil && (reclaimed || a.more(before)), err
}

// more: another claim may follow at once, since the last one took a whole
// batch (queued was before it) and did not take the last claimable position.
func (a *Actor) more(before int) bool {
	return !a.empty && a.b.ranges.queued-before >= a.cfg.BatchLimit
}

// sweepTicks is every how many poll ticks the poll's extra work is done
// (see MinSweep): 1 unless ClaimPollRate is below MinSweep.
func sweepTicks(poll time.Duration) int {
	if poll <= 0 || poll >= MinSweep {
		return 1
	}
	return int((MinSweep + poll - 1) / poll)
}

// TakeoverGrace is how long after its session came back from an outage
// (outage.Health.RecoveredAt: an actor reached the database after failing
// to, or a new incarnation replaced a lapsed one) a claimer takes no expired
// lease over: a range's sweep and the exception claim's takeover of running
// rows wait, new positions and due rows do not. Every instance cut off by the
// same outage comes back within about UnreachableRetry, and one whose
// leases expired meanwhile first records what its handlers had settled: a
// lapsed incarnation's salvage, the next session's adoption of a stopped
// session's leftovers. A takeover that came first ran those messages again
// (most of the chaos run's repeats after a PostgreSQL restart). It is half
// the lease, at most MaxTakeoverGrace: a lease that expired during the
// outage was already overdue, and an instance that died for good is taken
// over that much later.
func TakeoverGrace(lease time.Duration) time.Duration { return min(lease/2, MaxTakeoverGrace) }

// MaxTakeoverGrace bounds TakeoverGrace.
const MaxTakeoverGrace = time.Second

// takeoversHeld reports whether the session came back from an outage, or
// the actor began (begunAt; zero for the step functions' callers), less
// than TakeoverGrace ago. A session that begins may be starting right after
// an outage it never saw (its process restarted, or it was started while the
// database was down): its first sweep would race the instances coming back
// from it.
func (c *Common) takeoversHeld(begunAt time.Time) bool {
	at := c.Health.RecoveredAt()
	if begunAt.After(at) {
		at = begunAt
	}
	return !at.IsZero() && c.Clock.Now().Before(at.Add(TakeoverGrace(c.Lease)))
}

// MinSweep bounds how often an actor does the work a poll does beyond
// reading new positions: the range claimer's look for expired and
// handed-back leases and its gate probe, and the exception claimer's claim
// of rows that fell due (its statement visits every key with unresolved
// rows, the most expensive a claimer runs). A ClaimPollRate below it makes
// new positions claimed that often, not those. An expired lease is
// reclaimed, and a retry runs, at most this much later than it could be.
const MinSweep = 100 * time.Millisecond

func (a *Actor) outcome(ctx context.Context, o Outcome) ([]Job, error) { return a.Outcome(ctx, o) }
func (a *Actor) written(context.Context) error                         { return nil }

// flush: on a poll tick, failed commits are retried, and every sweepTicks
// (at most every MinSweep) the sweep becomes due and progress is recorded
// and leftovers adopted. Recording at every tick of a 5 ms ClaimPollRate
// held the loop, and with it the handlers of keyed messages (whose next job
// waits for the loop), in a statement every tick while ranges were in
// flight. Any other flush (after an outage, a salvage) does everything.
func (a *Actor) flush(ctx context.Context, tick bool) ([]Job, error) {
	if tick {
		if a.ticks++; a.ticks < sweepTicks(a.cfg.PollRate) {
			return nil, a.retryCommits(ctx)
		}
		a.ticks, a.sweep = 0, true // the sweep tick
	}
	return nil, a.flushAdopting(ctx)
}
func (a *Actor) reconcile(ctx context.Context) error {
	a.sweep = true // every Lease/3, however long ClaimPollRate is
	if !a.touched && a.b.ranges.len() == 0 && a.b.keys.len() == 0 {
		return nil // nothing taken since the last reconcile: nothing unknown to let go of
	}
	if err := a.Reconcile(ctx); err != nil {
		return err
	}
	a.settled()
	return nil
}

// handBack hands back, then wakes the stream's sessions (quiet ones
// included) so that another instance takes what was released over at once.
// The wake is best effort: without it the ranges are taken over at the next
// sweep.
//
// The wake follows every attempt that finds ranges released and not yet
// woken for, whether or not the attempt as a whole succeeded: an attempt
// that released a range and then failed (say, on a kept key's release) is
// retried with that range already forgotten, and a wake owed for the first
// attempt was lost with it.
func (a *Actor) handBack(ctx context.Context) error {
	err := a.HandBack(ctx)
	if a.released && a.cfg.Listening != nil {
		if a.cfg.Store.SendWakes(ctx, map[int64]*wakeup.Keys{a.cfg.StreamID: {All: true}}) == nil {
			a.released = false
		}
	}
	return err
}
func (a *Actor) abandon() {
	if a.cfg.Hooks.Tracing() {
		for _, id := range a.b.ranges.order {
			a.cfg.Hooks.TraceAll(hooks.TraceAbandoned, a.b.ranges.get(id).doneUnrecorded())
		}
	}
}

// left: the ranges a failed hand-back leaves, with their messages settled
// and not yet recorded, and those without an outcome.
func (a *Actor) left() []any {
	settled := 0
	for _, id := range a.b.ranges.order {
		settled += len(a.b.ranges.get(id).doneUnrecorded())
	}
	return []any{"ranges", a.b.ranges.len(), "settled_unrecorded", settled, "unsettled", a.b.ranges.queued}
}

// nextDue: the range claimer learns of new work by wakes and sweeps, never
// by a due time.
func (a *Actor) nextDue() time.Time { return time.Time{} }
