package groupconfig

import (
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/stretchr/testify/require"
)

func TestDocsRoundTripAndStaySparse(t *testing.T) {
	empty, err := Declared{}.Docs()
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(empty[MessageConsumer]))
	require.JSONEq(t, `{}`, string(empty[ExceptionConsumer]))

	d := Declared{Start: "head", Message: policy.Options{Timeout: 10 * time.Second, MaxRetries: 5},
		MessageMax: policy.Options{Timeout: time.Minute}, ConcurrencyOverride: policy.Exclusive,
		MaxRangeReclaims: 2, DeliveryLog: policy.LogAll, ExceptionInitialBackoff: 3 * time.Second}
	docs, err := d.Docs()
	require.NoError(t, err)
	require.JSONEq(t, `{"start":"head","message":{"timeout":"10s","retry":{"max_retries":5}},"message_max":{"timeout":"1m0s"},
		"concurrency_override":"exclusive","max_range_reclaims":2,"delivery_log":"all"}`, string(docs[MessageConsumer]))
	require.JSONEq(t, `{"exception_initial_backoff":"3s"}`, string(docs[ExceptionConsumer]))
	back, err := FromDocs(docs)
	require.NoError(t, err)
	require.Equal(t, d, back)
	_, err = FromDocs(map[string][]byte{ExceptionConsumer: []byte(`{"exception_initial_backoff":"soon"}`)})
	require.Error(t, err)
}

func TestDiffNamesEachChangedField(t *testing.T) {
	a, _ := Declared{Message: policy.Options{MaxRetries: 3, Timeout: 10 * time.Second}}.Docs()
	b, _ := Declared{Message: policy.Options{MaxRetries: 5, Timeout: 10 * time.Second}, ExceptionInitialBackoff: time.Second}.Docs()
	changes, err := Diff(a, b)
	require.NoError(t, err)
	var got []string
	for _, c := range changes {
		got = append(got, c.String())
	}
	require.Equal(t, []string{"message.retry.max_retries: 3 → 5",
		"exception_initial_backoff: (unset) → 1s"}, got)
	none, err := Diff(a, a)
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestSnapshotReportsChange(t *testing.T) {
	s := NewSnapshot(Declared{})
	require.False(t, s.Set(Declared{}))
	require.True(t, s.Set(Declared{MaxRangeReclaims: 4}))
	require.Equal(t, 4, s.Group().MaxRangeReclaims)
	require.Equal(t, 4, s.Declared().MaxRangeReclaims)
}
