// Package alerts is the actor that turns a session's notable events (its
// binding set waiting on live incumbents, delivery stalled behind an open
// transaction) into alert messages on the system's alert stream, off the
// loops of the actors that notice them.
//
// Actors hand events to a bounded Queue and never wait: a full queue drops
// the event and counts the drop (the condition is logged by the actor that
// noticed it in any case). The Actor reads the queue and publishes each
// event through the function it is given, one at a time.
//
// It is part of the engine's inside, not an API for users.
package alerts

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/store"
)

// QueueSize bounds the events waiting to be published.
const QueueSize = 16

// Kind is what happened.
type Kind int

const (
	// BindingWaiting: the session's binding set waits on live incumbents.
	BindingWaiting Kind = iota + 1
	// DeliveryStalled: committed messages wait behind an open transaction.
	DeliveryStalled
)

// Event is one notable event.
type Event struct {
	Kind Kind
	// Since is when the condition began.
	Since time.Time
	// Waited is how long a stall has lasted (DeliveryStalled).
	Waited time.Duration
	// Binding is the waiting attempt's result (BindingWaiting).
	Binding store.BindingResult
	// Blockers are the sessions a stall waits for (DeliveryStalled).
	Blockers []store.Blocker
}

// Queue is the bounded channel events travel on. A nil *Queue drops
// everything.
type Queue struct {
	ch      chan Event
	dropped *atomic.Int64
	// OnDrop, if set before the queue is used, is called for each dropped
	// event (the observer's count).
	OnDrop func()
}

// NewQueue returns a queue of QueueSize events; dropped, if set, counts the
// events a full queue dropped.
func NewQueue(dropped *atomic.Int64) *Queue {
	return &Queue{ch: make(chan Event, QueueSize), dropped: dropped}
}

// Send hands e over without waiting: when the queue is full the event is
// dropped and counted.
func (q *Queue) Send(e Event) {
	if q == nil {
		return
	}
	select {
	case q.ch <- e:
	default:
		if q.OnDrop != nil {
			q.OnDrop()
		}
		if q.dropped != nil {
			q.dropped.Add(1)
		}
	}
}

// C is the queue's receiving side.
func (q *Queue) C() <-chan Event { return q.ch }

// Publish produces one event as an alert.
type Publish func(ctx context.Context, e Event) error

// Actor publishes a session's events.
type Actor struct {
	q       *Queue
	publish Publish
	logger  *slog.Logger
	waiting bool // a wait's alert went out: its later attempts send none
}

// New returns the actor reading q.
func New(q *Queue, publish Publish, logger *slog.Logger) *Actor {
	return &Actor{q: q, publish: publish, logger: logger}
}

// Step publishes one event: a binding wait once, however many attempts it
// takes; every stall. A failed publish is logged (SQL0104), not retried:
// the condition itself was logged by the actor that noticed it.
func (a *Actor) Step(ctx context.Context, e Event) {
	if e.Kind == BindingWaiting {
		if a.waiting {
			return
		}
		a.waiting = true
	}
	if err := a.publish(ctx, e); err != nil && ctx.Err() == nil {
		codes.AlertFailed.Log(ctx, a.logger, "could not produce an alert", "kind", e.Kind.String(), "error", err)
	}
}

// Serve publishes events until ctx ends.
func (a *Actor) Serve(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-a.q.ch:
			a.Step(ctx, e)
		}
	}
}

func (k Kind) String() string {
	switch k {
	case BindingWaiting:
		return "binding.waiting"
	case DeliveryStalled:
		return "delivery.stalled"
	}
	return "unknown"
}
