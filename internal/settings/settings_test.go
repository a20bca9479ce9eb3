package settings

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWorkerDocumentRoundTripsThroughResolve(t *testing.T) {
	two := 2
	doc, err := Worker{Instances: &two, Interval: Of(5 * time.Minute), Batch: 10, DeliveryTTL: Of(time.Hour),
		ChunkInterval: Of(30 * time.Minute)}.Doc()
	require.NoError(t, err)
	require.JSONEq(t, `{"instances":2,"interval":"5m0s","batch":10,"delivery_ttl":"1h0m0s","chunk_interval":"30m0s"}`, string(doc),
		"sparse: only the fields set")
	r, err := Resolve(doc, 0)
	require.NoError(t, err)
	require.Equal(t, Resolved{Instances: 2, Interval: 5 * time.Minute, Batch: 10, MaxBatches: DefaultMaxBatches,
		DeliveryTTL: time.Hour, IdempotencyTTL: DefaultIdempotencyTTL, ConfigLogKeep: DefaultConfigLogKeep,
		InstanceKeep: DefaultInstanceKeep, ChunkInterval: 30 * time.Minute}, r)

	zero := 0
	doc, err = Worker{Instances: &zero}.Doc()
	require.NoError(t, err)
	r, err = Resolve(doc, time.Hour)
	require.NoError(t, err)
	require.Zero(t, r.Instances, "a suspended worker")
	require.Equal(t, time.Hour, r.Interval, "the worker's own default interval")
}

func TestUnreadableKnobsKeepTheirDefaultsAndSaySo(t *testing.T) {
	r, err := Resolve([]byte(`{"interval":"soon","delivery_ttl":"-1h","batch":7}`), 0)
	require.ErrorContains(t, err, `interval "soon"`)
	require.ErrorContains(t, err, `delivery_ttl "-1h"`)
	require.Equal(t, DefaultInterval, r.Interval)
	require.Equal(t, DefaultDeliveryTTL, r.DeliveryTTL)
	require.Equal(t, 7, r.Batch, "the readable fields apply")
}

func TestStreamDocument(t *testing.T) {
	s, err := ParseStream([]byte(`{"max_message_bytes":4096,"retention_ttl":"24h0m0s"}`))
	require.NoError(t, err)
	ttl, err := s.Retention()
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, ttl)
	require.Equal(t, 4096, s.MaxMessageBytes)
	_, err = Stream{RetentionTTL: "never"}.Retention()
	require.Error(t, err)
	ttl, err = Stream{}.Retention()
	require.NoError(t, err)
	require.Zero(t, ttl)
}
