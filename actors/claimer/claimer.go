// Package claimer is the actor that turns a group's log into handler calls.
//
// It claims ranges (one short transaction each), dispatches their messages to
// a pool of handler workers, collects outcomes, and commits a range once every
// message in it has an outcome. Its state (the ranges in flight) is owned by
// the actor alone; workers only see jobs and send outcomes back on channels.
//
// The step functions (Claim, Outcome, Flush, HandBack) do their store calls
// synchronously and are what tests and the simulator drive; Serve is the thin
// loop that runs them on a ticker in production.
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

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Handler runs one message. A returned error or a panic is a failure.
type Handler func(ctx context.Context, m *store.Message) error

// Stats are the actor's counters, safe to read while it runs.
type Stats struct {
	Claimed    atomic.Int64 // messages handed to workers
	Reclaimed  atomic.Int64 // ranges taken over from an expired lease
	Succeeded  atomic.Int64
	Failed     atomic.Int64 // handler errors and panics
	Committed  atomic.Int64 // ranges committed
	LeasesLost atomic.Int64 // commits fenced off by a reclaimer
	Stalls     atomic.Int64 // claims held back by an open transaction past StallAfter
}

// Config is what the actor needs.
type Config struct {
	Store      *store.Store
	StreamID   int64
	GroupID    int64
	InstanceID string
	Handler    Handler
	// BatchLimit is the most messages one claim takes.
	BatchLimit int
	// QueueSize bounds the messages claimed but not yet settled; a claim
	// happens only when a whole batch fits.
	QueueSize int
	// Concurrency is the number of handler workers.
	Concurrency int
	// PollRate is how often an idle claimer looks for work.
	PollRate time.Duration
	// Lease is the lease length written on a claim; the heartbeat renews it.
	Lease time.Duration
	// ExceptionBackoff delays the first retry of a failed message.
	ExceptionBackoff time.Duration
	// StallAfter is how long claims may find rows held back by an open
	// transaction before the stall is logged and counted.
	StallAfter time.Duration
	// ShutdownTimeout bounds the drain of in-flight handlers.
	ShutdownTimeout time.Duration
	Clock           clock.Clock
	Logger          *slog.Logger
	DBNow           func() store.Now
	Stats           *Stats
	// Lost carries the heartbeat's reports that the instance row was gone.
	Lost <-chan struct{}
	// Drain is closed to ask for a graceful stop: no more claims, finish or
	// hand back what is in flight, then return.
	Drain <-chan struct{}
}

type job struct {
	rangeID int64
	index   int
	msg     *store.Message
}

// Outcome is one handled message.
type Outcome struct {
	RangeID int64
	Index   int
	Err     error
}

type inflight struct {
	r       store.Range
	done    []bool
	errs    []error
	pending int
}

// Actor is the claimer actor.
type Actor struct {
	cfg      Config
	ranges   map[int64]*inflight
	order    []int64 // range ids in claim order, for hand-back
	queued   int     // messages claimed and not settled
	toCommit []int64 // complete ranges whose commit failed and must be retried
	jobs     chan job
	outcomes chan Outcome

	stallSince time.Time
	stalled    bool
	failing    bool
}

// New returns a claimer actor.
func New(cfg Config) *Actor {
	return &Actor{
		cfg:      cfg,
		ranges:   map[int64]*inflight{},
		jobs:     make(chan job, cfg.QueueSize),
		outcomes: make(chan Outcome, cfg.QueueSize),
	}
}

// reset drops in-memory state, as a restarted actor must.
func (a *Actor) reset() {
	a.ranges = map[int64]*inflight{}
	a.order, a.toCommit, a.queued = nil, nil, 0
	a.jobs = make(chan job, a.cfg.QueueSize)
	a.outcomes = make(chan Outcome, a.cfg.QueueSize)
}

// Queued returns how many messages are claimed and not yet settled.
func (a *Actor) Queued() int { return a.queued }

// Claim takes one range when a whole batch fits in the queue, reclaiming an
// expired lease of the group before reading new positions. It returns how
// many messages it dispatched.
func (a *Actor) Claim(ctx context.Context) (int, error) {
	if a.queued+a.cfg.BatchLimit > a.cfg.QueueSize {
		return 0, nil
	}
	args := store.ClaimArgs{
		StreamID: a.cfg.StreamID, GroupID: a.cfg.GroupID, Owner: a.cfg.InstanceID,
		Limit: a.cfg.BatchLimit, Lease: a.cfg.Lease, Now: a.cfg.DBNow(),
	}
	r, ok, err := a.cfg.Store.ReclaimRange(ctx, args)
	if err != nil {
		return 0, err
	}
	if ok {
		a.cfg.Stats.Reclaimed.Add(1)
		a.cfg.Logger.Info("reclaimed an expired range", "range", r.ID, "reclaims", r.Reclaims, "messages", len(r.Messages))
		return a.dispatch(ctx, r)
	}
	r, ok, err = a.cfg.Store.ClaimRange(ctx, args)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, a.checkGate(ctx)
	}
	a.clearStall()
	return a.dispatch(ctx, r)
}

