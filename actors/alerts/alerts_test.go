package alerts

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A full queue drops the event and counts it; Send never waits, so the
// actor that noticed the condition is never held up by the alert.
func TestAFullQueueDropsAndCountsNeverBlocks(t *testing.T) {
	var dropped atomic.Int64
	q := NewQueue(&dropped)
	for range QueueSize + 5 {
		q.Send(Event{Kind: DeliveryStalled}) // returns at once, full or not
	}
	require.EqualValues(t, 5, dropped.Load())
	require.Len(t, q.C(), QueueSize)
	var none *Queue
	none.Send(Event{Kind: DeliveryStalled}) // a nil queue drops everything
}

// A binding wait is published once, however many attempts it takes; every
// stall is published; a publish that fails is logged, not retried.
func TestTheActorPublishesAWaitOnceAndEveryStall(t *testing.T) {
	var kinds []Kind
	fail := false
	a := New(NewQueue(nil), func(_ context.Context, e Event) error {
		kinds = append(kinds, e.Kind)
		if fail {
			return context.DeadlineExceeded
		}
		return nil
	}, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	for range 3 {
		a.Step(ctx, Event{Kind: BindingWaiting, Since: time.Unix(1, 0)})
	}
	a.Step(ctx, Event{Kind: DeliveryStalled})
	fail = true
	a.Step(ctx, Event{Kind: DeliveryStalled})
	require.Equal(t, []Kind{BindingWaiting, DeliveryStalled, DeliveryStalled}, kinds)
}

func TestServeStopsWithItsContext(t *testing.T) {
	q := NewQueue(nil)
	published := make(chan Event, 1)
	a := New(q, func(_ context.Context, e Event) error { published <- e; return nil }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	q.Send(Event{Kind: DeliveryStalled})
	require.Equal(t, DeliveryStalled, (<-published).Kind)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}
