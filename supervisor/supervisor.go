// Package supervisor builds the suture tree a Consume session runs under and
// keeps suture's sharp edges away from the actors.
//
// Two edges matter. suture removes for good a service that returns
// context.Canceled or context.DeadlineExceeded, so a query that timed out on
// its own would silently kill an actor: Guard turns such errors into ordinary
// ones unless the actor's own context is done. And suture reports a panic
// without the stack where it was raised: Guard recovers it itself, logs it
// with that stack (SQL0401, the stack bounded by MaxStack) and has suture
// restart the actor; other restarts reach slog through suture's event hook,
// so a restarting actor is visible without the actors logging their own
// failures twice.
//
// It is part of the engine's inside, not an API for users.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/thejerf/suture/v4"
)

// Service is an actor's Serve loop.
type Service interface {
	Serve(ctx context.Context) error
}

// Tree is a supervisor and the actors under it.
type Tree struct {
	sup    *suture.Supervisor
	logger *slog.Logger
	hooks  *hooks.Hooks
}

// New returns a supervisor whose events are logged on logger; h (nil in
// production) is told of every actor panic.
func New(name string, logger *slog.Logger, h *hooks.Hooks) *Tree {
	return &Tree{logger: logger, hooks: h, sup: suture.New(name, suture.Spec{
		EventHook: func(e suture.Event) {
			switch ev := e.(type) {
			case suture.EventServicePanic: // Guard recovers every actor's panic: this is suture's own
				codes.ActorPanicked.Log(context.Background(), logger, "actor panicked; restarting", "supervisor", ev.SupervisorName, "actor", ev.ServiceName,
					"panic", ev.PanicMsg, "restarting", ev.Restarting, "stack", bound(ev.Stacktrace))
			case suture.EventServiceTerminate:
				if _, ok := ev.Err.(errPanicked); ok {
					return // logged with its stack when it was recovered
				}
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
	})}
}

// Add puts an actor under the tree, guarded (Guard).
func (t *Tree) Add(name string, s Service) {
	t.sup.Add(guarded{name: name, s: s, logger: t.logger, hooks: t.hooks})
}

// ServeBackground runs the tree until ctx ends; the channel returns its
// end.
func (t *Tree) ServeBackground(ctx context.Context) <-chan error { return t.sup.ServeBackground(ctx) }

// Guard wraps an actor so that only its own cancelled context ends it for
// good; every other error (including a query's own timeout) restarts it,
// and so does a panic, which is logged with its stack (SQL0401) and told
// to the hooks.
func Guard(name string, s Service, logger *slog.Logger, h *hooks.Hooks) suture.Service {
	return guarded{name: name, s: s, logger: logger, hooks: h}
}

type guarded struct {
	name   string
	s      Service
	logger *slog.Logger
	hooks  *hooks.Hooks
}

func (g guarded) String() string { return g.name }

func (g guarded) Serve(ctx context.Context) (err error) {
	defer func() {
		if v := recover(); v != nil {
			p, ok := v.(*Panic)
			if !ok {
				p = &Panic{Value: v, Stack: debug.Stack()}
			}
			codes.ActorPanicked.Log(context.Background(), g.logger, "actor panicked; restarting", "actor", g.name,
				"panic", fmt.Sprint(p.Value), "stack", bound(string(p.Stack)))
			g.hooks.Recovered(g.name, p.Value)
			err = errPanicked{actor: g.name, value: p.Value}
		}
	}()
	err = g.s.Serve(ctx)
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

// MaxStack bounds the stack a panic's log line carries, in bytes.
const MaxStack = 8 << 10

// bound cuts a stack to MaxStack, saying so.
func bound(stack string) string {
	if len(stack) <= MaxStack {
		return stack
	}
	return stack[:MaxStack] + "\n... (cut at 8 KiB)"
}

// Panic is a recovered panic with the stack where it was raised. An actor
// that recovers a panic to salvage what it can re-panics with Repanic, so
// that the stack logged is the panic's, not the re-panic's.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) String() string { return fmt.Sprint(p.Value) }

// Repanic panics again with v, a value the caller's deferred function has
// just recovered, keeping the stack of where it was first raised.
func Repanic(v any) {
	if p, ok := v.(*Panic); ok {
		panic(p)
	}
	panic(&Panic{Value: v, Stack: debug.Stack()})
}

// errPanicked is what Guard returns for an actor that panicked: suture
// restarts it; the panic was logged already.
type errPanicked struct {
	actor string
	value any
}

func (e errPanicked) Error() string { return fmt.Sprintf("%s panicked: %v", e.actor, e.value) }