func (a *Actor) dispatch(ctx context.Context, r store.Range) (int, error) {
	in := &inflight{r: r, done: make([]bool, len(r.Messages)), errs: make([]error, len(r.Messages)), pending: len(r.Messages)}
	a.ranges[r.ID] = in
	a.order = append(a.order, r.ID)
	if in.pending == 0 { // a reclaimed lease over positions that no longer exist
		return 0, a.settle(ctx, r.ID)
	}
	a.queued += len(r.Messages)
	a.cfg.Stats.Claimed.Add(int64(len(r.Messages)))
	for i := range r.Messages {
		a.jobs <- job{rangeID: r.ID, index: i, msg: &r.Messages[i]}
	}
	return len(r.Messages), nil
}

// checkGate runs after an empty claim: if committed rows wait behind an open
// transaction for longer than StallAfter, the stall is logged once and
// counted. Nothing is skipped; delivery resumes when the transaction ends.
func (a *Actor) checkGate(ctx context.Context) error {
	g, err := a.cfg.Store.GateProbe(ctx, a.cfg.StreamID, a.cfg.GroupID)
	if err != nil {
		return err
	}
	if !g.Pending {
		a.clearStall()
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
	blockers, err := a.cfg.Store.GateBlockers(ctx, g.Xmin)
	if err != nil {
		return err
	}
	attrs := []any{"group_id", a.cfg.GroupID, "waiting", now.Sub(a.stallSince).String(), "oldest_open_xid", g.Xmin}
	for _, b := range blockers {
		attrs = append(attrs, "blocker_pid", b.PID, "blocker_application", b.ApplicationName,
			"blocker_xact_start", b.XactStart, "blocker_state", b.State)
	}
	a.cfg.Logger.Warn("delivery stalled: committed messages wait behind an open transaction", attrs...)
	return nil
}

func (a *Actor) clearStall() {
	if a.stalled {
		a.cfg.Logger.Info("delivery resumed after a stall", "group_id", a.cfg.GroupID)
	}
	a.stallSince, a.stalled = time.Time{}, false
}

// Outcome records one handled message and commits its range when the range
// is complete.
func (a *Actor) Outcome(ctx context.Context, o Outcome) error {
	in, ok := a.ranges[o.RangeID]
	if !ok || in.done[o.Index] {
		return nil // a range dropped after a lost lease or a hand-back
	}
	in.done[o.Index] = true
	in.errs[o.Index] = o.Err
	in.pending--
	a.queued--
	if o.Err != nil {
		a.cfg.Stats.Failed.Add(1)
	} else {
		a.cfg.Stats.Succeeded.Add(1)
	}
	if in.pending > 0 {
		return nil
	}
	return a.settle(ctx, o.RangeID)
}

func (a *Actor) settle(ctx context.Context, id int64) error {
	if err := a.commit(ctx, id); err != nil {
		a.toCommit = append(a.toCommit, id)
		return err
	}
	return nil
}

func (a *Actor) commit(ctx context.Context, id int64) error {
	in := a.ranges[id]
	var failures []store.Failure
	for i, err := range in.errs {
		if err != nil {
			failures = append(failures, store.Failure{Position: in.r.Messages[i].Position, Error: err.Error()})
		}
	}
	err := a.cfg.Store.CommitRange(ctx, a.cfg.StreamID, id, in.r.Token, failures, a.cfg.ExceptionBackoff, a.cfg.DBNow())
	if errors.Is(err, store.ErrLeaseLost) {
		a.cfg.Stats.LeasesLost.Add(1)
		a.cfg.Logger.Warn("range lease lost before commit; a reclaimer delivers it again", "range", id)
		a.forget(id)
		return nil
	}
	if err != nil {
		return err
	}
	a.cfg.Stats.Committed.Add(1)
	a.forget(id)
	return nil
}

func (a *Actor) forget(id int64) {
	delete(a.ranges, id)
	for i, rid := range a.order {
		if rid == id {
			a.order = append(a.order[:i], a.order[i+1:]...)
			break
		}
	}
}

// Flush retries commits that failed earlier (a database restart, say).
func (a *Actor) Flush(ctx context.Context) error {
	pending := a.toCommit
	a.toCommit = nil
	for i, id := range pending {
		if err := a.commit(ctx, id); err != nil {
			a.toCommit = append(a.toCommit, pending[i:]...)
			return err
		}
	}
	return nil
}

// HandBack returns every range still in flight: a range whose messages all
// have outcomes is committed; any other is released with its settled prefix
// dropped and its lease expired now, so another instance takes it at once.
func (a *Actor) HandBack(ctx context.Context) error {
	var errs []error
	if err := a.Flush(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, id := range append([]int64(nil), a.order...) {
		in := a.ranges[id]
		if in.pending == 0 {
			if err := a.commit(ctx, id); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		var lo *store.Position // nil keeps the stored bound
		for i := range in.r.Messages {
			if !in.done[i] || in.errs[i] != nil {
				break
			}
			lo = &in.r.Messages[i].Position
		}
		err := a.cfg.Store.ReleaseRange(ctx, a.cfg.StreamID, in.r.ID, in.r.Token, lo, a.cfg.DBNow())
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			errs = append(errs, err)
		}
		a.queued -= in.pending
		a.forget(id)
	}
	return errors.Join(errs...)
}

// work runs jobs until the channel closes. A panic is a failure with its
// value and stack, never a crash.
func (a *Actor) work(ctx context.Context) {
	for j := range a.jobs {
		err := ctx.Err() // past the drain deadline no new handler starts
		if err == nil {
			err = a.run(ctx, j.msg)
		}
		a.outcomes <- Outcome{RangeID: j.rangeID, Index: j.index, Err: err}
	}
}

func (a *Actor) run(ctx context.Context, m *store.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panic: %v\n%s", p, debug.Stack())
		}
	}()
	return a.cfg.Handler(ctx, m)
}

