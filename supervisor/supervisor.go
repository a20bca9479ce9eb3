// Package supervisor builds the suture tree a Consume session runs under and
// keeps suture's sharp edges away from the actors.
//
// Two edges matter. suture removes for good a service that returns
// context.Canceled or context.DeadlineExceeded, so a query that timed out on
// its own would silently kill an actor: Guard turns such errors into ordinary
// ones unless the actor's own context is done. And suture reports restarts
// through an event hook, which we send to slog so a restarting actor is
// visible without the actors logging their own failures twice.
//
// It is part of the engine's inside, not an API for users.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"github.com/c1702965/sqlstreams/internal/codes"
	"log/slog"
	"time"

	"github.com/thejerf/suture/v4"
)

// Service is an actor's Serve loop.
type Service interface {
	Serve(ctx context.Context) error
}

// New returns a supervisor whose events are logged on logger.
func New(name string, logger *slog.Logger) *suture.Supervisor {
	return suture.New(name, suture.Spec{
		EventHook: func(e suture.Event) {
			switch ev := e.(type) {
			case suture.EventServicePanic:
				codes.ActorPanicked.Log(context.Background(), logger, "actor panicked; restarting", "supervisor", ev.SupervisorName, "actor", ev.ServiceName,
					"panic", ev.PanicMsg, "restarting", ev.Restarting)
			case suture.EventServiceTerminate:
				codes.ActorFailed.Log(context.Background(), logger, "actor failed; restarting", "supervisor", ev.SupervisorName, "actor", ev.ServiceName,
					"error", fmt.Sprint(ev.Err), "restarting", ev.Restarting)
			case suture.EventBackoff:
				codes.ActorsBackingOff.Log(context.Background(), logger, "actors failing too often; backing off", "supervisor", ev.SupervisorName)
			case suture.EventStopTimeout:
				codes.ActorStopTimeout.Log(context.Background(), logger, "actor did not stop in time", "supervisor", ev.SupervisorName, "actor", ev.ServiceName)
			}
		},
		FailureThreshold: 5,
		FailureDecay:     30,
		FailureBackoff:   time.Second,
		Timeout:          30 * time.Second,
	})
}

// Guard wraps an actor so that only its own cancelled context ends it for
// good; every other error (including a query's own timeout) restarts it.
func Guard(name string, s Service) suture.Service { return guarded{name: name, s: s} }

type guarded struct {
	name string
	s    Service
}

func (g guarded) String() string { return g.name }

func (g guarded) Serve(ctx context.Context) error {
	err := g.s.Serve(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, suture.ErrDoNotRestart) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %v", g.name, err) // deliberately unwrapped: suture must restart it
	}
	return err
}
