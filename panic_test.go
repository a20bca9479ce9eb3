package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/stretchr/testify/require"
)

// A claimer that panics at any of its steps is restarted and leaves nothing
// stuck: for each step in turn (claim, key acquisition, outcome, flush,
// reconcile, and the exception claimer's claim, outcome and flush), a panic
// is injected the first time the step runs after a message was handled,
// more messages are produced, and the group drains within InstanceTTL plus
// one poll of the panic. Messages are unkeyed, exclusive and ordered, and
// some fail once, so that every step has work to hold when it panics.
func TestAClaimerPanicAtAnyStepLeavesNothingStuck(t *testing.T) {
	const (
		n    = 120
		more = 60
		ttl  = 2 * time.Second
		poll = 50 * time.Millisecond
	)
	for _, site := range hooks.ClaimerSites {
		t.Run(string(site), func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, nil)
			s := e.stream("orders")
			c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond})
			require.NoError(t, err)
			wave := func(from, count int) {
				items := make([]BatchItem[order], count)
				for j := range items {
					i := from + j
					items[j] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("m-%d", i), Amount: i}}
					switch i % 3 {
					case 1:
						items[j].Key, items[j].Message = fmt.Sprintf("x%d", i%5), &MessageOptions{Concurrency: Exclusive}
					case 2:
						items[j].Key, items[j].Message = fmt.Sprintf("o%d", i%4), &MessageOptions{Concurrency: Ordered}
					}
				}
				_, err := s.ProduceBatch(ctx, items, nil)
				require.NoError(t, err)
			}
			wave(0, n)

			var handled atomic.Int64
			var fired atomic.Bool
			panicked := make(chan time.Time, 1)
			var uninjected atomic.Int64
			h := &hooks.Hooks{Step: func(at hooks.Site) error {
				if at == site && handled.Load() > 0 && fired.CompareAndSwap(false, true) {
					panicked <- time.Now()
					hooks.Inject(at)
				}
				return nil
			}, Panicked: func(_ string, injected bool) {
				if !injected {
					uninjected.Add(1)
				}
			}}
			col := newCollector(n + more)
			var failed sync.Map
			consume(t, c, func(_ context.Context, o *order) error {
				if _, again := failed.LoadOrStore(o.OrderID, true); o.Amount%10 == 0 && !again {
					return errors.New("fails once")
				}
				col.add(o.OrderID)
				handled.Add(1)
				return nil
			}, &ConsumeOptions{InstanceTTL: ttl, ClaimPollRate: poll, BatchLimit: 10, QueueSize: 20, DisableManager: true, test: h})

			at := within(t, panicked, "the panic at "+string(site))
			wave(n, more) // and the restarted claimer takes new work too
			within(t, col.done, "every message handled")
			drained := time.Since(at)
			t.Logf("%s: drained %s after the panic", site, drained.Round(time.Millisecond))
			require.LessOrEqual(t, drained, ttl+poll, "the group drains within InstanceTTL plus one poll of a panic at %s", site)
			require.Zero(t, uninjected.Load())
		})
	}
}
