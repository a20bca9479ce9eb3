// Package alert is what the actors that notice a notable event (the
// registrar: a binding set waiting on live incumbents; the range claimer:
// delivery stalled behind an open transaction) hand the alerts actor: the
// Event, and the bounded Queue it travels on. It sits below the actors so
// that none of them imports another's package.
//
// Actors hand events to a Queue and never wait: a full queue drops the
// event and counts the drop (the condition is logged by the actor that
// noticed it in any case).
//
// It is part of the engine's inside, not an API for users.
package alert

import (
	"context"
	"sync/atomic"
	"time"

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

func (k Kind) String() string {
	switch k {
	case BindingWaiting:
		return "binding.waiting"
	case DeliveryStalled:
		return "delivery.stalled"
	}
	return "unknown"
}

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

// Publish produces one event as an alert (the alerts actor calls it).
type Publish func(ctx context.Context, e Event) error

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
