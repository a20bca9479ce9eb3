// Package claimer holds the actors that turn a group's log into handler
// calls: the range claimer (this file) and the exception claimer
// (exceptions.go), which share the handler runner (runner.go) and the
// serve loop (serve.go).
//
// The range claimer claims ranges (one short transaction each), resolves
// every message's policy against the group config of that moment (pinned for
// the message's whole life), leases the keys of exclusive and ordered
// messages, and hands jobs to a pool of handler workers. When every message
// of a range has an outcome the range is committed in one statement: lease
// deleted by token, failures and deferrals written as exception rows, key
// leases released.
//
// Its state lives in two books that keep themselves in agreement and do no
// I/O: the range book (rangebook.go: the ranges, their order, what is
// queued and what must be committed again) and the key book (keybook.go:
// key leases and their queues, kept keys, the key gate, pending
// acquisitions), joined in books.go. The actor's step functions (Claim,
// Acquire, Outcome, Flush, HandBack, Reconcile) make the store calls and
// hand their results to the books; tests and the simulator drive them, and
// Serve (loop.go, serve.go) is the thin loop that runs them in production.
//
// It is part of the engine's inside, not an API for users.
package claimer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/observe"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Actor is the range claimer.
type Actor struct {
	cfg    Config
	db     store.Group
	runner *runner
	b      books

	// answered counts the store calls the database answered (the outage
	// reporter's Reached).
	answered atomic.Uint64

	stallSince time.Time
	stalled    bool
	outage     *outage.Reporter

	// The serve loop's claim pacing (the step functions ignore it). starved:
	// the last claim was cut short by a full queue, so a freed slot is a
	// reason to claim again. sweep: the next claim also looks for expired
	// leases and probes the gate; it is due after a begin, then at every
	// sweepTicks-th poll tick (ticks counts them) and every reconcile tick
	// (Lease/3, so a long ClaimPollRate does not leave expired leases
	// waiting for it), and stays due while reclaims find ranges. In between
	// a claim is one statement: a produce's wake is what makes new positions
	// claimable, while an expired or handed-back lease and an open
	// transaction's end wait for the next sweep.
	starved, sweep bool
	ticks          int
	// empty: the last claim of new positions found none, or took the last
	// claimable one (store.Range.Drained), so the next sweep first probes
	// (store.GateProbe: new positions after the head? a lapsed range
	// lease?) and claims only what the probe found. An idle session's
	// sweep is then one statement, cheap to plan, instead of three (the
	// reclaim and claim statements cost most of an idle session's server
	// CPU in planning), and a burst's end costs no claim that finds nothing.
	empty bool
	// found: the last claim read positions (a range claimed or reclaimed).
	found bool
	// released: a hand-back released a range that no wake has announced
	// yet (handBack).
	released bool
	// begunAt is when the serve loop's begin ran: takeovers wait
	// TakeoverGrace after it (zero for the step functions' callers).
	begunAt time.Time
	// idleProbed: the last claim was a sweep whose probe found nothing
	// after the head, no lapsed lease and no stall (quiet).
	idleProbed bool
	// wokenQuiet: a wake reached the claimer while it was quiet. The next
	// claim reads new positions first, and sweeps only if there are none
	// (woken).
	wokenQuiet bool
	// deferAcquire: claims leave their key acquisitions pending (the serve
	// loop's claims, and the simulator's).
	deferAcquire bool
	leaseBook
	parsedOptions
}

// New returns a range claimer.
func New(cfg Config) *Actor {
	a := &Actor{cfg: cfg, runner: cfg.newRunner()}
	a.db = cfg.Store.Group(cfg.StreamID, cfg.GroupID).InLane(false).Counting(&a.answered)
	a.outage = cfg.reporter("claimer store call", &a.answered)
	if a.runner.tx != nil {
		a.runner.tx.settler = a
	}
	a.b = books{keyBusyDelay: cfg.KeyBusyDelay, stats: cfg.Stats, hooks: cfg.Hooks, broken: cfg.Hooks.Breaks()}
	a.b.keys.hold = cfg.keyHold()
	a.b.ranges.keepDue = cfg.Hooks.Breaks().ForgetsKeepingCommitDue()
	a.reset()
	return a
}