// Serve runs the actor until ctx ends (an abrupt stop: nothing is committed
// or handed back) or until Drain is closed and the drain finishes.
func (a *Actor) Serve(ctx context.Context) error {
	// A restarted claimer has lost its predecessor's ranges; hand them back
	// so the heartbeat does not keep them alive.
	if err := a.cfg.Store.ExpireOwnedRanges(ctx, a.cfg.InstanceID, a.cfg.StreamID, a.cfg.DBNow()); err != nil {
		return err
	}
	a.reset()
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for range a.cfg.Concurrency {
		wg.Add(1)
		go func() { defer wg.Done(); a.work(hctx) }()
	}
	stopWorkers := func() {
		close(a.jobs)
		wg.Wait()
	}
	defer func() {
		cancelHandlers()
		stopWorkers()
	}()
	wg.Add(1)
	go func() { // handler contexts end with the actor's unless a drain is under way
		defer wg.Done()
		select {
		case <-ctx.Done():
			cancelHandlers()
		case <-hctx.Done():
		}
	}()

	ticker := a.cfg.Clock.Ticker(a.cfg.PollRate)
	defer ticker.Stop()
	drain := a.cfg.Drain
	var deadline <-chan time.Time
	for {
		if deadline == nil {
			for {
				n, err := a.Claim(ctx)
				a.report(ctx, err)
				if err != nil || n < a.cfg.BatchLimit {
					break
				}
				a.absorb(ctx) // keep outcomes flowing while claims are full
			}
		} else if a.queued == 0 {
			return a.finishDrain(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-drain:
			drain = nil
			timer := a.cfg.Clock.Timer(a.cfg.ShutdownTimeout)
			defer timer.Stop()
			deadline = timer.C
		case <-deadline:
			a.cfg.Logger.Warn("shutdown timeout reached with handlers still running; handing their ranges back",
				"in_flight", a.queued)
			cancelHandlers()
			return a.finishDrain(ctx)
		case o := <-a.outcomes:
			a.report(ctx, a.Outcome(ctx, o))
		case <-a.cfg.Lost:
			a.cfg.Logger.Warn("instance row was lost; in-flight ranges are fenced if reclaimed", "in_flight", a.queued)
		case <-ticker.C:
			a.report(ctx, a.Flush(ctx))
		}
	}
}

// absorb applies every outcome already waiting, without blocking.
func (a *Actor) absorb(ctx context.Context) {
	for {
		select {
		case o := <-a.outcomes:
			a.report(ctx, a.Outcome(ctx, o))
		default:
			return
		}
	}
}

func (a *Actor) finishDrain(ctx context.Context) error {
	a.absorb(ctx)
	if err := a.HandBack(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("hand back in-flight ranges: %w", err)
	}
	return nil
}

// report logs a failing store call once per outage; the actor keeps its
// state and retries, so a database restart costs a pause, not a session.
func (a *Actor) report(ctx context.Context, err error) {
	switch {
	case err != nil && !a.failing && ctx.Err() == nil:
		a.failing = true
		a.cfg.Logger.Warn("claimer store call failed; retrying every poll", "group_id", a.cfg.GroupID, "error", err)
	case err == nil && a.failing:
		a.failing = false
		a.cfg.Logger.Info("claimer recovered", "group_id", a.cfg.GroupID)
	}
}
