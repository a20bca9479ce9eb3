package sqlstreams

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/manager"
	"github.com/stretchr/testify/require"
)

// A schedule with three managers running produces every due time exactly
// once, including across the crash of the manager running it.
func TestScheduleProducesEveryDueTimeOnceAcrossManagerCrash(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	const ttl = 30 * time.Second
	st.mock.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, st.e.client.Scheduler("tick").Register(ctx, "orders", "*/5 * * * *", order{OrderID: "tick"}, &SchedulerConfig{Missed: MissedAll}))
	ms := []*manager.Actor{st.e.client.Manager().actor(ttl, nil, nil), st.e.client.Manager().actor(ttl, nil, nil), st.e.client.Manager().actor(ttl, nil, nil)}
	crashed := -1
	for minute := 1; minute <= 120; minute++ {
		for sec := 0; sec < 60; sec += 10 { // every heartbeat
			st.mock.Add(10 * time.Second)
			for i, m := range ms {
				if i != crashed {
					require.NoError(t, m.Step(ctx))
				}
			}
		}
		if minute == 30 { // the holder dies; its slot lapses after ttl
			for i, m := range ms {
				if m.Holds(WorkerScheduler) {
					crashed = i
				}
			}
			require.NotEqual(t, -1, crashed)
		}
	}
	taken := false
	for i, m := range ms {
		taken = taken || (i != crashed && m.Holds(WorkerScheduler))
	}
	require.True(t, taken, "another manager took the scheduler over")
	rows, err := st.e.pool.Query(ctx, fmt.Sprintf("SELECT key FROM %s.stream_%d_idempotency ORDER BY key", st.e.client.Schema(), st.c.group.StreamID))
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		got = append(got, k)
	}
	require.NoError(t, rows.Err())
	var want []string
	for m := 5; m <= 120; m += 5 {
		want = append(want, "schedule:tick:"+time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(m)*time.Minute).Format(time.RFC3339Nano))
	}
	require.Equal(t, want, got, "every due time, once")
	require.Equal(t, int64(len(want)), st.e.count(s), "one message per due time")

	list, err := st.e.client.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, time.Date(2026, 3, 1, 2, 5, 0, 0, time.UTC), list[0].NextDue.UTC())
	require.Equal(t, time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC), list[0].LastDue.UTC())
}

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
