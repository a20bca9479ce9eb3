package sqlstreams

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestScheduleVerbs(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	st.mock.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	sc := st.e.client.Scheduler("hourly")
	require.ErrorIs(t, sc.Register(ctx, "orders", "61 * * * *", order{}, nil), ErrInvalidConfig)
	require.ErrorIs(t, sc.Register(ctx, "orders", "@hourly", order{}, &SchedulerConfig{Zone: "Mars/Olympus"}), ErrInvalidConfig)
	require.ErrorIs(t, sc.Register(ctx, "orders", "@hourly", order{}, &SchedulerConfig{Missed: "sometimes"}), ErrInvalidConfig)
	require.ErrorIs(t, sc.Register(ctx, "nope", "@hourly", order{}, nil), ErrNotRegistered)
	require.ErrorIs(t, st.e.client.Scheduler("ghost").Suspend(ctx), ErrNoSchedule)
	require.NoError(t, sc.Register(ctx, "orders", "@hourly", order{OrderID: "h"}, &SchedulerConfig{Missed: MissedLatest}))

	m := st.e.client.Manager().actor(time.Hour, nil, nil)
	require.NoError(t, sc.RunNow(ctx))
	require.EqualValues(t, 1, st.e.count(s), "run now produces at once")
	require.NoError(t, sc.Suspend(ctx))
	st.mock.Add(3 * time.Hour)
	require.NoError(t, m.Step(ctx))
	require.EqualValues(t, 1, st.e.count(s), "suspended: nothing due runs")
	require.NoError(t, sc.Resume(ctx))
	list, err := st.e.client.Schedules(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 3, 1, 4, 0, 0, 0, time.UTC), list[0].NextDue.UTC(), "resumed at its next due time; the suspended runs are not made up")
	st.mock.Add(3 * time.Hour) // 04:00, 05:00 and 06:00 pass with no manager
	require.NoError(t, m.Step(ctx))
	require.EqualValues(t, 2, st.e.count(s), "MissedLatest: one run for the newest missed due time")
}
