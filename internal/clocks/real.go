package clocks

import (
	"context"
	"time"
)

// Real returns the wall clock: package time's. It is the only code of the
// engine that calls time.Now and starts timers of its own.
func Real() Clock { return wall{} }

type wall struct{}

func (wall) Now() time.Time                  { return time.Now() }
func (wall) Since(t time.Time) time.Duration { return time.Since(t) }
func (wall) Timer(d time.Duration) Timer     { return wallTimer{time.NewTimer(d)} }
func (wall) Ticker(d time.Duration) Ticker   { return wallTicker{time.NewTicker(d)} }

func (wall) AfterFunc(d time.Duration, f func()) Timer { return wallTimer{time.AfterFunc(d, f)} }

func (wall) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, d)
}

func (wall) WithDeadline(parent context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(parent, t)
}

// wallTimer and wallTicker hold one pointer, so an interface holds them
// without allocating.
type wallTimer struct{ t *time.Timer }

func (w wallTimer) C() <-chan time.Time        { return w.t.C }
func (w wallTimer) Stop() bool                 { return w.t.Stop() }
func (w wallTimer) Reset(d time.Duration) bool { return w.t.Reset(d) }

type wallTicker struct{ t *time.Ticker }

func (w wallTicker) C() <-chan time.Time { return w.t.C }
func (w wallTicker) Stop()               { w.t.Stop() }
