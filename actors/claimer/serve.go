package claimer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/supervisor"
)

// loop is one claimer as the shared Serve loop drives it: the range claimer
// and the exception claimer differ in what they claim and settle, not in
// how they run, drain and stop, which serve holds once for both.
type loop interface {
	common() *Common
	// reset drops every in-memory state: a (re)started Serve knows nothing.
	reset()
	// begin lets go of what an earlier run of this actor (before a restart)
	// held in the database, before anything is claimed.
	begin(ctx context.Context) error
	// claim takes new work; more reports that another claim may follow at
	// once (a whole batch came in).
	claim(ctx context.Context) (jobs []Job, more bool, err error)
	// claimAfter says whether an outcome that started jobs is still a reason
	// to claim.
	claimAfter(jobs []Job) bool
	outcome(ctx context.Context, o Outcome) ([]Job, error)
	// flush does the poll tick's work (tick) or, after an outage and in a
	// salvage, all of what a flush may (the range claimer records its
	// progress only on the sweep's ticks).
	flush(ctx context.Context, tick bool) ([]Job, error)
	reconcile(ctx context.Context) error
	inFlight() int
	handBack(ctx context.Context) error
	// draining is told once a drain begins: nothing new starts.
	draining()
	// leave is told when the drain's hand-back failed for good: what the
	// actor still holds goes to the consumer's Leftovers.
	leave()
	// what names the actor's work in log lines ("in-flight ranges"), and
	// handlers its handlers ("handlers", "exception handlers").
	what() string
	handlers() string
	// eager claims at every turn of the loop (the range claimer while its
	// queue holds its claims back: such a claim costs nothing until a slot
	// frees); otherwise only when a wake, a poll, a backoff's end or an
	// outcome claimAfter names makes one due.
	eager() bool
	// abandon tells Trace what an abrupt stop leaves unwritten.
	abandon()
	// left describes, as log attributes, what a hand-back that failed
	// leaves for the consumer's next session.
	left() []any
	// written writes what outcome left for one write after the outcomes
	// that were waiting (the exception claimer's settlements: one
	// statement and one commit for them all).
	written(ctx context.Context) error
	// quiet reports that a poll tick has nothing to do while the client's
	// listener is up (decision 0038, quiet.go).
	quiet() bool
	// woken is told of a wake before the claim it makes due.
	woken()
	// nextDue is when work the actor knows of falls due (the exception
	// claimer's earliest pending row, when its last probe found none due
	// yet; zero: none known): serve claims then, not at the poll tick after.
	nextDue() time.Time
	// alarmed is told that a peer instance lapsed (Common.Alarm).
	alarmed()
	// skipTick reports that a reconcile tick has nothing to do: the actor
	// is quiet, alarms and wakes bring what its sweep would find, and the
	// backstop sweep is not due (decision 0040).
	skipTick() bool
	// acquisition returns the store call of the oldest key acquisition a
	// claim left pending and serve has not started (the range claimer's,
	// decision 0050), which serve runs off the loop, acquiringAtOnce at a
	// time, while claims, outcomes, commits and flushes go on; nil when
	// there is none. acquired applies a result.
	acquisition() func(context.Context) Acquired
	acquired(ctx context.Context, res Acquired) ([]Job, error)
	acquiringAtOnce() int
}

