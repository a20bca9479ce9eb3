package clocks

import (
	"context"
	"time"

	"github.com/benbjohnson/clock"
)

// Of adapts a github.com/benbjohnson/clock Clock: clock.New() becomes a
// real clock, a *clock.Mock a *Mock (whose time the engine sends to the
// database). nil stays nil, so that a config's default still applies.
func Of(c clock.Clock) Clock {
	switch c := c.(type) {
	case nil:
		return nil
	case *clock.Mock:
		return &Mock{adapted{c}, c}
	default:
		return adapted{c}
	}
}

// Mock is a clock that moves only when told to, for tests and the
// simulator: its timers fire, in order, as Add and Set move it past them.
// Under a Mock the engine sends the clock's time to every time-dependent
// statement (the database's now() would not move with it): engine.DBNow.
type Mock struct {
	adapted
	m *clock.Mock
}

// NewMock returns a Mock at the Unix epoch.
func NewMock() *Mock { return Of(clock.NewMock()).(*Mock) }

// Add moves the clock forward by d, firing the timers due on the way.
func (m *Mock) Add(d time.Duration) { m.m.Add(d) }

// Set moves the clock to t, firing the timers due on the way.
func (m *Mock) Set(t time.Time) { m.m.Set(t) }

// adapted is a benbjohnson Clock behind our interface.
type adapted struct{ c clock.Clock }

func (a adapted) Now() time.Time                  { return a.c.Now() }
func (a adapted) Since(t time.Time) time.Duration { return a.c.Since(t) }
func (a adapted) Timer(d time.Duration) Timer     { return adaptedTimer{a.c.Timer(d)} }
func (a adapted) Ticker(d time.Duration) Ticker   { return adaptedTicker{a.c.Ticker(d)} }

func (a adapted) AfterFunc(d time.Duration, f func()) Timer {
	return adaptedTimer{a.c.AfterFunc(d, f)}
}

func (a adapted) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return a.c.WithTimeout(parent, d)
}

func (a adapted) WithDeadline(parent context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return a.c.WithDeadline(parent, t)
}

type adaptedTimer struct{ t *clock.Timer }

func (a adaptedTimer) C() <-chan time.Time        { return a.t.C }
func (a adaptedTimer) Stop() bool                 { return a.t.Stop() }
func (a adaptedTimer) Reset(d time.Duration) bool { return a.t.Reset(d) }

type adaptedTicker struct{ t *clock.Ticker }

func (a adaptedTicker) C() <-chan time.Time { return a.t.C }
func (a adaptedTicker) Stop()               { a.t.Stop() }
