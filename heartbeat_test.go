package sqlstreams

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// The heartbeat's step registers the instance, renews it together with the
// instance's range leases, and reports a vanished row on Lost.
func TestHeartbeatStepRenewsLeasesAndReportsLoss(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, _, c := setup(t, &ClientConfig{Clock: mock}, "g", 3)
	ctx := context.Background()

	id := engine.NewID()
	liveness := heartbeat.NewLiveness()
	hb := heartbeat.New(heartbeat.Config{
		Store: e.client.store, StreamID: c.group.StreamID, WorkerConfigID: c.group.Workers[store.WorkerMessageConsumer],
		InstanceID: id, DeclaredBy: declaredBy(), TTL: 30 * time.Second, Clock: mock, Logger: slog.New(e.logs),
		DBNow: engine.DBNow(mock), Liveness: liveness, Graceful: func() bool { return true },
	})
	require.Equal(t, 10*time.Second, hb.Interval())
	require.NoError(t, hb.Step(ctx))
	live := func() int {
		n, err := storetest.LiveInstances(ctx, e.client.store, c.group.Workers[store.WorkerMessageConsumer], engine.DBNow(mock)())
		require.NoError(t, err)
		return n
	}
	require.Equal(t, 1, live())

	args := store.ClaimParams{Owner: id, Limit: 10, Lease: 30 * time.Second, Now: engine.DBNow(mock)()}
	_, ok, err := c.db().ClaimRange(ctx, args)
	require.NoError(t, err)
	require.True(t, ok)

	// 25s later a beat renews both; at 40s neither has lapsed.
	mock.Add(25 * time.Second)
	require.NoError(t, hb.Step(ctx))
	mock.Add(15 * time.Second)
	require.Equal(t, 1, live())
	other := args
	other.Owner, other.Now = engine.NewID(), engine.DBNow(mock)()
	_, ok, err = c.db().ReclaimRange(ctx, other)
	require.NoError(t, err)
	require.False(t, ok, "a renewed lease is not reclaimable")

	// Without beats, both lapse.
	mock.Add(31 * time.Second)
	require.Zero(t, live())
	other.Now = engine.DBNow(mock)()
	_, ok, err = c.db().ReclaimRange(ctx, other)
	require.NoError(t, err)
	require.True(t, ok, "a lapsed instance's range is reclaimed")

	// A row deleted behind its back is reported and registered again.
	require.NoError(t, e.client.store.DeleteInstance(ctx, id))
	require.NoError(t, hb.Step(ctx))
	select {
	case <-liveness.C():
	default:
		t.Fatal("nothing reported")
	}
	renewed, lost := liveness.Take()
	require.Equal(t, 1, lost, "the loss is reported, and kept through the renewals around it")
	require.False(t, renewed.IsZero(), "renewals are reported with when they were sent")
	require.Equal(t, 1, live())
}