// serve runs l until ctx ends (an abrupt stop: nothing is committed or
// handed back) or until the session's shutdown plan begins and the drain
// finishes (ErrDrained). A failed store call backs the actor off (no claims,
// flushes or reconciles until the wait is over) and is logged once per
// outage; a permanent one reaches the session through the reporter's Health.
func serve(ctx context.Context, l loop, rep *outage.Reporter, r *runner, workers, capacity int, wake <-chan struct{}) error {
	c := l.common()
	l.reset()
	plan := c.Drain
	until := func() time.Time { // how long the handler pool's close waits for handlers
		if plan.Begun() {
			return plan.HandlersWaitDeadline()
		}
		return c.Clock.Now().Add(c.ShutdownTimeout())
	}
	p, cancelHandlers, closePool := r.session(ctx, workers, capacity, until, c.Logger, l.handlers())
	defer closePool()
	defer func() {
		if v := recover(); v != nil {
			if ctx.Err() == nil { // else the session is stopping: an abrupt stop records nothing
				salvage(ctx, c, l, p, c.ShutdownTimeout())
			}
			supervisor.Repanic(v) // the supervisor logs it, with where it was raised, and restarts the actor
		}
	}()
	send := func(jobs []Job) {
		if r.tx != nil && len(jobs) > 0 {
			jobs = batches(jobs, r.tx.batch)
		}
		for _, j := range jobs {
			p.submit(j)
		}
	}
	poll := c.Clock.Ticker(c.PollRate)
	defer poll.Stop()
	reconcile := c.Clock.Ticker(c.Lease / 3)
	defer reconcile.Stop()

	var (
		begun, draining bool
		drainC          = plan.Started()
		deadline        <-chan time.Time
		holdoff         <-chan time.Time // set while backing off after a failure
		up              <-chan struct{}  // with holdoff after an outage: closed when another actor reaches the database
		due             = true           // a claim is due at the top of the loop
		recovered       bool             // a backoff has just ended: flush before claiming
		sctx            = ctx            // store calls' context: bounded once draining
		timers          []func() bool
	)
	defer func() {
		for _, stop := range timers {
			stop()
		}
	}()
	timer := func(d time.Duration) <-chan time.Time {
		t := c.Clock.Timer(d)
		timers = append(timers, t.Stop)
		return t.C()
	}
	report := func(err error) {
		if wait := rep.Report(ctx, err); wait > 0 && holdoff == nil {
			holdoff = timer(wait)
			if store.Transient(err) { // the database was out of reach: back as soon as anyone reaches it
				up = c.Health.Reached()
			}
		}
	}
	flush := func(tick bool) { // the poll tick's work: commits to retry, progress to record
		jobs, err := l.flush(sctx, tick)
		report(err)
		send(jobs)
	}
	cancelDrainCtx := func() {}
	defer func() { cancelDrainCtx() }()
	startDrain := func() {
		drainC, draining = nil, true
		l.draining()
		sctx, cancelDrainCtx = plan.Context(ctx, c.Clock, false)
		deadline = timer(shutdown.Until(c.Clock, plan.HandlersDeadline()))
	}
	// The key acquisitions running off the loop (at most
	// l.acquiringAtOnce()): started after the claims that left them
	// pending, applied as their results come back, and waited for
	// (cancelled once wctx ends) before any hand-back, salvage or return,
	// so that what they took is known to whatever follows.
	actx, acqStop := context.WithCancel(ctx)
	defer acqStop()
	var (
		acqC    = make(chan Acquired, max(l.acquiringAtOnce(), 1))
		running int
		acqRuns sync.WaitGroup
	)
	defer func() { acqStop(); acqRuns.Wait() }()
	startAcquire := func() {
		for running < l.acquiringAtOnce() {
			run := l.acquisition()
			if run == nil {
				return
			}
			running++
			acqRuns.Add(1)
			go func() {
				defer acqRuns.Done()
				acqC <- run(actx)
			}()
		}
	}
	applyAcquire := func(res Acquired, start bool, report func(error)) {
		running--
		jobs, err := l.acquired(sctx, res)
		report(err)
		if start {
			send(jobs)
			startAcquire() // the next claim's, if one is pending
		}
	}
	awaitAcquire := func(wctx context.Context, report func(error)) { // their jobs do not start
		for running > 0 {
			select {
			case res := <-acqC:
				applyAcquire(res, false, report)
			case <-wctx.Done():
				acqStop()
				applyAcquire(<-acqC, false, report)
			}
		}
	}
	finish := func() error {
		awaitAcquire(sctx, report)
		absorb(sctx, l, p, report, send) // outcomes already waiting settle before the hand-back
		if !retryHandBack(sctx, c, l.what(), l.handBack, l.left) {
			l.leave()
		}
		return ErrDrained
	}
	// The timer of the work the actor knows falls due (nextDue): a retry's
	// backoff ending, a Delay's time coming.
	var (
		dueC    <-chan time.Time
		dueAt   time.Time
		dueTime clocks.Timer
	)
	defer func() {
		if dueTime != nil {
			dueTime.Stop()
		}
	}()
	armDue := func() {
		at := l.nextDue()
		if at.Equal(dueAt) {
			return
		}
		dueAt = at
		if dueTime != nil {
			dueTime.Stop()
			dueTime, dueC = nil, nil
		}
		if !at.IsZero() {
			dueTime = c.Clock.Timer(shutdown.Until(c.Clock, at))
			dueC = dueTime.C()
		}
	}
	busy := c.Health.Busy(l.what()) // the liveness probe's mark of this loop
	defer busy.Waiting()
	for {
		busy.Working()
		if !draining {
			select { // a drain begun while this actor restarted: no claims
			case <-drainC:
				startDrain()
			default:
			}
		}
		switch {
		case draining:
			if !begun { // restarted mid-drain: hand back what the earlier run held, within the deadline
				begun = true
				report(l.begin(sctx))
			}
			if l.inFlight() == 0 {
				return finish()
			}
		case holdoff != nil:
		case !begun:
			err := l.begin(ctx)
			report(err)
			begun = err == nil
		}
		for !draining && begun && holdoff == nil && due {
			// A flush tick that fired while the loop was claiming runs
			// before the next claim: under load a claim takes a while, and
			// outcomes would wait unrecorded behind claim after claim. So
			// does the first flush after an outage: what settled while the
			// database was out of reach is recorded before other
			// instances' takeover grace ends (TakeoverGrace), not after a
			// claim.
			flushNow, tick := recovered, !recovered
			select {
			case <-poll.C():
				flushNow = true
			default:
			}
			if recovered = false; flushNow {
				flush(tick)
				if holdoff != nil {
					continue // the loop's condition ends the claims
				}
			}
			jobs, more, err := l.claim(ctx)
			report(err)
			send(jobs)
			if startAcquire(); err != nil || !more {
				break
			}
			absorb(sctx, l, p, report, send) // keep outcomes flowing while claims are full
		}
		due = l.eager()
		armDue()
		busy.Waiting()
		select {
		case <-ctx.Done():
			awaitAcquire(ctx, func(error) {}) // ctx is done: cancelled at once
			switch {
			case c.Liveness.Lost():
				// The incarnation was lost: nothing more starts, but what
				// has settled is recorded where the lease is still ours,
				// and what is still held goes to the consumer's next
				// incarnation, which writes what salvage could not and
				// releases the rest (token-fenced, as every write).
				salvage(ctx, c, l, p, 0)
				l.leave()
			case plan.Begun():
				// A graceful stop cut short (its drain ran out of time:
				// the database was out of reach, say): the session has
				// no time left to write, but what has settled is kept
				// for the consumer's next session, as a failed hand-back
				// keeps it, instead of being delivered again when the
				// leases lapse.
				absorb(ctx, l, p, func(error) {}, func([]Job) {})
				l.leave()
			default:
				l.abandon() // an abrupt stop records nothing, as a crash would not
			}
			return ctx.Err()
		case <-drainC:
			startDrain()
		case <-deadline:
			if running := p.busy(); running > 0 {
				codes.ShutdownTimeout.Log(ctx, c.Logger, "shutdown timeout reached with handlers still running; cancelling them and handing their work back",
					"handlers", running, "in_flight", l.inFlight(), "what", l.what())
			}
			cancelHandlers()
			return finish()
		case o := <-p.out:
			busy.Working()
			jobs, err := l.outcome(sctx, o)
			report(err)
			send(jobs)
			due = due || l.claimAfter(jobs)
			// The outcomes already waiting share its write: at most the
			// pool's queue capacity of them, so that a busy pool does not
			// hold the write (and the next claim) back for long.
			for n := 1; n < max(capacity, 1); n++ {
				select {
				case o := <-p.out:
					jobs, err := l.outcome(sctx, o)
					report(err)
					send(jobs)
					due = due || l.claimAfter(jobs)
					continue
				default:
				}
				break
			}
			report(l.written(sctx))
		case res := <-acqC: // a claim's keys: its keyed messages start
			busy.Working()
			applyAcquire(res, true, report)
			due = true
		case <-wake: // produced to, or rows redriven: claim now
			l.woken()
			due = true
		case <-dueC: // known work fell due: claim now
			dueC, dueTime, dueAt = nil, nil, time.Time{}
			l.woken()
			due = true
		case <-poll.C():
			busy.Working()
			if begun && holdoff == nil && !draining && c.listening() && l.quiet() {
				c.Hooks.QuietTicked(l.what())
				break // a wake brings what this tick would find (quiet.go)
			}
			if begun && holdoff == nil {
				flush(true)
			}
			due = true
		case <-c.Alarm: // a peer lapsed: its leases are there to be taken over
			l.alarmed()
			due = true
		case <-reconcile.C():
			busy.Working()
			if begun && !draining && holdoff == nil && l.skipTick() {
				break
			}
			if begun && !draining && holdoff == nil {
				report(l.reconcile(ctx))
			}
			due = true // and a sweep: leases expire on this timescale, whatever the poll
		case <-holdoff:
			holdoff, up, due, recovered = nil, nil, true, true
		case <-up: // another actor reached the database: no need to wait out the backoff
			holdoff, up, due, recovered = nil, nil, true, true
		}
	}
}

