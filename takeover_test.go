package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/stretchr/testify/require"
)

// For TakeoverGrace after its session came back from an outage, a claimer
// takes no expired lease over: not a range, not a running exception row.
// The instances cut off by the same outage are coming back too, and one
// whose lease expired meanwhile records what its handlers settled first (a
// lapsed incarnation's salvage, the adoption of a stopped session's
// leftovers). New positions and due rows are claimed as before. Before, a
// takeover right after a PostgreSQL restart ran those settled messages
// again: most of the chaos run's repeats.
func TestNoLeaseIsTakenOverRightAfterAnOutage(t *testing.T) {
	st, s := newStepper(t, nil, func(o *order, _ int) error {
		if strings.HasPrefix(o.OrderID, "f") {
			return errors.New("fails once on the range path")
		}
		return nil
	})
	ctx := context.Background()
	schema, streamID := st.e.client.Schema(), st.c.group.StreamID

	// Two failing messages become exception rows.
	st.e.produceN(s, "f", 2)
	require.Equal(t, 2, st.claimRange())
	st.mock.Add(time.Hour) // both are due
	// Instance A leases one of them, and a range of three new messages;
	// then it is cut off and its leases expire.
	ac := st.common
	ac.InstanceID = engine.NewID()
	a := claimer.New(claimer.Config{Common: ac, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	axc := withID(ac, engine.NewID())
	axc.Concurrency = 1
	xjobs, err := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: axc}).Claim(ctx)
	require.NoError(t, err)
	require.Len(t, xjobs, 1, "A leases one exception row")
	st.e.produceN(s, "m", 3)
	jobs, err := a.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 3, "A leases a range")
	_, err = st.e.pool.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s.stream_%[2]d_range SET expires_at = '-infinity';
UPDATE %[1]s.stream_%[2]d_exception SET expires_at = '-infinity' WHERE status = 'running'`, schema, streamID))
	require.NoError(t, err)

	// Instance B's session has just come back from the same outage.
	health := outage.NewHealth(st.mock, time.Minute)
	bc := withID(st.common, engine.NewID())
	bc.Health = health
	b := claimer.New(claimer.Config{Common: bc, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	bx := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: withID(bc, engine.NewID())})
	health.Forget() // a new incarnation replaced a lapsed one: a recovery, now
	grace := claimer.TakeoverGrace(bc.Lease)
	require.Equal(t, time.Second, grace, "half the lease, at most MaxTakeoverGrace")

	jobs, err = b.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, jobs, "A's expired range is not taken over at once")
	xjobs, err = bx.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, xjobs, 1, "a due row is claimed during the grace")
	require.Equal(t, 1, xjobs[0].Delivery.Attempt-1, "the pending row, not A's running one (which would count A's lapse)")

	st.mock.Add(grace - time.Millisecond)
	jobs, err = b.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, jobs, "nor a moment before the grace ends")
	more, err := bx.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, more, "nor A's running exception row")

	st.mock.Add(time.Millisecond)
	jobs, err = b.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 3, "after the grace, the expired range is reclaimed")
	require.EqualValues(t, 1, bc.Stats.Reclaimed.Load())
	more, err = bx.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, more, 1, "and the expired exception row taken over")
	require.Equal(t, 2, more[0].Delivery.Attempt-1, "A's lapse counts as a failed attempt, as before")
}

// withID returns c with another instance id.
func withID(c claimer.Common, id string) claimer.Common {
	c.InstanceID = id
	return c
}

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
