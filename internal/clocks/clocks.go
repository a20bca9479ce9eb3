// Package clocks is the one clock the engine reads: the Clock interface
// every package takes (only the methods the library calls), its real
// implementation on package time, and the adapter from a
// github.com/benbjohnson/clock Clock, whose Mock drives the tests and the
// simulator (decision 0088). The root writes Clock out again as
// sqlstreams.Clock, the same interface, with the adapter as
// sqlstreams.ClockOf.
//
// It is part of the engine's inside, not an API for users.
//
// github.com/benbjohnson/clock is archived upstream: only adapt.go (and
// the root's ClockOf, whose signature names it) imports it, so that a
// maintained implementation can replace it here alone.
package clocks

import (
	"context"
	"time"
)

// Clock is what the engine asks of time: every Go-side interval (tickers,
// poll rates, retry waits, deadlines) comes from one.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Since returns the time elapsed since t.
	Since(t time.Time) time.Duration
	// Timer returns a Timer whose C delivers the time once d has passed.
	Timer(d time.Duration) Timer
	// Ticker returns a Ticker whose C delivers the time every d.
	Ticker(d time.Duration) Ticker
	// AfterFunc calls f in its own goroutine once d has passed; the Timer
	// it returns stops it (its C is nil).
	AfterFunc(d time.Duration, f func()) Timer
	// WithTimeout is context.WithTimeout on this clock.
	WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc)
	// WithDeadline is context.WithDeadline on this clock.
	WithDeadline(parent context.Context, t time.Time) (context.Context, context.CancelFunc)
}

// Timer is a one-shot timer, as time.Timer with its channel behind a
// method. An alias of an interface literal, so that the root's
// sqlstreams.Timer, written out for its documentation, is the same type.
type Timer = interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a repeating timer, as time.Ticker with its channel behind a
// method (an alias for the same reason as Timer).
type Ticker = interface {
	C() <-chan time.Time
	Stop()
}
