package alert

import (
	"sync/atomic"
	"testing"

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
