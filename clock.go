package sqlstreams

import (
	"context"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/internal/clocks"
)

// Clock is what the library asks of time: every Go-side interval (poll
// rates, heartbeats, retry waits, deadlines) comes from ClientConfig.Clock.
// The default is RealClock(); tests pass a mock through ClockOf. Absolute
// times in the database are the database's now(), except under a mock
// clock made by ClockOf(clock.NewMock()), whose time every time-dependent
// statement uses instead, so that a test moving the mock moves leases,
// retries and schedules too. A Clock of your own is taken for a real one:
// the database's now() decides.
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

// Timer is a Clock's one-shot timer: time.Timer's methods, with its channel
// behind C.
type Timer = interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a Clock's repeating timer: time.Ticker's channel behind C, and
// Stop.
type Ticker = interface {
	C() <-chan time.Time
	Stop()
}

// The public interface and the engine's are one: each converts to the other.
var (
	_ clocks.Clock = Clock(nil)
	_ Clock        = clocks.Clock(nil)
)

// RealClock returns the wall clock, ClientConfig.Clock's default.
func RealClock() Clock { return clocks.Real() }

// ClockOf adapts a github.com/benbjohnson/clock Clock, which
// ClientConfig.Clock took before it took a Clock of this package:
// ClockOf(clock.NewMock()) is a mock clock the library recognises (see
// Clock; the test keeps the *clock.Mock to move it), ClockOf(clock.New())
// the real one. ClockOf(nil) is nil, so the default applies.
func ClockOf(c clock.Clock) Clock { return clocks.Of(c) }
