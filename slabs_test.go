package sqlstreams

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A range's payload slabs go back to the client's pool once it commits,
// and later claims copy into them; every message still reads as produced,
// over several rounds of ranges that reuse one another's slabs.
func TestConsumersRecycleSlabsAndReadEveryPayload(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	const rounds, per = 4, 30
	col := newCollector(rounds * per)
	var mu sync.Mutex
	bad := []string{}
	sess := consume(t, c, func(_ context.Context, o *order) error {
		if want := fmt.Sprintf("r-%d", o.Amount); !strings.HasPrefix(o.OrderID, want+"-") {
			mu.Lock()
			bad = append(bad, o.OrderID)
			mu.Unlock()
		}
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 10, MessageConcurrency: 2, ClaimPollRate: 5 * time.Millisecond})
	for r := range rounds {
		items := make([]BatchItem[order], per)
		for i := range items {
			// Lengths differ by round: a slab reused for another round's
			// rows would show the old bytes past the new ones.
			items[i].Msg = order{OrderID: fmt.Sprintf("r-%d-%d-%s", r, i, strings.Repeat("z", 100*(rounds-r))), Amount: r}
		}
		_, err := s.ProduceBatch(context.Background(), items, nil)
		require.NoError(t, err)
	}
	within(t, col.done, "every message")
	require.NoError(t, sess.stop(t))
	require.Empty(t, bad, "messages decoded from another message's bytes")
	require.Zero(t, col.duplicates())
	require.Positive(t, e.client.slabs.Held(), "committed ranges gave their slabs back")
}

// A handler abandoned past its Timeout and TimeoutGrace may still read its
// message (a decoder in the middle of a large payload, say), so its range's
// slab is never handed to another claim.
func TestAnAbandonedHandlersSlabIsNotRecycled(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	hung := make(chan struct{})
	col := newCollector(3)
	sess := consume(t, c, func(ctx context.Context, o *order) error {
		if strings.HasPrefix(o.OrderID, "hang") {
			close(hung)
			<-release // ignores ctx
			return nil
		}
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 1, MessageConcurrency: 1, ClaimPollRate: 5 * time.Millisecond,
		TimeoutGrace: 20 * time.Millisecond, ShutdownTimeout: 50 * time.Millisecond})
	const large = 100 << 10 // its slab's class is larger than any small message's
	_, err := s.Produce(context.Background(), order{OrderID: "hang" + strings.Repeat("h", large)}, &ProduceOptions{Message: &MessageOptions{
		Timeout: 20 * time.Millisecond, Retry: &RetryPolicy{MaxRetries: NoRetries}}})
	require.NoError(t, err)
	within(t, hung, "the hanging handler")
	e.produceN(s, "m", 3) // run only once the hung one was abandoned and its range committed
	within(t, col.done, "messages after the hung one")
	require.NoError(t, sess.stop(t))
	require.EqualValues(t, 1, c.Stats().Abandoned)
	require.Positive(t, e.client.slabs.Held(), "the small ranges' slabs are back")
	require.Less(t, e.client.slabs.Largest(), large, "the abandoned range's slab is not in the pool")
}

// userDecoder is a Decoder of the user's own: it might keep slices of its
// input, so sessions decoding with it never recycle a slab.
type userDecoder struct{}

func (userDecoder) Unmarshal(data []byte, v any) error { return StandardJSON{}.Unmarshal(data, v) }

func TestAUsersDecoderNeverGetsARecycledSlab(t *testing.T) {
	e, _, c := setup(t, &ClientConfig{Decoder: userDecoder{}}, "g", 20)
	col := newCollector(20)
	sess := consume(t, c, func(_ context.Context, o *order) error {
		col.add(o.OrderID)
		return nil
	}, fast())
	within(t, col.done, "every message")
	require.NoError(t, sess.stop(t))
	require.Nil(t, e.client.slabsFor())
	require.Zero(t, e.client.slabs.Held(), "no range gave its slabs to the pool")
}

// ClientConfig.PayloadPool: 0 is DefaultPayloadPool, NoPayloadPool keeps
// none (its consumers claim into fresh memory), and anything below it is
// an error naming the field.
func TestPayloadPoolConfig(t *testing.T) {
	require.Equal(t, DefaultPayloadPool, (&ClientConfig{}).withDefaults().PayloadPool)
	e := newEnv(t, &ClientConfig{PayloadPool: NoPayloadPool})
	require.Nil(t, e.client.slabsFor())
	_, err := NewClient(context.Background(), e.pool, &ClientConfig{Schema: "payload_pool_bad", PayloadPool: -2})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "ClientConfig.PayloadPool -2")
}
