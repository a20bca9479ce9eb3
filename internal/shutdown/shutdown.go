// Package shutdown is the time a stopping Consume session has, and how its
// actors share it. When the caller's context ends, the engine Begins the
// plan once: in-flight handlers have until HandlersDeadline (ShutdownTimeout
// after the start), then the claimers hand back what is unfinished until
// HandBackDeadline, and the tree stops (the heartbeats give their rows back)
// until Deadline, Grace after HandlersDeadline. Every store call made on the
// way down runs under Context, bounded by those deadlines, so Consume
// returns within ShutdownTimeout + Grace whatever the database does: what
// could not be handed back in time lapses with its lease, as after a crash.
//
// The plan is shared, not per actor, so that a claimer restarted by the
// supervisor in the middle of a drain finds the drain under way with its
// deadlines already set, instead of starting a timer of its own (or none).
//
// It is part of the engine's inside, not an API for users.
package shutdown

import (
	"context"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
)

// Grace is the fixed time a stopping session has after ShutdownTimeout: to
// hand back unfinished work, stop its actors and give its instance rows back.
const Grace = 5 * time.Second

// The parts of Grace, from the handlers' deadline: the claimers hand work
// back until HandBackShare, wait for handlers that ignore their context
// until HandlersShare, and the tree's actors give their rows back until
// ReleaseShare; the session has returned by Grace.
const (
	HandBackShare = 3 * time.Second
	HandlersShare = 3500 * time.Millisecond
	ReleaseShare  = 4500 * time.Millisecond
)

// Plan is one session's shutdown. A nil *Plan never begins, and its
// Context bounds calls by Grace from the moment it is asked.
type Plan struct {
	clock   clocks.Clock
	started chan struct{}

	mu       sync.Mutex
	begun    bool
	handlers time.Time
	handBack time.Time
	release  time.Time
	deadline time.Time
}

// New returns a plan that has not begun.
func New(clk clocks.Clock) *Plan { return &Plan{clock: clk, started: make(chan struct{})} }

// Begin starts the shutdown now, giving handlers budget. Later calls change
// nothing.
func (p *Plan) Begin(budget time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.begun {
		return
	}
	now := p.clock.Now()
	p.begun = true
	p.handlers = now.Add(max(budget, 0))
	p.handBack = p.handlers.Add(HandBackShare)
	p.release = p.handlers.Add(ReleaseShare)
	p.deadline = p.handlers.Add(Grace)
	close(p.started)
}

// Started is closed when the shutdown begins.
func (p *Plan) Started() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.started
}

// Begun reports whether the shutdown has begun.
func (p *Plan) Begun() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.begun
}

// HandlersDeadline is when in-flight handlers are cancelled.
func (p *Plan) HandlersDeadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handlers
}

// HandBackDeadline is when the claimers stop trying to hand work back.
func (p *Plan) HandBackDeadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handBack
}

// HandlersWaitDeadline is how long a stopping handler pool waits for
// handlers that ignore their context: past it they are left behind.
func (p *Plan) HandlersWaitDeadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handlers.Add(HandlersShare)
}

// ReleaseDeadline is when the actors stop trying to give their rows back.
func (p *Plan) ReleaseDeadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.release
}

// Deadline is when the session has stopped, whatever is left.
func (p *Plan) Deadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deadline
}

// Context returns a context for store calls on the way down: it ignores
// ctx's cancellation (the actor's own stop is what it works under) and ends
// at the plan's hand-back deadline, or at its release deadline when release
// is set (the rows actors give back as the tree stops); before the plan
// begins (an abrupt stop), or without one, Grace from now.
func (p *Plan) Context(ctx context.Context, clk clocks.Clock, release bool) (context.Context, context.CancelFunc) {
	var until time.Time
	if p.Begun() {
		if release {
			until = p.ReleaseDeadline()
		} else {
			until = p.HandBackDeadline()
		}
	} else {
		until = clk.Now().Add(Grace)
	}
	return clk.WithDeadline(context.WithoutCancel(ctx), until)
}

// EndContext returns the context of what a session does last, as Run
// returns: it ends at the plan's deadline when the plan has begun (a
// graceful stop, so the session still returns by then), and is done already
// otherwise (an abrupt stop or an error: nothing more is asked of the
// database).
func (p *Plan) EndContext(ctx context.Context, clk clocks.Clock) (context.Context, context.CancelFunc) {
	if !p.Begun() {
		ended, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cancel()
		return ended, cancel
	}
	return clk.WithDeadline(context.WithoutCancel(ctx), p.Deadline())
}

// Until returns how long from now until t (at least 0).
func Until(clk clocks.Clock, t time.Time) time.Duration { return max(t.Sub(clk.Now()), 0) }