func (a *Actor) reset() {
	a.b.reset()
	a.starved, a.sweep, a.empty, a.found, a.idleProbed, a.wokenQuiet = false, true, false, false, false, false
	a.leasing(a.cfg.Holdings)
}

// Check reports the first way the claimer's state disagrees with itself
// (books.check); tests call it after every step.
func (a *Actor) Check() error { return a.b.check() }

// quiet: nothing for a poll tick to do while the listener is up (quiet.go).
func (a *Actor) quiet() bool {
	return a.idleProbed && !a.b.holds() && len(a.b.ranges.toCommit) == 0 &&
		a.stallSince.IsZero() && a.cfg.Leftovers.Len() == 0
}

// alarmed: a peer instance lapsed: sweep for its leases.
func (a *Actor) alarmed() { a.sweep, a.idleProbed = true, false }

// skipTick: a quiet claimer with alarms skips the reconcile tick's sweep but
// every QuietSweepEvery-th.
func (a *Actor) skipTick() bool {
	return a.leaseBook.skipTick(&a.cfg.Common, a.quiet())
}

// woken: a wake reaching a quiet claimer makes it claim, and sweep if that
// claim finds no new position: a produce's wake (nearly all of them) names
// new positions, a hand-back's lapsed ranges, and a listener's reconnect
// either. Probing first cost every produce's wake a gate probe, planned
// afresh for each stream of a thousand (decision 0041).
func (a *Actor) woken() {
	if a.quiet() {
		a.wokenQuiet = true
	}
}

// Queued returns how many messages are claimed and not yet settled.
func (a *Actor) Queued() int { return a.b.ranges.queued }

// Run executes one job synchronously (the step tests drive).
func (a *Actor) Run(ctx context.Context, j Job) Outcome { return a.runner.Run(ctx, j) }

// Claim takes one range when a whole batch fits in the queue, reclaiming an
// expired lease of the group before reading new positions (outside
// TakeoverGrace), and returns the jobs ready to run.
func (a *Actor) Claim(ctx context.Context) ([]Job, error) {
	held := a.cfg.takeoversHeld(a.begunAt)
	jobs, _, err := a.claimWith(ctx, !held, !held)
	return jobs, err
}

// claimWith is Claim; sweep false skips the look for expired leases and the
// gate probe (the serve loop's claims between sweeps), and reclaim false
// the reclaim alone (TakeoverGrace). reclaimed says whether an expired lease
// was taken over. A claim that finds nothing to run with no range in
// flight lets the kept keys go (decision 0045): the backlog is drained
// here, and a quiet claimer holds nothing (quiet.go).
func (a *Actor) claimWith(ctx context.Context, sweep, reclaim bool) (jobs []Job, reclaimed bool, err error) {
	jobs, reclaimed, err = a.claimOnce(ctx, sweep, reclaim)
	if err == nil && len(jobs) == 0 && a.b.ranges.len() == 0 && (a.b.keys.nkept > 0 || a.b.keys.gate != "") && a.cfg.Liveness.Valid() {
		err = errors.Join(a.releaseKept(ctx, true), a.giveUpGate(ctx, false))
	}
	return jobs, reclaimed, err
}

