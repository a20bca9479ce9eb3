package sqlstreams

import (
	"context"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/hooks"
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
