package sqlstreams

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// While the client's listener is down (NoListener: no hub), an idle
// instance that polls faster than MinSweep reads new positions at
// every poll, but looks for expired leases, probes the gate and claims
// exception rows at most every MinSweep: those statements are a poll's
// most expensive (the exception claim visits every key with unresolved
// rows), and under a 20 ms poll they were most of a loaded server's work.
// Idle, the sweep is its probe alone, and the exception claimer asks
// whether anything is due before it claims: the claims cost most of an
// idle session's server CPU in planning.
func TestAFastPollSweepsAtMostEveryMinSweep(t *testing.T) {
	ctx := context.Background()
	const poll = 10 * time.Millisecond
	// Two seconds of polls: the first TakeoverGrace after the session
	// begins (1 s at the default InstanceTTL) looks for no expired lease.
	const polls = 200
	client, counter := countingClient(t, "store.ClaimRange", polls)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, func(context.Context, *order) error { return nil }, &ConsumeOptions{ClaimPollRate: poll,
			test: &hooks.Hooks{NoListener: true}})
	}()
	within(t, counter.Reached(), "200 polls of an idle instance")
	cancel()
	require.NoError(t, within(t, done, "Consume to return"))

	got := counter.Snapshot()
	claims := got["store.ClaimRange"]
	t.Logf("statements of an idle instance polling every %s: %v", poll, got)
	// MinSweep/poll = 10 polls per sweep; a fifth leaves room for the
	// sweep at the start and for ticks a loaded runner coalesces.
	bound := claims / 5
	require.GreaterOrEqual(t, claims, polls)
	// An idle sweep looks for expired leases with its probe, and reclaims
	// only when the probe finds one.
	require.Positive(t, got["store.GateProbe"], "expired leases are still looked for")
	// (That the sweep reclaims nothing for TakeoverGrace after the session
	// begins: TestASessionThatBeginsTakesNoExpiredLeaseOverForTakeoverGrace.)
	require.LessOrEqual(t, got["store.ReclaimRange"], bound, "the look for expired leases runs at most every MinSweep (%s)", claimer.MinSweep)
	require.LessOrEqual(t, got["store.GateProbe"], bound, "the gate probe runs at most every MinSweep")
	require.Positive(t, got["store.ClaimExceptions"]+got["store.ExceptionsDue"], "exception rows are still looked for")
	require.LessOrEqual(t, got["store.ClaimExceptions"]+got["store.ExceptionsDue"], bound, "an exception claimer with nothing due looks at most every MinSweep")
	require.LessOrEqual(t, got["store.ClaimExceptions"], 1, "and, after a claim that found nothing, asks whether anything is due before it claims")
}

// A busy claimer's sweep (its last claim found positions, so it has no gate
// probe) looks for a lapsed lease with one small statement, and reclaims
// only when the look finds one: the reclaim is as costly to plan as the
// claim, and over 1,000 streams most calls plan their statement afresh
// (decision 0042).
func TestABusyClaimersSweepLooksBeforeItReclaims(t *testing.T) {
	ctx := context.Background()
	client, counter := countingClient(t, "", 0)
	e := &env{t: t, client: client, logs: actortest.NewLogs(t)}
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	e.produceN(s, "m", 30)
	handler := func(context.Context, *claimer.Delivery) error { return nil }
	cfgA := e.common(c, clock.New(), handler)
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
	require.NoError(t, storetest.ExpireInstanceLeases(ctx, client.store, cfgA.InstanceID, c.group.StreamID))
	cfgB := e.common(c, clock.New(), handler)
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
