package sqlstreams

import (
	"context"
	"fmt"

	"github.com/c1702965/sqlstreams/internal/observe"
)

// Observer receives the engine's events as they happen, for metrics and
// traces: messages produced, every handler attempt (outcome, duration,
// produce-to-handler latency), claims and their statements' durations,
// and counted events (ranges claimed, reclaimed and quarantined, delivery
// stalls, binding waits, redrives). Set it on ClientConfig.Observer; the
// Prometheus collector (module github.com/c1702965/sqlstreams/prometheus)
// implements it. Its methods run on the engine's goroutines, on the claim
// and handler paths: they must be safe for concurrent use and return at
// once. Its labels are stream and group names only, never keys or ids.
// Embed NopObserver to implement only some methods.
type Observer = observe.Observer

// NopObserver does nothing; embed it in an Observer to implement only the
// methods you need (and stay compiling when methods are added).
type NopObserver = observe.Nop

// AttemptEvent is one finished handler attempt.
type AttemptEvent = observe.Attempt

// AttemptOutcome is how a handler attempt ended.
type AttemptOutcome = observe.Outcome

// Attempt outcomes.
const (
	OutcomeSuccess  = observe.Success
	OutcomeError    = observe.Error
	OutcomePanic    = observe.Panic
	OutcomeTimeout  = observe.Timeout
	OutcomeTerminal = observe.Terminal
	OutcomeDelay    = observe.Delay
)

// ObservedEvent names a counted occurrence.
type ObservedEvent = observe.Event

// Counted events.
const (
	EventRangeClaimed      = observe.RangeClaimed
	EventRangeReclaimed    = observe.RangeReclaimed
	EventRangeQuarantined  = observe.RangeQuarantined
	EventDeliveryStall     = observe.DeliveryStall
	EventBindingWait       = observe.BindingWait
	EventRedriven          = observe.Redriven
	EventAlertDropped      = observe.AlertDropped
	EventListenerReconnect = observe.ListenerReconnect
)

// observer is the client's Observer, never nil.
func (c *Client) observer() Observer { return observe.Or(c.cfg.Observer) }

// endSpan ends a Tracer span with the call's error, or with the panic
// unwinding through the call, which it then lets go on: deferred as
// `defer endSpan(end, &err)`. A plain `defer func() { end(err) }()` sees
// err == nil while a panic unwinds, and traced a panicking handler (a
// failure) and a produce whose payload panicked as successes.
func endSpan(end func(error), err *error) {
	if p := recover(); p != nil {
		end(fmt.Errorf("panic: %v", p))
		panic(p)
	}
	end(*err)
}

// Tracer opens spans around produces and handler attempts, carrying the
// producer's trace context to the consumer in the message's headers. Set
// it on ClientConfig.Tracer; the OpenTelemetry module
// (github.com/c1702965/sqlstreams/otel) implements it. Nil means none.
type Tracer interface {
	// StartSend runs once per Produce or ProduceBatch call, before the
	// insert: it returns the context of its span, the headers to add to
	// every message of the call (trace context: a message's own header of
	// the same name wins), and the function that ends the span with the
	// call's error.
	StartSend(ctx context.Context, stream string, messages int) (context.Context, Headers, func(error))
	// StartProcess runs before each handler attempt, with the message's
	// Meta (its Headers carry the producer's context): it returns the
	// handler's context and the function that ends the span with the
	// attempt's result. A panic (in a handler, or in a payload's
	// MarshalJSON during a produce) ends the span with an error naming it.
	StartProcess(ctx context.Context, meta Meta) (context.Context, func(error))
}
