package sqlstreams

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgcluster"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFailoverChaos is the chaos run's failover fault, repeated: three
// Consume sessions of one group and a producer run on a primary with a
// synchronous standby while, every SQLSTREAMS_FAILOVER_EVERY (default 15 s)
// for SQLSTREAMS_FAILOVER_CHAOS (a duration; unset: skipped), the primary is
// killed (pg_ctl stop -m immediate), the standby promoted as an orchestrator
// would, and a new synchronous standby seeded from the new primary
// (pg_basebackup), so the next failover has somewhere to go. The clients
// reach the primary through an endpoint that follows it (a pool whose
// BeforeConnect names the current primary, as a virtual IP, a DNS name or a
// managed service's writer endpoint would), since every new standby has a
// port of its own. It holds when every produce that returned success is
// consumed (0 lost: synchronous replication), each failover's recovery
// (promotion to the first message produced after it consumed) is within
// InstanceTTL + 5 s, and the group's state on the last primary is whole;
// duplicates are reported. make failover runs it.
func TestFailoverChaos(t *testing.T) {
	raw := os.Getenv("SQLSTREAMS_FAILOVER_CHAOS")
	if raw == "" {
		t.Skip("SQLSTREAMS_FAILOVER_CHAOS is not set (make failover sets it)")
	}
	duration, err := time.ParseDuration(raw)
	require.NoError(t, err, "SQLSTREAMS_FAILOVER_CHAOS is a duration")
	every := 15 * time.Second
	if v := os.Getenv("SQLSTREAMS_FAILOVER_EVERY"); v != "" {
		every, err = time.ParseDuration(v)
		require.NoError(t, err, "SQLSTREAMS_FAILOVER_EVERY is a duration")
	}
	ctx := context.Background()
	primary, standby := replicatedPair(t, "failover chaos", pgcluster.StandbyOptions{Name: "node1", Synchronous: true})
	var current atomic.Pointer[pgcluster.Cluster] // the node the endpoint names
	current.Store(primary)
	cfg, err := pgxpool.ParseConfig(primary.URL("postgres"))
	require.NoError(t, err)
	cfg.MaxConns = 30
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.Port = uint16(current.Load().Port())
		cc.Fallbacks = nil
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	client, sink, s, c := failoverClient(t, pool, "failover")
	ledger := newFailoverLedger()
	opts := &ConsumeOptions{BatchLimit: 20, MessageConcurrency: 4, ClaimPollRate: 20 * time.Millisecond,
		InstanceTTL: failoverTTL, ShutdownTimeout: 500 * time.Millisecond}
	var stops []func() error
	for range 3 {
		stops = append(stops, ledger.consume(t, c, opts))
	}
	producer := ledger.produce(t, s)
	ledger.wait(t, time.Minute, "100 messages consumed before the first failover",
		func() bool { return len(ledger.handled) >= 100 },
		func() string {
			return fmt.Sprintf("%d acknowledged, %d handled", len(ledger.acked), len(ledger.handled))
		})

	var recoveries []time.Duration
	end := time.NewTimer(duration)
	defer end.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	stopped := []*pgcluster.Cluster{} // killed primaries, removed at the end
	t.Cleanup(func() {
		for _, n := range stopped {
			assert.NoError(t, n.Stop())
		}
	})
	for n := 2; ; n++ {
		select {
		case <-end.C:
		case <-tick.C:
			killed := time.Now()
			require.NoError(t, primary.Kill(ctx))
			promotedAt := time.Now()
			ledger.promoted(promotedAt)
			require.NoError(t, standby.Promote(ctx))
			current.Store(standby)
			stopped = append(stopped, primary)
			primary = standby
			ledger.wait(t, opts.InstanceTTL+time.Minute, fmt.Sprintf("failover %d: a message produced after the promotion to be consumed", n-1),
				func() bool { return !ledger.firstPostAt.IsZero() },
				func() string {
					return fmt.Sprintf("%d acknowledged after the promotion; %d produce errors (first: %v)",
						ledger.postAcked, producer.errs.Load(), producer.firstErr.Load())
				})
			ledger.mu.Lock()
			recovery := ledger.firstPostAt.Sub(promotedAt)
			ledger.mu.Unlock()
			recoveries = append(recoveries, recovery)
			// The next standby, synchronous again, before the next fault.
			standby, err = primary.StartStandby(ctx, pgcluster.StandbyOptions{Name: fmt.Sprintf("node%d", n), Synchronous: true})
			require.NoError(t, err)
			next := standby
			t.Cleanup(func() { assert.NoError(t, next.Stop()) })
			t.Logf("failover %d: primary killed, standby promoted %s later, consuming again %s after the promotion; new standby streaming %s after the kill",
				n-1, promotedAt.Sub(killed).Round(time.Millisecond), recovery.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
			continue
		}
		break
	}
	producer.stop()
	ledger.waitAllConsumed(t)
	for _, stop := range stops {
		require.NoError(t, stop(), "Consume's result")
	}
	g, err := client.Group(ctx, "failover", "g")
	require.NoError(t, err)
	st, err := g.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, st.Head, st.Committed, "every message up to the head is settled")
	assert.Zero(t, st.InFlight, "no range left outstanding")
	assert.Zero(t, st.Retrying+st.Quarantined+st.Dead, "no exception row and no dead letter")

	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	var dups int
	for _, n := range ledger.handled {
		dups += n - 1
	}
	worst := time.Duration(0)
	for _, r := range recoveries {
		worst = max(worst, r)
	}
	t.Logf("failover chaos: %s, %d failovers (one every %s); acknowledged %d, produce errors %d, handled %d, missing 0, duplicates %d (%.1f%%); recovery worst %s, all %v",
		duration, len(recoveries), every, len(ledger.acked), producer.errs.Load(), len(ledger.handled), dups,
		100*float64(dups)/float64(max(1, len(ledger.handled))), worst.Round(time.Millisecond), roundAll(recoveries))
	require.NotEmpty(t, recoveries, "SQLSTREAMS_FAILOVER_CHAOS must be longer than SQLSTREAMS_FAILOVER_EVERY")
	assert.LessOrEqual(t, worst, opts.InstanceTTL+5*time.Second, "issue 23: consuming again within InstanceTTL + 5 s of each promotion")
	warnings := sink.Messages(slog.LevelWarn)
	t.Logf("failover chaos: %d WARN/ERROR lines logged by the library: %s", len(warnings), summarize(warnings))
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
