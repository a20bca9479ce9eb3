package claimer

import (
	"context"
	"errors"
	"fmt"
	"github.com/c1702965/sqlstreams/internal/codes"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/internal/handlerctx"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
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
}

// Handler runs one delivery. nil is success; see policy.Classify for errors.
type Handler func(ctx context.Context, d *Delivery) error

// Job is a delivery ready to run, with the actor's reference to it.
type Job struct {
	Ref      Ref
	Delivery Delivery
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
}

// errNotLive is the outcome of a job the runner did not start because the
// instance's incarnation was lost.
var errNotLive = errors.New("not started: the instance's incarnation was lost")

// runner executes jobs: each attempt on a pool worker's goroutine under the
// message's timeout, panics turned into failures, and a handler that ignores
// its context past the grace period abandoned (counted) so the pool goes on
// (pool, decision 0055).
type runner struct {
	handler Handler
	clock   clock.Clock
	grace   time.Duration
	stats   *Stats
	// gate, if set, is waited on before each handler starts: false (the
	// incarnation was lost, or ctx ended) and the job is not run.
	gate func(ctx context.Context) bool

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

// Run executes one job synchronously on a goroutine of its own (a pool of
// one worker, for this job alone). It is the step tests and the simulator
// drive directly.
func (r *runner) Run(ctx context.Context, j Job) Outcome {
	p := r.startPool(ctx, 1, 1)
	p.jobs <- j
	o := <-p.out
	p.stop()
	return o
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

// pool runs n workers over jobs until it is closed, sending outcomes on out.
//
// A worker runs each job's handler on its own goroutine (decision 0055): the
// hand-off to a second goroutine and back cost two channel operations and
// two goroutine switches a message. A handler that overruns its Timeout
// and then TimeoutGrace keeps the worker's goroutine: the worker's watchdog
// (a timer it rearms for every job) gives up on it, sends its timeout
// outcome and starts another worker in its place, and the abandoned
// goroutine exits when the handler finally returns. When the pool's context
// ends, every running handler is given up on at once (its outcome is
// Canceled) and replaced, so the pool's stop never waits for a handler and
// a job sent later still gets an outcome.
type pool struct {
	r         *runner
	ctx       context.Context
	jobs      chan Job
	out       chan Outcome
	wg        sync.WaitGroup // workers not given up on
	closeJobs sync.Once
	// skip is set by quiesce: jobs not yet started are dropped unrun (their
	// messages were never delivered; a reclaimer delivers them).
	skip atomic.Bool

	mu      sync.Mutex
	workers []*worker // every worker started, given-up ones included until they exit; guarded by mu
	// unwatch stops the pool's watch on its context; watching is done when
	// that watch has run or will not.
	unwatch  func() bool
	watching sync.WaitGroup
}

// worker is one of a pool's workers.
type worker struct {
	p     *pool
	watch *clock.Timer // gives up on the running handler at giveUpAt; only the worker's goroutine arms it

	mu        sync.Mutex
	running   bool // a handler runs on the worker's goroutine
	abandoned bool // given up on: the goroutine exits when the handler returns
	job       Job
	started   time.Time
	hctx      *handlerctx.Ctx
	giveUpAt  time.Time // the running job's deadline plus the grace
}

func (r *runner) startPool(ctx context.Context, n, capacity int) *pool {
	p := &pool{r: r, ctx: ctx, jobs: make(chan Job, capacity), out: make(chan Outcome, capacity)}
	for range n {
		p.spawn()
	}
	p.watching.Add(1)
	p.unwatch = context.AfterFunc(ctx, func() {
		defer p.watching.Done()
		p.giveUpAll()
	})
	return p
}

// spawn starts a worker. Its goroutine counts as a handler goroutine too
// (waitHandlers), until it exits.
func (p *pool) spawn() {
	r := p.r
	w := &worker{p: p}
	p.mu.Lock()
	p.workers = append(p.workers, w)
	p.mu.Unlock()
	p.wg.Add(1)
	handlers := r.tracker()
	handlers.Add(1)
	r.live.Add(1)
	go func() {
		defer handlers.Done()
		defer r.live.Add(-1)
		defer p.forget(w)
		for j := range p.jobs {
			if p.skip.Load() {
				continue
			}
			o, kept := w.run(j)
			if !kept { // given up on: its outcome was sent and its place taken
				return
			}
			p.out <- o
		}
		if w.watch != nil {
			w.watch.Stop()
		}
		p.wg.Done()
	}()
}

// forget drops an exited worker from the pool's list.
func (p *pool) forget(w *worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.workers {
		if x == w {
			p.workers = append(p.workers[:i], p.workers[i+1:]...)
			return
		}
	}
}

// run runs one job's handler on the worker's goroutine. kept is false when
// the pool gave up on the handler while it ran: its outcome was sent then,
// and the worker must exit.
func (w *worker) run(j Job) (o Outcome, kept bool) {
	r, ctx := w.p.r, w.p.ctx
	if j.Delivery.Msg != nil {
		defer func() { o.msgID = j.Delivery.Msg.ID }()
	}
	if ctx.Err() != nil {
		return Outcome{Ref: j.Ref, Err: ctx.Err(), Canceled: true}, true
	}
	if r.gate != nil && !r.gate(ctx) {
		// Not provably live: the job settles nothing (the range is handed
		// back or reclaimed with its incarnation).
		return Outcome{Ref: j.Ref, Err: errNotLive, Canceled: true}, true
	}
	d := j.Delivery
	started := r.clock.Now()
	// The handler's context builds its timer only if the handler asks for
	// Done; the watchdog fires only if the handler outlives its grace.
	hctx := handlerctx.New(ctx, r.clock, started, d.Timeout)
	deadline, _ := hctx.Deadline()
	w.mu.Lock()
	w.running, w.job, w.started, w.hctx, w.giveUpAt = true, j, started, hctx, deadline.Add(r.grace)
	w.mu.Unlock()
	if ctx.Err() != nil { // ended as the job began: giveUpAll may have seen it running, or not
		if w.end() {
			return Outcome{}, false
		}
		return Outcome{Ref: j.Ref, Err: ctx.Err(), Canceled: true}, true
	}
	if wait := deadline.Add(r.grace).Sub(started); w.watch == nil {
		w.watch = r.clock.AfterFunc(wait, w.giveUp)
	} else {
		w.watch.Reset(wait)
	}
	err := r.call(hctx, &d)
	hctx.End()
	if w.end() {
		return Outcome{}, false
	}
	w.watch.Stop() // a fire that comes anyway finds nothing running (giveUp)
	o = r.outcome(ctx, hctx, j, err)
	o.Started, o.Duration = started, r.clock.Since(started)
	return o, true
}

// end marks the worker's handler returned and reports whether the pool gave
// up on it meanwhile.
func (w *worker) end() (abandoned bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.running = false
	w.job, w.hctx = Job{}, nil
	return w.abandoned
}

// giveUp is the watchdog: the running handler has overrun its deadline and
// the grace after it. It is abandoned (counted), its timeout outcome sent,
// and a new worker takes this one's place. A fire meant for an earlier job
// finds the running job's time not up, or nothing running, and does
// nothing.
func (w *worker) giveUp() {
	p := w.p
	r := p.r
	w.mu.Lock()
	if !w.running || w.abandoned || r.clock.Now().Before(w.giveUpAt) {
		w.mu.Unlock()
		return
	}
	w.abandoned = true
	j, started, hctx := w.job, w.started, w.hctx
	w.mu.Unlock()
	hctx.Expire()
	var o Outcome
	if err := p.ctx.Err(); err != nil {
		o = Outcome{Ref: j.Ref, Err: err, Canceled: true}
	} else {
		r.stats.Abandoned.Add(1)
		o = Outcome{Ref: j.Ref, Started: started, Duration: r.clock.Since(started),
			Err: fmt.Errorf("%w after %s; the handler ignored its context for %s more and was abandoned",
				policy.ErrTimeout, j.Delivery.Timeout, r.grace)}
	}
	p.replace(w, j, o)
}

// giveUpAll abandons every running handler when the pool's context ends:
// each job's outcome is Canceled, as its handler's would be.
func (p *pool) giveUpAll() {
	p.mu.Lock()
	workers := append([]*worker(nil), p.workers...)
	p.mu.Unlock()
	for _, w := range workers {
		w.mu.Lock()
		if !w.running || w.abandoned {
			w.mu.Unlock()
			continue
		}
		w.abandoned = true
		j := w.job
		w.mu.Unlock()
		p.replace(w, j, Outcome{Ref: j.Ref, Err: p.ctx.Err(), Canceled: true})
	}
}

// replace starts a worker in the place of w, given up on while running j,
// and sends j's outcome o.
func (p *pool) replace(w *worker, j Job, o Outcome) {
	if j.Delivery.Msg != nil {
		o.msgID = j.Delivery.Msg.ID
	}
	p.spawn()
	p.out <- o
	p.wg.Done() // w's: its goroutine exits without it
}

// stop closes the pool and waits for its workers (not for abandoned
// handlers: see waitHandlers).
func (p *pool) stop() {
	p.closeJobs.Do(func() { close(p.jobs) })
	p.wg.Wait()
	if p.unwatch() {
		p.watching.Done() // the watch will not run
	}
	p.watching.Wait()
}

// quiesce lets the handlers already running finish, starts nothing more, and
// waits for the workers until the deadline (on clk); it reports whether
// they all finished, every outcome then waiting on out. The workers'
// handler contexts are left alone: a handler that overruns its Timeout is
// abandoned by its worker as usual, so the wait is bounded by the longest
// Timeout plus TimeoutGrace as well.
func (p *pool) quiesce(clk clock.Clock, deadline time.Time) bool {
	p.skip.Store(true)
	p.closeJobs.Do(func() { close(p.jobs) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }() // ends with the workers, which stop (and close) waits for
	t := clk.Timer(max(deadline.Sub(clk.Now()), 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
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
	case <-t.C:
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