// lapseSalvageBound caps how long a claimer whose incarnation was lost
// spends recording what had settled (a quarter of its lease, if smaller):
// the session's next incarnation waits for it.
const lapseSalvageBound = 2 * time.Second

// salvage keeps what a stopping run of the actor has settled: after a panic,
// before the supervisor restarts it, and after its incarnation was lost,
// before the session registers again. The handlers already running may
// finish within wait (nothing new starts; a lost incarnation waits for
// none), their outcomes and those already waiting are applied, and the
// actor flushes, which records the ranges' settled messages (the range
// claimer) or writes the settlements still unwritten (the exception
// claimer). Whoever takes the leases over then
// delivers only what had not settled. Without it every restart and every
// lapse ran messages that had already succeeded again (most of the chaos
// run's duplicates).
//
// The state it applies outcomes to is whole: a step computes an outcome's
// result before it changes anything, and the panics that restart actors
// come from the steps' store calls and hooks, between changes. Every write
// is fenced by the lease token, so a lease another instance took meanwhile
// is left alone, and a lost incarnation's late outcomes settle nothing that
// is no longer its own. After a panic it retries its writes while the
// actor's leases are still its own (one lease: the heartbeat keeps them
// while the database is reachable, and a restarted actor could do nothing
// sooner), until the session's drain begins or its context ends; after a
// lapse, within lapseSalvageBound. It gives up silently (a database that
// cannot be reached, another panic): the reclaim then delivers what it
// could not record, as it did before.
func salvage(ctx context.Context, c *Common, l loop, p *pool, wait time.Duration) {
	defer func() { _ = recover() }()
	if wait > 0 {
		p.quiesce(c.Clock, c.Clock.Now().Add(wait))
	}
	var sctx context.Context
	var cancel context.CancelFunc
	if c.Liveness.Lost() {
		bound := lapseSalvageBound
		if c.Lease > 0 {
			bound = min(bound, c.Lease/4)
		}
		sctx, cancel = c.Clock.WithTimeout(context.WithoutCancel(ctx), bound)
	} else {
		sctx, cancel = c.Clock.WithTimeout(ctx, max(c.Lease, time.Second))
	}
	defer cancel()
	for {
		select {
		case o := <-p.out:
			_, _ = l.outcome(sctx, o) // jobs it would start are not started: nothing more runs
			continue
		default:
		}
		break
	}
	_ = retryStore(sctx, c, c.Drain.Started(), func(ctx context.Context) error { _, err := l.flush(ctx, false); return err })
}

