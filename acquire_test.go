package sqlstreams

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/stretchr/testify/require"
)

// countedGroup registers the stream "orders" and its group "g"
// (StartBeginning) on a counting client.
func countedGroup(t *testing.T) (*Client, *actortest.Counter, *StreamHandle[order], *Consumer[order]) {
	t.Helper()
	ctx := context.Background()
	client, counter := countingClient(t, "", 0)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Start: StartBeginning})
	require.NoError(t, err)
	return client, counter, s, c
}

// keyedThenParallel is countedGroup with one range's worth (BatchLimit 2)
// of exclusive messages produced, keys "a" and "b", then n parallel ones.
func keyedThenParallel(t *testing.T, n int) (*actortest.Counter, *Consumer[order]) {
	t.Helper()
	ctx := context.Background()
	_, counter, s, c := countedGroup(t)
	items := []BatchItem[order]{
		{Msg: order{OrderID: "k-a"}, Key: "a", Message: &MessageOptions{Concurrency: Exclusive}},
		{Msg: order{OrderID: "k-b"}, Key: "b", Message: &MessageOptions{Concurrency: Exclusive}},
	}
	for i := range n {
		items = append(items, BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("p-%d", i)}})
	}
	_, err := s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)
	return counter, c
}

// A range's key acquisition runs beside the claimer's loop (decision 0050):
// while it is out, the later ranges are claimed, handled and committed, and
// the range's keyed messages start only once it is back.
func TestAKeyAcquisitionDoesNotHoldUpTheRangesAfterIt(t *testing.T) {
	counter, c := keyedThenParallel(t, 4)

	waiting, release := counter.Hold("store.AcquireKeys")
	t.Cleanup(release)
	handled := make(chan string, 6)
	consume(t, c, func(_ context.Context, o *order) error {
		handled <- o.OrderID
		return nil
	}, &ConsumeOptions{BatchLimit: 2, QueueSize: 6, ClaimPollRate: 5 * time.Millisecond})

	within(t, waiting, "the keyed range's key acquisition")
	got := map[string]bool{}
	for range 4 {
		got[within(t, handled, "the parallel messages, in the ranges claimed after the keyed one")] = true
	}
	require.Equal(t, map[string]bool{"p-0": true, "p-1": true, "p-2": true, "p-3": true}, got,
		"only the later ranges' messages ran while the keys were being acquired")
	within(t, counter.When("store.CommitRange", 2), "the later ranges' commits, while the keys were being acquired")
	select {
	case id := <-handled:
		t.Fatalf("%s ran before its key was leased", id)
	default:
	}

	release()
	got = map[string]bool{}
	for range 2 {
		got[within(t, handled, "the keyed messages, once their keys are leased")] = true
	}
	require.Equal(t, map[string]bool{"k-a": true, "k-b": true}, got)
}

// A key acquisition that fails parks its keyed messages as exception rows
// (no retry spent) instead of running them unguarded: they are delivered
// once, after KeyBusyDelay, and the ranges after them are not held up.
func TestAFailedKeyAcquisitionParksItsMessagesAndLosesNone(t *testing.T) {
	counter, c := keyedThenParallel(t, 2)

	counter.FailNext("store.AcquireKeys")
	col := newCollector(4)
	consume(t, c, func(_ context.Context, o *order) error {
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 2, QueueSize: 4, ClaimPollRate: 5 * time.Millisecond})
	within(t, col.done, "every message, the keyed ones parked and retried")
	require.Zero(t, col.duplicates(), "each message delivered once")
	require.Positive(t, counter.Snapshot()["store.ClaimExceptions"], "the keyed messages came back as exception rows")
}

// A range claimed while the first range's acquisition is asking for the key
// gate (decision 0051) needs no statement of its own once the gate is
// granted: its exclusive keys are held under the gate when its turn comes.
func TestARangeClaimedWhileTheKeyGateIsAskedForRunsUnderIt(t *testing.T) {
	ctx := context.Background()
	_, counter, s, c := countedGroup(t)
	var items []BatchItem[order]
	for _, k := range []string{"a", "b", "c", "d"} {
		items = append(items, BatchItem[order]{Msg: order{OrderID: k}, Key: k})
	}
	_, err := s.ProduceBatch(ctx, items, &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.NoError(t, err)

	waiting, release := counter.Hold("store.AcquireKeys")
	t.Cleanup(release)
	col := newCollector(4)
	consume(t, c, func(_ context.Context, o *order) error {
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 2, QueueSize: 4, ClaimPollRate: 5 * time.Millisecond})
	within(t, waiting, "the first range's acquisition, asking for the gate")
	within(t, counter.When("store.ClaimRange: the range's messages", 2), "the second range, claimed meanwhile")
	release()
	within(t, col.done, "every message")
	require.Zero(t, col.duplicates())
	require.Positive(t, c.Stats().KeyGates, "the gate granted")
	require.Equal(t, 1, counter.BatchesOf("store.AcquireKeys"), "the second range's keys taken under the gate, with no statement")
}
