// Package alerts is the actor that turns a session's notable events (its
// binding set waiting on live incumbents, delivery stalled behind an open
// transaction) into alert messages on the system's alert stream, off the
// loops of the actors that notice them.
//
// The actors that notice an event hand it to a bounded alert.Queue
// (internal/alert) and never wait. The Actor reads the queue and publishes
// each event through the function it is given, one at a time.
//
// It is part of the engine's inside, not an API for users.
package alerts

import (
	"context"
	"log/slog"

	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/c1702965/sqlstreams/internal/codes"
)

// Actor publishes a session's events.
type Actor struct {
	q       *alert.Queue
	publish alert.Publish
	logger  *slog.Logger
	waiting bool // a wait's alert went out: its later attempts send none
}

// New returns the actor reading q.
func New(q *alert.Queue, publish alert.Publish, logger *slog.Logger) *Actor {
	return &Actor{q: q, publish: publish, logger: logger}
}

// Step publishes one event: a binding wait once, however many attempts it
// takes; every stall. A failed publish is logged (SQL0104), not retried:
// the condition itself was logged by the actor that noticed it.
func (a *Actor) Step(ctx context.Context, e alert.Event) {
	if e.Kind == alert.BindingWaiting {
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
		case e := <-a.q.C():
			a.Step(ctx, e)
		}
	}
}
