package claimer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
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
	st := newStepper(t, groupconfig.Declared{}, func(o *order, _ int) error {
		if strings.HasPrefix(o.OrderID, "f") {
			return errors.New("fails once on the range path")
		}
		return nil
	})
	ctx := context.Background()

	// Two failing messages become exception rows.
	st.s.Produce(actortest.Orders("f", 2)...)
	require.Equal(t, 2, st.claimRange())
	st.mock.Add(time.Hour) // both are due
	// Instance A leases one of them, and a range of three new messages;
	// then it is cut off and its leases expire.
	ac := st.common
	ac.InstanceID = store.NewID()
	a := claimer.New(claimer.Config{Common: ac, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	axc := withID(ac, store.NewID())
	axc.Concurrency = 1
	xjobs, err := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: axc}).Claim(ctx)
	require.NoError(t, err)
	require.Len(t, xjobs, 1, "A leases one exception row")
	st.s.Produce(actortest.Orders("m", 3)...)
	jobs, err := a.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 3, "A leases a range")
	_, err = st.e.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = '-infinity';
UPDATE %s SET expires_at = '-infinity' WHERE status = 'running'`, st.s.Table("range"), st.s.Table("exception")))
	require.NoError(t, err)

	// Instance B's session has just come back from the same outage.
	health := outage.NewHealth(st.mock, time.Minute)
	bc := withID(st.common, store.NewID())
	bc.Health = health
	b := claimer.New(claimer.Config{Common: bc, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	bx := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: withID(bc, store.NewID())})
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

// A busy claimer's sweep (its last claim found positions, so it has no gate
// probe) looks for a lapsed lease with one small statement, and reclaims
// only when the look finds one: the reclaim is as costly to plan as the
// claim, and over 1,000 streams most calls plan their statement afresh
// (decision 0042).
func TestABusyClaimersSweepLooksBeforeItReclaims(t *testing.T) {
	ctx := context.Background()
	pool, counter := actortest.CountingPool(t, "", 0)
	e := actortest.New(t, &actortest.Options{Clock: clocks.Real(), Pool: pool})
	s := e.Stream("orders", settings.Stream{})
	g := s.Group("g", groupconfig.Declared{})
	s.Produce(actortest.Orders("m", 30)...)
	handler := func(context.Context, *claimer.Delivery) error { return nil }
	cfgA := common(e, g, clocks.Real(), handler)
	a := claimer.New(claimer.Config{Common: cfgA, BatchLimit: 10, QueueSize: 100, StallAfter: time.Hour})

	for i := range 2 {
		jobs, err := a.Claim(ctx) // each Claim sweeps (no TakeoverGrace for the step functions)
		require.NoError(t, err)
		require.Len(t, jobs, 10, "claim %d", i+1)
	}
	got := counter.Snapshot()
	require.Equal(t, 2, got["store.ClaimRange"])
	require.Equal(t, 2, got["store.LeasesExpired"], "each sweep looked for a lapsed lease")
	require.Zero(t, got["store.ReclaimRange"], "and, finding none, reclaimed nothing")

	// A's leases lapse: B's sweep finds one and takes it over.
	require.NoError(t, storetest.ExpireInstanceLeases(ctx, e.Store, cfgA.InstanceID, g.StreamID()))
	cfgB := common(e, g, clocks.Real(), handler)
	b := claimer.New(claimer.Config{Common: cfgB, BatchLimit: 10, QueueSize: 100, StallAfter: time.Hour})
	jobs, err := b.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 10, "a lapsed range of A's")
	require.EqualValues(t, 1, cfgB.Stats.Reclaimed.Load())
	got = counter.Snapshot()
	require.Equal(t, 3, got["store.LeasesExpired"])
	require.Equal(t, 1, got["store.ReclaimRange"])
	require.Equal(t, 2, got["store.ClaimRange"], "the reclaim's range came first")
}
