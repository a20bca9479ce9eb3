package claimer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/handlerctx"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
)

// Delivery is one handler attempt of one message.
type Delivery struct {
	Msg *store.Message
	// Attempt is 1 for the first run; a retry after n failed attempts is n+1.
	Attempt     int
	Delays      int
	Concurrency policy.Concurrency
	Timeout     time.Duration
	// Bindings is the binding declaration whose set routed the message to
	// the group (0: whole stream), as read by the claim that handed it out.
	Bindings int64
	// Tx is the transaction a transactional handler runs in (TxHandler);
	// nil otherwise.
	Tx pgx.Tx
}

// Handler runs one delivery. nil is success; see policy.Classify for errors.
type Handler func(ctx context.Context, d *Delivery) error

// Job is a delivery ready to run, with the actor's reference to it.
type Job struct {
	Ref      Ref
	Delivery Delivery
	// eff is the message's policy as pinned at its claim (a tx worker
	// decides its result with it).
	eff policy.Effective
	// batch, in a transactional runner, is the jobs one transaction runs
	// (batches); the job itself is then only its carrier.
	batch []Job
}

// Outcome is a finished job. Canceled means the run was cut short by the
// actor's own stop, which settles nothing.
type Outcome struct {
	Ref      Ref
	Err      error
	Canceled bool
	// Started is when the handler was called, Duration how long it ran
	// (until its result, or until it was abandoned).
	Started  time.Time
	Duration time.Duration
	msgID    int64 // for Trace
	// handlerLeft: the handler was abandoned and may still run (and read
	// its Delivery).
	handlerLeft bool
	// tx is a transactional runner's word on the attempt's settlement.
	tx txResult
}

// errNotLive is the outcome of a job the runner did not start because the
// instance's incarnation was lost.
var errNotLive = errors.New("not started: the instance's incarnation was lost")

// runner executes jobs: each attempt on a handler goroutine (an executor)
// under the message's timeout, panics turned into failures, and a handler that ignores its
// context past the grace period abandoned (counted) so the worker goes on.
type runner struct {
	handler Handler
	clock   clocks.Clock
	grace   time.Duration
	stats   *Stats
	// gate, if set, is waited on before each handler starts: false (the
	// incarnation was lost, or ctx ended) and the job is not run.
	gate func(ctx context.Context) bool
	// tx, if set, runs the jobs as transactional batches (tx.go).
	tx *txMode

	mu       sync.Mutex
	handlers *sync.WaitGroup // this Serve generation's handler goroutines, abandoned ones included
	live     atomic.Int64    // handler goroutines not yet returned
}

// generation starts tracking a new Serve's handlers. The previous
// generation's wait may still be running (abandoned handlers), so it keeps
// its own WaitGroup.
func (r *runner) generation() {
	r.mu.Lock()
	r.handlers = &sync.WaitGroup{}
	r.mu.Unlock()
}

func (r *runner) tracker() *sync.WaitGroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.handlers == nil {
		r.handlers = &sync.WaitGroup{}
	}
	return r.handlers
}

// Run executes one job synchronously on a goroutine of its own. It is the
// step tests drive directly; pool workers reuse an executor instead.
func (r *runner) Run(ctx context.Context, j Job) Outcome { return r.run(ctx, j, nil) }

// executor is a long-lived handler goroutine that a pool worker hands its
// attempts to. Reusing it keeps the stack a handler grew (JSON decoding grows
// a fresh stack on every attempt, a large share of a consumer's CPU) and
// saves a goroutine start per attempt. An executor
// whose handler overran its grace is dropped: its calls channel is closed, so
// it exits once the handler finally returns.
type executor struct {
	calls chan execCall
	done  chan error // capacity 1: an abandoned call's result is never read
	// timer watches each call's deadline; one per executor, reset for
	// every call (a timer per message cost more than the handler's
	// bookkeeping around it). Only the pool worker that owns the executor
	// touches it.
	timer clocks.Timer
}

// expiredAlready is the deadline channel of a call whose deadline had
// passed before it started.
var expiredAlready = func() chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// arm sets the executor's timer to the call's deadline and returns the
// channel that says it passed.
func (ex *executor) arm(clk clocks.Clock, now time.Time, hctx *handlerctx.Ctx) <-chan time.Time {
	deadline, _ := hctx.Deadline()
	wait := deadline.Sub(now)
	if wait <= 0 {
		return expiredAlready
	}
	if ex.timer == nil {
		ex.timer = clk.Timer(wait)
	} else {
		ex.timer.Reset(wait)
	}
	return ex.timer.C()
}

// disarm stops the timer and drops a tick it may have sent meanwhile, so
// that the next call's wait does not see it.
func (ex *executor) disarm() {
	if ex.timer != nil && !ex.timer.Stop() {
		select {
		case <-ex.timer.C():
		default:
		}
	}
}