func (a *Actor) claimOnce(ctx context.Context, sweep, reclaim bool) (jobs []Job, reclaimed bool, err error) {
	a.found = false
	if a.b.ranges.queued+a.cfg.BatchLimit > a.cfg.QueueSize {
		a.starved = true
		return nil, false, nil
	}
	a.starved = false
	if !a.cfg.Liveness.Valid() {
		// Nothing was looked at: the claimer polls until a claim runs.
		// Quiet, it would skip its poll ticks, and the wake that brought
		// this claim (a produce's, a hand-back's) would be lost until the
		// next wake or the backstop sweep.
		a.idleProbed = false
		a.cfg.Hooks.NotLive()
		return nil, false, nil
	}
	if err := a.cfg.Hooks.At(hooks.ClaimerClaim); err != nil {
		return nil, false, err
	}
	a.idleProbed = false
	group := a.cfg.Group()
	args := store.ClaimParams{Owner: a.cfg.InstanceID, Limit: a.cfg.BatchLimit, Lease: a.cfg.Lease, Now: a.cfg.DBNow(), Slabs: a.cfg.Slabs}
	obs := a.cfg.observer()
	var probe *store.Gate
	if sweep && a.empty {
		g, err := a.db.GateProbe(ctx, args.Now)
		if err != nil {
			return nil, false, err
		}
		probe = &g
	}
	expired := probe != nil && probe.Expired
	if sweep && reclaim && probe == nil {
		// A busy claimer's sweep (no probe: it claimed positions last
		// time) looks before it reclaims: the look plans in a tenth of
		// the reclaim's time, and a stream's statements are planned
		// afresh on most calls when there are many streams (decision 0042).
		if expired, err = a.db.LeasesExpired(ctx, args.Now); err != nil {
			return nil, false, err
		}
	}
	if sweep && reclaim && expired {
		began := a.cfg.Clock.Now()
		a.leasing(a.cfg.Holdings)
		r, ok, err := a.db.ReclaimRange(ctx, args)
		obs.ClaimDuration(a.cfg.StreamName, a.cfg.GroupName, a.cfg.Clock.Since(began))
		if err != nil {
			return nil, false, err
		}
		if ok {
			a.cfg.Stats.Reclaimed.Add(1)
			obs.Count(a.cfg.StreamName, a.cfg.GroupName, observe.RangeReclaimed, 1)
			if limit := group.MaxRangeReclaimsOrDefault(); r.Reclaims > limit {
				return nil, true, a.quarantine(ctx, r, group, limit)
			}
			a.cfg.Logger.Info("reclaimed an expired range", "range", r.ID, "reclaims", r.Reclaims, "messages", len(r.Messages))
			a.found, a.empty = true, false
			jobs, err := a.dispatch(ctx, r, group)
			return jobs, true, err
		}
	}
	if probe != nil && !probe.Pending { // nothing after the head: not a stall either
		a.clearStall()
		a.idleProbed = !probe.Expired
		return nil, false, nil
	}
	began := a.cfg.Clock.Now()
	a.leasing(a.cfg.Holdings)
	r, ok, err := a.db.ClaimRange(ctx, args)
	obs.ClaimDuration(a.cfg.StreamName, a.cfg.GroupName, a.cfg.Clock.Since(began))
	if ok {
		obs.Count(a.cfg.StreamName, a.cfg.GroupName, observe.RangeClaimed, 1)
	}
	if err != nil {
		return nil, false, err
	}
	if a.empty = !ok; !ok {
		if !sweep {
			return nil, false, nil
		}
		return nil, false, a.checkGate(ctx, probe)
	}
	// A range that took the last claimable position leaves the claimer as
	// an empty claim would have: the next claim is a sweep's, which probes
	// first, and nothing claims at once. A wake (a produce's) still claims
	// without a probe.
	a.found, a.empty = true, r.Drained
	a.clearStall()
	jobs, err = a.dispatch(ctx, r, group)
	return jobs, false, err
}

// quarantine splits a range that keeps killing its holders into independent
// exception rows, so the healthy messages flow and a poison message ends
// dead after its own retries.
func (a *Actor) quarantine(ctx context.Context, r store.Range, group policy.Group, limit int) error {
	writes := make([]store.ExceptionWrite, 0, len(r.Messages))
	for i := range r.Messages {
		m := &r.Messages[i]
		if !m.Matched {
			continue
		}
		e := a.resolve(m, group)
		writes = append(writes, store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: string(e.Concurrency),
			Status: policy.StatusPending, Error: fmt.Sprintf("%s its range was reclaimed %d times (MaxRangeReclaims %d)", store.QuarantinedPrefix, r.Reclaims, limit)})
	}
	s := store.RangeCommit{RangeID: r.ID, Token: r.Token, Exceptions: writes, Now: a.cfg.DBNow()}
	err := a.db.CommitRange(ctx, s)
	a.cfg.Nudge.give() // after the write: the exception claimer's probe must see its rows
	if err != nil {
		if errors.Is(err, store.ErrLeaseLost) {
			return nil
		}
		return err
	}
	a.cfg.Stats.Quarantined.Add(1)
	a.cfg.observer().Count(a.cfg.StreamName, a.cfg.GroupName, observe.RangeQuarantined, 1)
	codes.RangeQuarantined.Log(ctx, a.cfg.Logger, "range quarantined: its messages are retried one by one", "range", r.ID,
		"reclaims", r.Reclaims, "messages", len(r.Messages))
	return nil
}