// absorb applies every outcome already waiting, without blocking.
func absorb(ctx context.Context, l loop, p *pool, report func(error), send func([]Job)) {
	for {
		select {
		case o := <-p.out:
			jobs, err := l.outcome(ctx, o)
			report(err)
			send(jobs)
		default:
			report(l.written(ctx))
			return
		}
	}
}

// retryStore runs f until it succeeds, its error is permanent, ctx ends or
// stop closes, backing off from 50 ms to 500 ms between attempts (a failed
// attempt gets a new connection). It returns the last error.
func retryStore(ctx context.Context, c *Common, stop <-chan struct{}, f func(context.Context) error) error {
	wait := 50 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil || store.Permanent(err) != nil || ctx.Err() != nil {
			return err
		}
		t := c.Clock.Timer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return err
		case <-stop:
			t.Stop()
			return err
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// UnreachableHandBack is how long a drain's hand-back is retried while
// the database cannot be reached at all (store.Unreachable: refused or cut
// connections, a server shutting down): a stop that cannot write returns
// soon after its handlers end, well inside an orchestrator's grace, and
// leaves what settled to the consumer's next session (Leftovers).
const UnreachableHandBack = time.Second

// retryHandBack runs hand back until it succeeds or ctx (bounded by the
// shutdown plan's hand-back deadline) ends: a database that is slow or busy
// when the drain begins (a restart nearly done, a failover) still gets the
// work handed back and the settled messages recorded. One that cannot be
// reached at all is tried for UnreachableHandBack. What it could not hand
// back is logged with what it leaves (left), and reported (handed false)
// so that the caller leaves it to the consumer's next session
// (Leftovers); without one, those leases lapse after InstanceTTL and
// another instance delivers their messages.
func retryHandBack(ctx context.Context, c *Common, what string, hand func(context.Context) error, left func() []any) (handed bool) {
	var down time.Time // when the database was first found out of reach
	wait := 50 * time.Millisecond
	for {
		err := hand(ctx)
		if err == nil {
			return true
		}
		now := c.Clock.Now()
		switch {
		case !store.Unreachable(err):
			down = time.Time{}
		case down.IsZero():
			down = now
		}
		gaveUp := !down.IsZero() && now.Sub(down) >= UnreachableHandBack
		if gaveUp || store.Permanent(err) != nil || ctx.Err() != nil {
			codes.HandBackFailed.Log(ctx, c.Logger, "could not hand "+what+" back at shutdown; the consumer's next session in this process writes them, else their leases lapse after InstanceTTL",
				append(left(), "error", err)...)
			return false
		}
		if !down.IsZero() {
			wait = min(wait, UnreachableHandBack-now.Sub(down))
		}
		t := c.Clock.Timer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// ErrDrained is what a claimer's Serve returns once its drain is complete:
// the one result that is not a reason to restart it.
var ErrDrained = errors.New("drained")