type execCall struct {
	ctx context.Context
	d   *Delivery
}

func (r *runner) newExecutor() *executor {
	ex := &executor{calls: make(chan execCall), done: make(chan error, 1)}
	wg := r.tracker()
	wg.Add(1)
	r.live.Add(1)
	go func() {
		defer wg.Done()
		defer r.live.Add(-1)
		for c := range ex.calls {
			ex.done <- r.call(c.ctx, c.d)
		}
	}()
	return ex
}

// run executes one job on *slot's executor (creating it when nil, and
// dropping it when its handler is abandoned), or on a one-shot executor
// when slot is nil.
func (r *runner) run(ctx context.Context, j Job, slot **executor) Outcome {
	o := r.runJob(ctx, j, slot)
	if j.Delivery.Msg != nil {
		o.msgID = j.Delivery.Msg.ID
	}
	return o
}

func (r *runner) runJob(ctx context.Context, j Job, slot **executor) Outcome {
	if ctx.Err() != nil {
		return Outcome{Ref: j.Ref, Err: ctx.Err(), Canceled: true}
	}
	if r.gate != nil && !r.gate(ctx) {
		// Not provably live: the job settles nothing (the range is handed
		// back or reclaimed with its incarnation).
		return Outcome{Ref: j.Ref, Err: errNotLive, Canceled: true}
	}
	d := j.Delivery
	var ex *executor
	if slot == nil {
		ex = r.newExecutor()
		defer close(ex.calls) // one-shot: it exits after this call
	} else {
		if *slot == nil {
			*slot = r.newExecutor()
		}
		ex = *slot
	}
	started := r.clock.Now()
	// The handler's context builds its timer only if the handler asks for
	// Done; the deadline is watched here, on the executor's own timer.
	hctx := handlerctx.New(ctx, r.clock, started, d.Timeout)
	defer hctx.End()
	expired := ex.arm(r.clock, started, hctx)
	ex.calls <- execCall{ctx: hctx, d: &d}
	timed := func(o Outcome) Outcome {
		o.Started, o.Duration = started, r.clock.Since(started)
		return o
	}
	select {
	case err := <-ex.done:
		ex.disarm()
		return timed(r.outcome(ctx, hctx, j, err))
	case <-expired:
		hctx.Expire()
	case <-ctx.Done():
		ex.disarm()
	}
	if ctx.Err() != nil {
		// The pool is stopping: the outcome would settle nothing, and a stop
		// must not wait TimeoutGrace per handler. The handler is left to
		// return on its own; the pool's close waits for it within the
		// session's shutdown deadline.
		select {
		case err := <-ex.done:
			return timed(r.outcome(ctx, hctx, j, err))
		default:
		}
		if slot != nil {
			close(ex.calls)
			*slot = nil
		}
		return Outcome{Ref: j.Ref, Err: ctx.Err(), Canceled: true, handlerLeft: true}
	}
	grace := r.clock.Timer(r.grace)
	defer grace.Stop()
	select {
	case err := <-ex.done:
		return timed(r.outcome(ctx, hctx, j, err))
	case <-grace.C():
		if slot != nil { // the handler still runs on it: never hand it another
			close(ex.calls)
			*slot = nil
		}
		if ctx.Err() != nil {
			return Outcome{Ref: j.Ref, Err: ctx.Err(), Canceled: true, handlerLeft: true}
		}
		r.stats.Abandoned.Add(1)
		return timed(Outcome{Ref: j.Ref, Err: fmt.Errorf("%w after %s; the handler ignored its context for %s more and was abandoned",
			policy.ErrTimeout, d.Timeout, r.grace), handlerLeft: true})
	}
}

func (r *runner) outcome(ctx, hctx context.Context, j Job, err error) Outcome {
	switch {
	case ctx.Err() != nil && err != nil:
		return Outcome{Ref: j.Ref, Err: err, Canceled: true}
	case err != nil && errors.Is(hctx.Err(), context.DeadlineExceeded):
		r.stats.TimedOut.Add(1)
		return Outcome{Ref: j.Ref, Err: fmt.Errorf("%w after %s: %v", policy.ErrTimeout, j.Delivery.Timeout, err)}
	}
	return Outcome{Ref: j.Ref, Err: err}
}

// call runs the handler; a panic is a failure carrying its value and stack.
func (r *runner) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.stats.Panics.Add(1)
			err = fmt.Errorf("%w: %v\n%s", policy.ErrPanic, p, debug.Stack())
		}
	}()
	return r.handler(ctx, d)
}

