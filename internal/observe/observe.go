// Package observe is the engine's observer hook: the events metrics and
// traces are made of, handed to an Observer the application supplies
// (ClientConfig.Observer). It depends on nothing, so that the core module
// needs no metrics library; the Prometheus and OpenTelemetry modules
// implement Observer.
//
// It is part of the engine's inside, not an API for users: the root package
// re-exports its types.
package observe

import "time"

// Outcome is how one handler attempt ended.
type Outcome string

// Attempt outcomes.
const (
	Success  Outcome = "success"
	Error    Outcome = "error"    // an error: retried on the curve, or dead when the budget is spent
	Panic    Outcome = "panic"    // the handler panicked (a failure)
	Timeout  Outcome = "timeout"  // the handler outlived its Timeout (a failure)
	Terminal Outcome = "terminal" // Terminal(err): dead at once
	Delay    Outcome = "delay"    // Delay(d): runs again later, no retry spent
)

// Attempt is one finished handler attempt.
type Attempt struct {
	Stream, Group string
	Outcome       Outcome
	// Attempt is the attempt's number (1 for the first delivery).
	Attempt int
	// Dead is true when this attempt made the message a dead letter.
	Dead bool
	// Duration is how long the handler ran.
	Duration time.Duration
	// SinceProduced is the time from the message's produce to the start of
	// this attempt (produce-to-handler latency).
	SinceProduced time.Duration
}

// Event names a counted occurrence.
type Event string

// Counted events.
const (
	RangeClaimed      Event = "range_claimed"
	RangeReclaimed    Event = "range_reclaimed"
	RangeQuarantined  Event = "range_quarantined"
	DeliveryStall     Event = "delivery_stall"
	BindingWait       Event = "binding_wait"
	Redriven          Event = "redriven"
	AlertDropped      Event = "alert_dropped"
	ListenerReconnect Event = "listener_reconnect"
)

// Observer receives the events. Its methods are called on the engine's
// goroutines, on the claim and handler paths: they must be safe for
// concurrent use, return at once, and never block (count, then return).
// Labels are a stream's and a group's names only (bounded by the schema's
// registered streams and groups); never keys, ids or payloads.
type Observer interface {
	// Produced reports n messages produced to stream (committed by then,
	// or in the caller's transaction).
	Produced(stream string, n int)
	// AttemptDone reports one finished handler attempt.
	AttemptDone(a Attempt)
	// Count reports n occurrences of e for a group (group "" for events of
	// the client: listener reconnects).
	Count(stream, group string, e Event, n int)
	// ClaimDuration reports how long one claim statement took.
	ClaimDuration(stream, group string, d time.Duration)
}

// Nop is an Observer that does nothing: the default.
type Nop struct{}

func (Nop) Produced(string, int)                        {}
func (Nop) AttemptDone(Attempt)                         {}
func (Nop) Count(string, string, Event, int)            {}
func (Nop) ClaimDuration(string, string, time.Duration) {}

// Or returns o, or Nop when o is nil.
func Or(o Observer) Observer {
	if o == nil {
		return Nop{}
	}
	return o
}
