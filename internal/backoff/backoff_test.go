package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWaitDoublesUpToMaxWithinJitter(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		w *= time.Millisecond
		require.Equal(t, w, Policy{Initial: p.Initial, Max: p.Max}.Wait(i+1, 0.9), "no jitter, retry %d", i+1)
		require.Equal(t, time.Duration(float64(w)*0.8), p.Wait(i+1, 0), "lowest draw, retry %d", i+1)
		require.Equal(t, w, p.Wait(i+1, 0.5), "middle draw, retry %d", i+1)
		got := p.Wait(i+1, -1)
		require.GreaterOrEqual(t, got, time.Duration(float64(w)*0.8))
		require.LessOrEqual(t, got, time.Duration(float64(w)*1.2))
	}
}

func TestBackoffResetsOnSuccess(t *testing.T) {
	b := Backoff{Policy: Policy{Initial: time.Second, Max: time.Minute}}
	require.Equal(t, time.Second, b.Failed())
	require.Equal(t, 2*time.Second, b.Failed())
	require.Equal(t, 2, b.Failures())
	b.Succeeded()
	require.Equal(t, time.Second, b.Failed())
}
