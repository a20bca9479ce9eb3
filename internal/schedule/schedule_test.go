package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRefusesBadInput(t *testing.T) {
	for _, c := range []struct{ expr, zone string }{
		{"* * *", ""}, {"61 * * * *", ""}, {"@sometimes", ""}, {"* * * * *", "Mars/Olympus"},
	} {
		_, err := Parse(c.expr, c.zone)
		require.Error(t, err, "%q %q", c.expr, c.zone)
	}
	_, err := Parse("*/5 * * * *", "Europe/Paris")
	require.NoError(t, err)
}

func TestDecideByPolicy(t *testing.T) {
	s, err := Parse("*/10 * * * *", "")
	require.NoError(t, err)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(35 * time.Minute) // due at :00 :10 :20 :30 were missed
	for _, c := range []struct {
		missed string
		want   []time.Time
	}{
		{MissedAll, []time.Time{t0, t0.Add(10 * time.Minute), t0.Add(20 * time.Minute), t0.Add(30 * time.Minute)}},
		{MissedLatest, []time.Time{t0.Add(30 * time.Minute)}},
		{MissedSkip, nil},
	} {
		due, next := s.Decide(t0, now, c.missed)
		require.Equal(t, c.want, due, c.missed)
		require.Equal(t, t0.Add(40*time.Minute), next, c.missed)
	}
	due, next := s.Decide(t0, t0.Add(time.Minute), MissedSkip)
	require.Equal(t, []time.Time{t0}, due, "on time: it runs")
	require.Equal(t, t0.Add(10*time.Minute), next)
	due, _ = s.Decide(t0.Add(10*time.Minute), t0.Add(5*time.Minute), MissedLatest)
	require.Empty(t, due, "not due yet")
	paris, err := Parse("0 9 * * *", "Europe/Paris")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 7, 1, 7, 0, 0, 0, time.UTC), paris.Next(time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)), "09:00 in Paris is 07:00 UTC in summer")
}
