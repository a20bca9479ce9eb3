package alerts

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/stretchr/testify/require"
)

// A binding wait is published once, however many attempts it takes; every
// stall is published; a publish that fails is logged, not retried.
func TestTheActorPublishesAWaitOnceAndEveryStall(t *testing.T) {
	var kinds []alert.Kind
	fail := false
	a := New(alert.NewQueue(nil), func(_ context.Context, e alert.Event) error {
		kinds = append(kinds, e.Kind)
		if fail {
			return context.DeadlineExceeded
		}
		return nil
	}, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	for range 3 {
		a.Step(ctx, alert.Event{Kind: alert.BindingWaiting, Since: time.Unix(1, 0)})
	}
	a.Step(ctx, alert.Event{Kind: alert.DeliveryStalled})
	fail = true
	a.Step(ctx, alert.Event{Kind: alert.DeliveryStalled})
	require.Equal(t, []alert.Kind{alert.BindingWaiting, alert.DeliveryStalled, alert.DeliveryStalled}, kinds)
}

func TestServeStopsWithItsContext(t *testing.T) {
	q := alert.NewQueue(nil)
	published := make(chan alert.Event, 1)
	a := New(q, func(_ context.Context, e alert.Event) error { published <- e; return nil }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	q.Send(alert.Event{Kind: alert.DeliveryStalled})
	require.Equal(t, alert.DeliveryStalled, (<-published).Kind)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}
