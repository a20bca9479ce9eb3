package sqlstreamsotel

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestMetricsFromTheObserver(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	obs, err := NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t), Observer: obs})
	require.NoError(t, err)
	orders := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, orders.Register(ctx, nil))
	c, err := orders.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	for _, id := range []string{"ok", "bad"} {
		_, err := orders.Produce(ctx, order{ID: id}, nil)
		require.NoError(t, err)
	}
	n := 0
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	require.NoError(t, c.Consume(cctx, func(_ context.Context, o *order) error {
		if n++; n == 2 {
			cancel()
		}
		if o.ID == "bad" {
			return sqlstreams.Terminal(errors.New("bad"))
		}
		return nil
	}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true, MessageConcurrency: 1}))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	sums := map[string]int64{}
	counts := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					counts[m.Name] += p.Count
				}
			}
		}
	}
	require.EqualValues(t, 2, sums["sqlstreams.messages.produced"])
	require.EqualValues(t, 2, sums["sqlstreams.handler.attempts"])
	require.EqualValues(t, 1, sums["sqlstreams.dead_letters"])
	require.GreaterOrEqual(t, sums["sqlstreams.ranges.claimed"], int64(1))
	require.EqualValues(t, 2, counts["sqlstreams.handler.duration"])
	require.EqualValues(t, 2, counts["sqlstreams.produce_to_handler.duration"])
	require.GreaterOrEqual(t, counts["sqlstreams.claim.duration"], uint64(1))
}