// pool runs up to n workers over jobs until it is closed, sending outcomes
// on out. Workers start on demand, when a job is submitted and no idle
// worker would take it: a session's pools hold goroutines only as far as
// it has work (an exception claimer with no failures has none), since every
// goroutine's stack is scanned at each garbage collection, and over 1,000
// sessions the consumers spent a quarter of their CPU in the collector
// (measured with 1,000 idle sessions). A worker, once started, runs until the pool
// is closed.
type pool struct {
	jobs      chan Job
	out       chan Outcome
	wg        sync.WaitGroup
	closeJobs sync.Once
	// skip is set by quiesce: jobs not yet started are dropped unrun (their
	// messages were never delivered; a reclaimer delivers them).
	skip atomic.Bool

	r   *runner
	ctx context.Context
	max int // workers at most
	// started is owned by the submitting goroutine (serve's loop);
	// queued (jobs submitted and not yet taken) and idle (workers waiting
	// for one) decide whether a submission starts a worker.
	started      int
	queued, idle atomic.Int64
}

func (r *runner) startPool(ctx context.Context, n, capacity int) *pool {
	return &pool{jobs: make(chan Job, capacity), out: make(chan Outcome, capacity), r: r, ctx: ctx, max: n}
}

// submit queues j, starting a worker first when the jobs already queued
// outnumber the idle workers and the pool is below its size. Only serve's
// loop submits; it blocks while the queue is full, as a send on jobs did.
func (p *pool) submit(j Job) {
	if p.queued.Add(1) > p.idle.Load() && p.started < p.max {
		p.started++
		p.wg.Add(1)
		go p.work()
	}
	p.jobs <- j
}

// work is one worker: it takes jobs until the pool is closed.
func (p *pool) work() {
	defer p.wg.Done()
	var ex *executor
	defer func() {
		if ex != nil {
			close(ex.calls)
		}
	}()
	// A worker counts as idle from before it hands its outcome over, so
	// the job serve submits on receiving it finds the worker idle and
	// starts no other (TestThePoolStartsWorkersOnDemand).
	p.idle.Add(1)
	for {
		j, ok := <-p.jobs
		p.idle.Add(-1)
		if !ok {
			return
		}
		p.queued.Add(-1)
		if p.skip.Load() {
			p.idle.Add(1)
			continue
		}
		if j.batch != nil {
			os := p.r.runTx(p.ctx, j.batch, &ex)
			p.idle.Add(1)
			for _, o := range os {
				p.out <- o
			}
			continue
		}
		o := p.r.run(p.ctx, j, &ex)
		p.idle.Add(1)
		p.out <- o
	}
}

// busy returns how many workers are running a job now.
func (p *pool) busy() int64 { return max(int64(p.started)-p.idle.Load(), 0) }

// stop closes the pool and waits for its workers (not for abandoned
// handlers: see waitHandlers).
func (p *pool) stop() {
	p.closeJobs.Do(func() { close(p.jobs) })
	p.wg.Wait()
}

// quiesce lets the handlers already running finish, starts nothing more, and
// waits for the workers until the deadline (on clk); it reports whether
// they all finished, every outcome then waiting on out. The workers'
// handler contexts are left alone: a handler that overruns its Timeout is
// abandoned by its worker as usual, so the wait is bounded by the longest
// Timeout plus TimeoutGrace as well.
func (p *pool) quiesce(clk clocks.Clock, deadline time.Time) bool {
	p.skip.Store(true)
	p.closeJobs.Do(func() { close(p.jobs) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }() // ends with the workers, which stop (and close) waits for
	t := clk.Timer(max(deadline.Sub(clk.Now()), 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C():
		return false
	}
}

// waitHandlers waits for every handler goroutine, abandoned ones included,
// until the time until gives. Go cannot stop a goroutine that ignores its
// context; past it such handlers are reported and left running.
func (r *runner) waitHandlers(until time.Time) int64 {
	done := make(chan struct{})
	wg := r.tracker()
	go func() { wg.Wait(); close(done) }()
	t := r.clock.Timer(max(until.Sub(r.clock.Now()), 0))
	defer t.Stop()
	select {
	case <-done:
		return 0
	case <-t.C():
		return r.live.Load()
	}
}

// session starts one Serve generation's handler pool. Handler contexts end
// with the actor's context unless a drain is under way (the actor then
// cancels them itself, at its deadline). close stops the pool, waits for its
// workers and, until the time until gives, for every handler goroutine, and
// reports those that ignore their context.
func (r *runner) session(ctx context.Context, workers, capacity int, until func() time.Time, logger *slog.Logger, what string) (p *pool, cancelHandlers context.CancelFunc, close func()) {
	r.generation()
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p = r.startPool(hctx, workers, capacity)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		select {
		case <-ctx.Done():
			cancel()
		case <-hctx.Done():
		}
	}()
	return p, cancel, func() {
		cancel()
		p.stop()
		watch.Wait()
		if n := r.waitHandlers(until()); n > 0 {
			codes.HandlersLeftBehind.Log(ctx, logger, what+" still running after shutdown: they ignore their context and are left behind", "count", n)
		}
	}
}
