// Package incarnation holds what the heartbeat tells the claimers and the
// engine about the instance's incarnation: its Liveness (how long it may
// start work; whether it was lost). It sits below the actors so that the
// claimer reads what the heartbeat writes without importing its package.
//
// It is part of the engine's inside, not an API for users.
package incarnation

import (
	"context"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
)

// SafetyMargin is the share of the TTL an instance gives up at the end of
// each lease period: after a renewal sent at t, the instance counts itself
// live only until t + TTL - TTL/SafetyMargin, so that it stops starting work
// a tenth of the TTL before any other instance may take its leases over,
// whatever the clocks of the two processes and the database drift by.
const SafetyMargin = 10

// Liveness is one incarnation of an instance: how long it may go on
// starting work (valid until the last renewal's send time + TTL, minus the
// SafetyMargin), and whether it was lost (its row lapsed or was gone at a
// renewal). The heartbeat writes it and never waits on it; the claimers ask
// it before they claim or start a handler (Valid, Wait); the engine watches C
// for a loss and then registers the session again under new instance ids. A
// loss is final for the incarnation. A nil *Liveness is always valid.
//
// It is shared memory between the session's heartbeat (the writer) and
// its claimers and engine (the readers): every field is behind one mutex,
// and nobody waits on it while holding anything else.
type Liveness struct {
	ttl    time.Duration
	clock  clocks.Clock
	signal chan struct{} // the engine's: something changed

	mu         sync.Mutex
	validUntil time.Time
	renewed    time.Time
	lost       bool
	changed    chan struct{} // closed and replaced at each change (Wait)
}

// NewLiveness returns the liveness of an incarnation whose rows last ttl;
// it is not valid until Start.
func NewLiveness(clk clocks.Clock, ttl time.Duration) *Liveness {
	return &Liveness{ttl: ttl, clock: clk, signal: make(chan struct{}, 1), changed: make(chan struct{})}
}

// Start says the incarnation's rows were inserted by a statement sent at
// sentAt.
func (l *Liveness) Start(sentAt time.Time) { l.Renewed(sentAt) }

func (l *Liveness) until(sentAt time.Time) time.Time {
	return sentAt.Add(l.ttl - l.ttl/SafetyMargin)
}

// Renewed says a renewal sent at sentAt found the rows live.
func (l *Liveness) Renewed(sentAt time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if !l.lost && sentAt.After(l.renewed) {
		l.renewed = sentAt
		l.validUntil = l.until(sentAt)
	}
	l.mu.Unlock()
	l.poke()
}

// Lose ends the incarnation: the heartbeat calls it when the row lapsed or
// was gone, and the engine for a session's other worker when one of its
// two rows was lost (the session registers both again, so what either
// claimer still holds is salvaged and left to the next incarnation).
func (l *Liveness) Lose() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.lost = true
	l.mu.Unlock()
	l.poke()
}

func (l *Liveness) poke() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	select {
	case l.signal <- struct{}{}:
	default: // a signal is pending already
	}
}

// Valid reports whether the incarnation may start work now: not lost, and
// before its valid-until.
func (l *Liveness) Valid() bool {
	if l == nil {
		return true
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost && now.Before(l.validUntil)
}

// Lost reports whether the incarnation was lost.
func (l *Liveness) Lost() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// ValidUntil is the end of the current validity (zero before Start).
func (l *Liveness) ValidUntil() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Wait returns true once the incarnation is valid (at once when it is),
// false when it is lost or ctx ends first. A worker about to start a handler
// waits here, so a process that resumes after a stall starts nothing until
// a renewal has proved its leases are still its own.
func (l *Liveness) Wait(ctx context.Context) bool {
	if l == nil {
		return ctx.Err() == nil
	}
	for {
		l.mu.Lock()
		ch := l.changed
		l.mu.Unlock()
		if l.Valid() {
			return true
		}
		if l.Lost() {
			return false
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// C receives a value after a change (one consumer: the engine); nil for a
// nil Liveness.
func (l *Liveness) C() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.signal
}
