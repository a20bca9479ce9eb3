package claimer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/stretchr/testify/require"
)

// A range's settled prefix is recorded on the flush tick: when the instance
// dies with the range in flight, the instance that reclaims it delivers only
// what had not settled, and the prefix's failures and delivery-log rows are
// already written (the 30-minute chaos run delivered 31% of its messages
// twice when a reclaimed range ran again whole).
func TestAReclaimerStartsAfterTheSettledPrefix(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{DeliveryLog: policy.LogAll}, func(o *order, attempt int) error {
		if o.OrderID == "m-2" {
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Orders("m", 10)...)
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
	require.Len(t, st.deliveries(t), 6, "the prefix's delivery-log rows are written with it")

	// The instance dies: its lease lapses and another instance reclaims.
	st.expireRanges()
	var ran []string
	other := newStepperFor(t, st.e, st.g, decoded(func(o *order, _ *claimer.Delivery) error {
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
	require.Len(t, st.g.Leases(), 0, "the reclaimer committed the rest")
	require.Len(t, st.deliveries(t), 10, "each message logged once")
	require.Len(t, st.states(), 1, "m-2 still waits for its retry")

	// The dead instance's late outcomes settle nothing.
	for _, j := range jobs[6:] {
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.Len(t, st.deliveries(t), 10)
}

// A recorded prefix is never undone: a hand-back whose own prefix is shorter
// (its first message still running) keeps the bound recorded.
func TestAHandBackKeepsTheRecordedPrefix(t *testing.T) {
	hold := map[string]bool{}
	st := newStepper(t, groupconfig.Declared{}, func(o *order, attempt int) error {
		if hold[o.OrderID] {
			return errors.New("held")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Orders("m", 6)...)
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
	other := newStepperFor(t, st.e, st.g, decoded(func(o *order, _ *claimer.Delivery) error {
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

// Messages settled beyond the prefix (an earlier message still runs) are
// recorded too: a reclaimer skips them, and a second reclaimer skips what
// either earlier holder settled. Claimer restarts and dead instances left
// whole stretches of a range settled behind one slow message, and the chaos
// run delivered them again.
func TestAReclaimerSkipsMessagesSettledBeyondThePrefix(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{DeliveryLog: policy.LogAll}, func(o *order, attempt int) error {
		if o.OrderID == "m-3" {
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Orders("m", 10)...)
	jobs, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 10)
	for _, j := range jobs[1:6] { // m-1 … m-5 settle (m-3 fails) while m-0 runs; m-6 … m-9 never run
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.NoError(t, st.ranges.Flush(ctx))
	require.EqualValues(t, 1, st.stats.ProgressRecorded.Load())
	require.NoError(t, st.ranges.Flush(ctx))
	require.EqualValues(t, 1, st.stats.ProgressRecorded.Load(), "nothing settled since: nothing written")
	xs := st.states()
	require.Len(t, xs, 1, "m-3's failure is written with the settled set")
	require.Len(t, st.deliveries(t), 5, "the settled messages' delivery-log rows are written with them")

	expire := st.expireRanges
	expire() // the instance dies
	var ran []string
	handler := decoded(func(o *order, _ *claimer.Delivery) error {
		ran = append(ran, o.OrderID)
		return nil
	})
	second := newStepperFor(t, st.e, st.g, handler)
	again, err := second.ranges.Claim(ctx)
	require.NoError(t, err)
	ids := func(js []claimer.Job) []string {
		var out []string
		for _, j := range js {
			out = append(out, orderOf(t, j).OrderID)
		}
		return out
	}
	require.Equal(t, []string{"m-0", "m-6", "m-7", "m-8", "m-9"}, ids(again), "only what had not settled is delivered again")
	_, err = second.ranges.Outcome(ctx, second.ranges.Run(ctx, again[2])) // m-7 settles; m-0 runs on
	require.NoError(t, err)
	require.NoError(t, second.ranges.Flush(ctx))
	expire() // the second holder dies too

	third := newStepperFor(t, st.e, st.g, handler)
	last, err := third.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"m-0", "m-6", "m-8", "m-9"}, ids(last), "what either holder settled is skipped")
	for _, j := range last {
		_, err := third.ranges.Outcome(ctx, third.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.Equal(t, []string{"m-7", "m-0", "m-6", "m-8", "m-9"}, ran)
	require.Len(t, st.g.Leases(), 0, "the third holder committed the rest")
	require.Len(t, st.deliveries(t), 10, "each message logged once")
	require.Len(t, st.states(), 1, "m-3 still waits for its retry")

	// The first holder's late outcome of m-0 settles nothing.
	_, err = st.ranges.Outcome(ctx, st.ranges.Run(ctx, jobs[0]))
	require.NoError(t, err)
	require.Len(t, st.deliveries(t), 10)
}
