package claimer_test

import (
	"context"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/incarnation"
	"github.com/c1702965/sqlstreams/internal/settings"
)

// within fails the test if ch is not closed or sent on before a generous
// bound. It is a safety net against hangs, not a timing assertion.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// A wake that reaches a quiet claimer while its incarnation is not provably
// live (its last renewal is older than the TTL allows, as when a loaded
// machine runs the heartbeat late) cannot claim. The claimer must not stay
// quiet: it polls until a claim runs, so the produce the wake announced is
// delivered once the incarnation is valid again, without another wake.
// Quiet, it skipped its poll ticks and left the message for the backstop
// sweep (ten minutes at this Lease).
func TestAWakeThatFindsTheIncarnationNotValidIsNotLost(t *testing.T) {
	ctx := context.Background()
	e := actortest.New(t, &actortest.Options{Clock: clocks.Real()})
	s := e.Stream("orders", settings.Stream{})
	g := s.Group("g", groupconfig.Declared{})

	lives := clocks.NewMock() // the incarnation's validity alone runs on it
	live := incarnation.NewLiveness(lives, time.Minute)
	live.Start(lives.Now())
	handled := make(chan int64, 4)
	cfg := common(e, g, clocks.Real(), func(_ context.Context, d *claimer.Delivery) error { handled <- d.Msg.ID; return nil })
	cfg.PollRate, cfg.Liveness = 10*time.Millisecond, live
	cfg.Listening = func() bool { return true }
	cfg.Alarm = make(chan struct{}) // alarms come: the reconcile ticks' sweeps are skipped too
	cfg.Hooks = &hooks.Hooks{}
	cfg.Hooks.QuietTick.Init()
	cfg.Hooks.NotValid.Init()
	wake := make(chan struct{}) // unbuffered: a send returns once the claimer took it
	a := claimer.New(claimer.Config{Common: cfg, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour, Wake: wake})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- a.Serve(sctx) }()
	t.Cleanup(func() { stop(); within(t, served, "the claimer to stop") })

	within(t, cfg.Hooks.QuietTick.C(), "a quiet poll tick: the begin's probe found nothing")
	lives.Add(time.Minute) // no renewal for a TTL: not valid
	s.Produce(actortest.Orders("m", 1)...)
	wake <- struct{}{}
	within(t, cfg.Hooks.NotValid.C(), "the wake's claim, refused: the incarnation is not valid")
	live.Start(lives.Now()) // renewed

	within(t, handled, "the produced message, claimed at a poll tick once the incarnation is valid")
}
