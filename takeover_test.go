package sqlstreams

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An incarnation that lapses cannot always record what it settled: its
// salvage is bounded (a quarter of the lease), and the database may still
// be unable to take the write. What it still holds then goes to the
// session's next incarnation, which records the settled messages and
// releases the rest, instead of every message of the range running again
// when another instance reclaims it.
func TestTheNextIncarnationRecordsWhatALapsedOneCouldNot(t *testing.T) {
	obs := &successObserver{ok: make(chan struct{}, 64)}
	e, s, c := setup(t, &ClientConfig{Observer: obs}, "g", 0)
	e.produceN(s, "m", 10)
	ctx := context.Background()
	runs := newHeldM0()
	h := runs.handle
	b := consume(t, c, h, &ConsumeOptions{BatchLimit: 10, QueueSize: 20, MessageConcurrency: 10, InstanceTTL: 2 * time.Second,
		ClaimPollRate: time.Hour}) // no flush tick: nothing is recorded unless the lapse's salvage or the next incarnation does
	id := within(t, b.id, "the first incarnation")
	for range 9 {
		within(t, obs.ok, "m-1 … m-9 settled in the claimer")
	}
	// The range's row is locked, so the salvage cannot record anything
	// within its bound; then the incarnation lapses.
	lock, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx)
	_, err = lock.Exec(ctx, fmt.Sprintf("SELECT id FROM %s.stream_%d_range FOR UPDATE", e.client.Schema(), c.group.StreamID))
	require.NoError(t, err)
	lapsed := e.logs.Next("instance lapsed")
	_, err = e.pool.Exec(ctx, fmt.Sprintf("UPDATE %s.worker_instance SET expires_at = '-infinity' WHERE id = $1", e.client.Schema()), id)
	require.NoError(t, err)
	within(t, lapsed, "the lapse")
	// The second incarnation starts once the first one's tree has stopped,
	// its salvage given up.
	within(t, b.id, "the second incarnation")
	require.NoError(t, lock.Rollback(ctx))
	within(t, obs.ok, "m-0, released by the second incarnation and run again")
	require.NoError(t, b.stop(t))
	requireEachOnce(t, &runs.mu, runs.succeeded, 10)
	require.Empty(t, e.leases(c))
	require.Zero(t, c.leftovers.Len())
}
