package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/stretchr/testify/require"
)

// keyTracker records handler start and stop per key and notes any overlap.
type keyTracker struct {
	mu       sync.Mutex
	inFlight map[string]int
	overlaps int
	order    map[string][]int
	handled  map[string]bool
	want     int
	done     chan struct{}
}

func newKeyTracker(want int) *keyTracker {
	return &keyTracker{inFlight: map[string]int{}, order: map[string][]int{}, handled: map[string]bool{}, want: want, done: make(chan struct{})}
}

func (k *keyTracker) start(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inFlight[key]++
	if k.inFlight[key] > 1 {
		k.overlaps++
	}
}

func (k *keyTracker) stop(key string, o *order, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inFlight[key]--
	if ok && !k.handled[o.OrderID] {
		k.handled[o.OrderID] = true
		k.order[key] = append(k.order[key], o.Amount)
		if len(k.handled) == k.want {
			close(k.done)
		}
	}
}

// work yields many times so that overlapping handlers would interleave.
func work() {
	for range 200 {
		runtime.Gosched()
	}
}

func keyedBatch(n, keys int) []BatchItem[order] {
	items := make([]BatchItem[order], n)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("m-%d", i), Amount: i}, Key: fmt.Sprintf("k%d", i%keys)}
	}
	return items
}

func TestExclusiveKeysNeverOverlapAcrossInstances(t *testing.T) {
	_, s, c := setup(t, nil, "g", 0)
	const n, keys = 300, 5
	_, err := s.ProduceBatch(context.Background(), keyedBatch(n, keys), &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.NoError(t, err)
	kt := newKeyTracker(n)
	bad := actortest.NewFailures(t)
	// Each instance's first handler holds its keys until the other has
	// made a claim, so the other's claim meets busy keys whatever the
	// timing: the contention the test is about always happens.
	claimed := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var claims [2]atomic.Int32
	var first [2]sync.Once
	opts := func(me int) *ConsumeOptions {
		return &ConsumeOptions{BatchLimit: 20, QueueSize: 40, MessageConcurrency: 8, ClaimPollRate: 5 * time.Millisecond,
			test: &hooks.Hooks{Step: func(site hooks.Site) error {
				// Room for two batches: the second claim starts as soon as
				// the first is done, whatever its handlers do.
				if site == hooks.ClaimerClaim && claims[me].Add(1) == 2 {
					close(claimed[me])
				}
				return nil
			}}}
	}
	h := func(me int) Handler[order] {
		return func(ctx context.Context, o *order) error {
			meta, _ := MetaFromContext(ctx)
			if meta.Concurrency != Exclusive {
				bad.Add("%s ran as %s, want exclusive", o.OrderID, meta.Concurrency)
			}
			kt.start(meta.Key)
			var err error
			first[me].Do(func() {
				select {
				case <-claimed[1-me]:
				case <-ctx.Done():
					err = ctx.Err()
				}
			})
			work()
			kt.stop(meta.Key, o, err == nil)
			return err
		}
	}
	consume(t, c, h(0), opts(0))
	consume(t, c, h(1), opts(1))
	within(t, kt.done, "every keyed message")
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Zero(t, kt.overlaps, "two messages of one exclusive key ran at once")
	require.Positive(t, c.Stats().Deferred, "an instance found keys busy and parked messages")
}

func TestOrderedKeysRunInPositionOrderEvenWhenAnEarlierMessageRetries(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	const n, keys = 60, 3
	_, err := s.ProduceBatch(context.Background(), keyedBatch(n, keys), &BatchOptions{Message: &MessageOptions{
		Concurrency: Ordered, Retry: &RetryPolicy{BaseDelay: time.Millisecond}}})
	require.NoError(t, err)
	reg, err := s.Consumer("g").Register(context.Background(), &ConsumerConfig{ExceptionInitialBackoff: 5 * time.Millisecond})
	require.NoError(t, err)
	kt := newKeyTracker(n)
	var mu sync.Mutex
	failedOnce := map[string]bool{}
	h := func(ctx context.Context, o *order) error {
		meta, _ := MetaFromContext(ctx)
		kt.start(meta.Key)
		work()
		mu.Lock()
		fail := o.Amount%7 == 1 && !failedOnce[o.OrderID]
		failedOnce[o.OrderID] = true
		mu.Unlock()
		kt.stop(meta.Key, o, !fail)
		if fail {
			return errors.New("transient")
		}
		return nil
	}
	opts := &ConsumeOptions{BatchLimit: 10, MessageConcurrency: 4, ClaimPollRate: 5 * time.Millisecond}
	consume(t, reg, h, opts)
	consume(t, reg, h, opts)
	within(t, kt.done, "every ordered message")
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Zero(t, kt.overlaps)
	for key, got := range kt.order {
		for i := 1; i < len(got); i++ {
			require.Less(t, got[i-1], got[i], "key %s ran out of order: %v", key, got)
		}
	}
	require.Positive(t, reg.Stats().Failed)
	_, _ = e, c
}