// dispatch takes a claimed range into the books (books.admit) and returns
// the jobs that start. A range complete at once (nothing in it runs) is
// committed; a key acquisition it needs waits for the serve loop to run it
// off the loop, on another connection, while the loop goes on claiming
// and committing (decision 0050), or runs now unless acquisitions are
// deferred.
func (a *Actor) dispatch(ctx context.Context, r store.Range, group policy.Group) ([]Job, error) {
	ad := a.b.admit(r, func(m *store.Message) policy.Effective { return a.resolve(m, group) }, a.cfg.Clock.Now(), a.cfg.WorkerConfigID)
	if ad.complete {
		return ad.jobs, a.settle(ctx, r.ID)
	}
	if ad.acq == nil {
		return ad.jobs, nil
	}
	a.leasing(a.cfg.Holdings)
	ad.acq.req.Owner, ad.acq.req.TTL, ad.acq.req.Now = a.cfg.InstanceID, a.cfg.Lease, a.cfg.DBNow()
	if a.deferAcquire {
		return ad.jobs, nil
	}
	more, err := a.Acquire(ctx)
	return append(ad.jobs, more...), err
}

// checkGate runs after an empty claim: if committed rows wait behind an open
// transaction for longer than StallAfter, the stall is logged once and
// counted. Nothing is skipped; delivery resumes when the transaction ends.
// probe is the gate as the sweep's probe read it before the claim, if it did.
func (a *Actor) checkGate(ctx context.Context, probe *store.Gate) error {
	if probe == nil {
		g, err := a.db.GateProbe(ctx, a.cfg.DBNow())
		if err != nil {
			return err
		}
		probe = &g
	}
	g := *probe
	if !g.Pending {
		a.clearStall()
		a.idleProbed = !g.Expired // checkGate follows a sweep's empty claim
		return nil
	}
	now := a.cfg.Clock.Now()
	if a.stallSince.IsZero() {
		a.stallSince = now
		return nil
	}
	if a.stalled || now.Sub(a.stallSince) < a.cfg.StallAfter {
		return nil
	}
	a.stalled = true
	a.cfg.Stats.Stalls.Add(1)
	a.cfg.observer().Count(a.cfg.StreamName, a.cfg.GroupName, observe.DeliveryStall, 1)
	blockers, err := a.cfg.Store.GateBlockers(ctx, g.Xmin)
	if err != nil {
		return err
	}
	attrs := []any{"group_id", a.cfg.GroupID, "waiting", now.Sub(a.stallSince).String(), "oldest_open_xid", g.Xmin}
	for _, b := range blockers {
		attrs = append(attrs, "blocker_pid", b.PID, "blocker_application", b.ApplicationName,
			"blocker_xact_start", b.XactStart, "blocker_state", b.State)
	}
	codes.DeliveryStalled.Log(ctx, a.cfg.Logger, "delivery stalled: committed messages wait behind an open transaction", attrs...)
	a.cfg.Alerts.Send(alert.Event{Kind: alert.DeliveryStalled, Since: a.stallSince, Waited: now.Sub(a.stallSince), Blockers: blockers})
	return nil
}

func (a *Actor) clearStall() {
	if a.stalled {
		a.cfg.Logger.Info("delivery resumed after a stall", "group_id", a.cfg.GroupID)
	}
	a.stallSince, a.stalled = time.Time{}, false
}
