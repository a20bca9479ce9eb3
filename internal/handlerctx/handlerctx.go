// Package handlerctx holds the context a handler runs under: its parent's
// values and cancellation, and the message's deadline, with the machinery
// of both (a channel, a timer, a link to the parent) built only when the
// handler asks for Done.
//
// context.WithTimeout builds all of it for every message: a timer, and a
// registration in the parent's set of children, removed again when the
// handler returns. In the 4-instance burn-down that was about a tenth of
// the consumer's CPU (issue 22: 2.1 s in WithDeadline and 1.0 s in its
// cancel, of 30.8 s sampled), for handlers most of which never look at
// Done. The runner that calls the handler watches the deadline with a timer
// of its own that it reuses from message to message, and ends the context
// (Expire, End) itself.
//
// It is part of the engine's inside, not an API for users.
package handlerctx

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
)

// Ctx is a handler's context. It behaves as context.WithDeadline's does:
// Done is closed and Err returns context.DeadlineExceeded once the deadline
// has passed, the parent's error once the parent is done, and
// context.Canceled once End is called, whichever comes first; Err never
// changes once it is not nil. Contexts derived from it link to it without a
// goroutine (AfterFunc). One difference: context.Cause reports the
// parent's cause, not this context's deadline.
type Ctx struct {
	parent   context.Context
	clock    clocks.Clock
	deadline time.Time

	mu     sync.Mutex
	err    error         // why it ended; nil while it has not
	done   chan struct{} // built by Done or AfterFunc
	timer  clocks.Timer  // closes done at the deadline, once built
	unlink func() bool   // stops the link to the parent, once built
	funcs  map[*afterFunc]struct{}
}

type afterFunc struct{ f func() }

// New returns a context that ends timeout after now (on clk), or at the
// parent's deadline if that is sooner.
func New(parent context.Context, clk clocks.Clock, now time.Time, timeout time.Duration) *Ctx {
	deadline := now.Add(timeout)
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return &Ctx{parent: parent, clock: clk, deadline: deadline}
}

// Deadline implements context.Context.
func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, true }

// Value implements context.Context: the parent's values.
func (c *Ctx) Value(key any) any { return c.parent.Value(key) }

// Done implements context.Context. The first call builds the channel, the
// timer that closes it at the deadline and the link to the parent.
func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.build()
	return c.done
}

// Err implements context.Context.
func (c *Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.done != nil {
		return c.err // built: the timer or the parent's link sets it when done closes
	}
	c.err = c.ended() // not built: read the clock and the parent, and keep what was found
	return c.err
}

// AfterFunc arranges for f to run on a goroutine of its own once the
// context ends, as context.AfterFunc does; stop keeps it from running and
// reports whether it did. Through it, context.WithCancel and the like
// link a derived context to this one without a goroutine.
func (c *Ctx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	c.build()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	if c.funcs == nil {
		c.funcs = map[*afterFunc]struct{}{}
	}
	c.funcs[a] = struct{}{}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.funcs[a]
		delete(c.funcs, a)
		return ok
	}
}

// Expire ends the context with context.DeadlineExceeded: the caller's own
// timer saw the deadline pass.
func (c *Ctx) Expire() { c.finish(context.DeadlineExceeded) }

// End ends the context with context.Canceled (a no-op once it has ended):
// the handler returned, as a CancelFunc does.
func (c *Ctx) End() { c.finish(context.Canceled) }

// String names the context and its deadline, as the standard library's do.
func (c *Ctx) String() string {
	return fmt.Sprintf("handlerctx.Ctx(deadline %s)", c.deadline.Format(time.RFC3339Nano))
}

// ended is why the context has ended by now, if it has: the parent's
// error first, then the deadline. c.mu is held.
func (c *Ctx) ended() error {
	if err := c.parent.Err(); err != nil {
		return err
	}
	if !c.clock.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// build makes the done channel, closed at once when the context has already
// ended, and otherwise the timer and the parent's link that will close it.
// c.mu is held.
func (c *Ctx) build() {
	if c.done != nil {
		return
	}
	c.done = make(chan struct{})
	if c.err == nil {
		c.err = c.ended()
	}
	if c.err != nil {
		close(c.done)
		return
	}
	c.timer = c.clock.AfterFunc(c.deadline.Sub(c.clock.Now()), c.Expire)
	c.unlink = context.AfterFunc(c.parent, func() { c.finish(c.parent.Err()) })
}

// finish ends the context with err unless it has ended already.
func (c *Ctx) finish(err error) {
	c.mu.Lock()
	if c.err != nil { // ended already: a built done was closed then
		c.mu.Unlock()
		return
	}
	c.err = err
	var funcs map[*afterFunc]struct{}
	if c.done != nil {
		close(c.done)
		c.timer.Stop()
		c.unlink()
		funcs, c.funcs = c.funcs, nil
	}
	c.mu.Unlock()
	for a := range funcs {
		go a.f()
	}
}
