package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/c1702965/sqlstreams/internal/store/storetest"
)

// A range's settled prefix is recorded on the flush tick: when the instance
// dies with the range in flight, the instance that reclaims it delivers only
// what had not settled, and the prefix's failures and delivery-log rows are
// already written (the 30-minute chaos run delivered 31% of its messages
// twice when a reclaimed range ran again whole).
func TestAReclaimerStartsAfterTheSettledPrefix(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{DeliveryLog: DeliveryLogAll}, func(o *order, attempt int) error {
		if o.OrderID == "m-2" {
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.e.produceN(s, "m", 10)
	jobs, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 10)
	for _, j := range jobs[:6] { // m-0 … m-5 settle (m-2 fails); m-6 … m-9 never run
		more, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
		require.Empty(t, more)
	}
	require.NoError(t, st.ranges.Flush(ctx))
	require.EqualValues(t, 1, st.stats.ProgressRecorded.Load())
	require.NoError(t, st.ranges.Flush(ctx))
	require.EqualValues(t, 1, st.stats.ProgressRecorded.Load(), "nothing settled since: nothing written")

	xs := st.states()
	require.Len(t, xs, 1, "m-2's failure is written with the prefix")
	require.Equal(t, "pending", xs[0].Status)
	log, err := storetest.Deliveries(ctx, st.e.client.store, st.c.group.StreamID, st.c.group.ID, nil)
	require.NoError(t, err)
	require.Len(t, log, 6, "the prefix's delivery-log rows are written with it")

	// The instance dies: its lease lapses and another instance reclaims.
	_, err = st.e.pool.Exec(ctx, fmt.Sprintf("UPDATE %s.stream_%d_range SET expires_at = '-infinity'", st.e.client.Schema(), st.c.group.StreamID))
	require.NoError(t, err)
	var ran []string
	other := newStepperFor(t, st.e, st.c, st.mock, st.c.adapt(func(_ context.Context, o *order) error {
		ran = append(ran, o.OrderID)
		return nil
	}))
	again, err := other.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, again, 4, "only the unsettled suffix is delivered again")
	for _, j := range again {
		_, err := other.ranges.Outcome(ctx, other.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.Equal(t, []string{"m-6", "m-7", "m-8", "m-9"}, ran)
	require.Len(t, st.e.leases(st.c), 0, "the reclaimer committed the rest")
	log, err = storetest.Deliveries(ctx, st.e.client.store, st.c.group.StreamID, st.c.group.ID, nil)
	require.NoError(t, err)
	require.Len(t, log, 10, "each message logged once")
	require.Len(t, st.states(), 1, "m-2 still waits for its retry")

	// The dead instance's late outcomes settle nothing.
	for _, j := range jobs[6:] {
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	log, err = storetest.Deliveries(ctx, st.e.client.store, st.c.group.StreamID, st.c.group.ID, nil)
	require.NoError(t, err)
	require.Len(t, log, 10)
}

// A recorded prefix is never undone: a hand-back whose own prefix is shorter
// (its first message still running) keeps the bound recorded.
func TestAHandBackKeepsTheRecordedPrefix(t *testing.T) {
	hold := map[string]bool{}
	st, s := newStepper(t, nil, func(o *order, attempt int) error {
		if hold[o.OrderID] {
			return errors.New("held")
		}
		return nil
	})
	ctx := context.Background()
	st.e.produceN(s, "m", 6)
	jobs, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 6)
	for _, j := range jobs[:3] {
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.NoError(t, st.ranges.Flush(ctx))
	require.NoError(t, st.ranges.HandBack(ctx))
	var ran []string
	other := newStepperFor(t, st.e, st.c, st.mock, st.c.adapt(func(_ context.Context, o *order) error {
		ran = append(ran, o.OrderID)
		return nil
	}))
	again, err := other.ranges.Claim(ctx)
	require.NoError(t, err)
	for _, j := range again {
		_, err := other.ranges.Outcome(ctx, other.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.Equal(t, []string{"m-3", "m-4", "m-5"}, ran)
}
