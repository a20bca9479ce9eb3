package sqlstreams

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgcluster"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAutomatedFailoverLosesNothing is the failover with an orchestrator
// deciding it: a pg_auto_failover formation (Debian's
// postgresql-15-auto-failover: a monitor and two data nodes, replicating
// synchronously) runs while a client on the formation's multi-host URL
// produces and one Consume session consumes; the primary's machine dies
// (its pg_autoctl killed, its server stopped immediately), and the monitor,
// from its health checks alone, promotes the secondary. Every acknowledged
// message must be consumed; the detection time (kill to promotion, the
// monitor's, shortened in pgcluster's monitorSettings) and the recovery
// time (promotion to consuming again) are reported. make failover runs it
// (SQLSTREAMS_FAILOVER_AUTO); it is skipped, saying how to install it,
// where pg_autoctl is not installed.
func TestAutomatedFailoverLosesNothing(t *testing.T) {
	if os.Getenv("SQLSTREAMS_FAILOVER_AUTO") == "" {
		t.Skip("SQLSTREAMS_FAILOVER_AUTO is not set (make failover sets it)")
	}
	if pgtest.External() {
		t.Skip("the database is external (SQLSTREAMS_TEST_DATABASE_URL); this test runs a pg_auto_failover formation of its own")
	}
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	f, err := pgcluster.StartFormation(sctx)
	if errors.Is(err, pgcluster.ErrNoAutoFailover) {
		t.Skip(err.Error())
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, f.Stop()) })
	old, err := f.Primary(ctx)
	require.NoError(t, err)
	other := "node1"
	if old == "node1" {
		other = "node2"
	}

	cfg, err := pgxpool.ParseConfig(f.URL("postgres"))
	require.NoError(t, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var names string
	require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names))
	require.NotEmpty(t, names, "pg_auto_failover replicates synchronously to a healthy secondary")
	t.Logf("auto failover: formation up, primary %s, synchronous_standby_names %q", old, names)

	client, sink, s, c := failoverClient(t, pool, "failover")
	ledger, opts, stopConsuming, producer := failoverTraffic(t, s, c)

	killed := time.Now()
	require.NoError(t, f.KillNode(ctx, old))
	// The monitor fails over when its health checks say so; the failover
	// is done when the other node is out of recovery and the monitor has it
	// as wait_primary (writes accepted, no synchronous standby to wait for)
	// or primary. An external process's decision: this polls it, as an
	// application's health check would.
	conn, err := pgx.Connect(ctx, f.NodeURL(other, "postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var leftRecovery time.Time
	var states map[string]string
	for {
		if leftRecovery.IsZero() {
			var inRecovery bool
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery))
			if !inRecovery {
				leftRecovery = time.Now()
			}
		}
		if !leftRecovery.IsZero() {
			states, err = f.States(ctx)
			require.NoError(t, err)
			if s := states[other]; s == "wait_primary" || s == "primary" {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "the monitor did not fail over to %s within 2 minutes of the kill (states %v)", other, states)
		<-tick.C
	}
	promotedAt := time.Now()
	ledger.promoted(promotedAt)
	t.Logf("auto failover: %s killed; %s left recovery %s later and the monitor had it as %s %s later (states %v)", old, other,
		leftRecovery.Sub(killed).Round(time.Millisecond), states[other], promotedAt.Sub(killed).Round(time.Millisecond), states)
	checkFailover(t, client, sink, ledger, opts, stopConsuming, producer, promotedAt)
}
