package claimer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

func TestFailingMessageIsRetriedMaxRetriesTimesOnTheCurveThenDead(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{ExceptionInitialBackoff: 5 * time.Second},
		func(*order, int) error { return errors.New("card processor down") })
	st.s.Produce(actortest.Msg{Payload: order{OrderID: "o1"},
		Options: policy.Options{MaxRetries: 3, BaseDelay: 2 * time.Second, Exponent: 2, MaxDelay: time.Minute}})
	start := st.mock.Now()

	require.Equal(t, 1, st.claimRange())
	// Waits: initial backoff 5s, then BaseDelay×1² = 2s, then BaseDelay×2² = 8s.
	for _, wait := range []time.Duration{5 * time.Second, 2 * time.Second, 8 * time.Second} {
		st.mock.Add(wait - time.Millisecond)
		require.Zero(t, st.retry(), "not due before its time")
		st.mock.Add(time.Millisecond)
		require.Equal(t, 1, st.retry())
	}
	st.mock.Add(time.Hour)
	require.Zero(t, st.retry(), "dead rows are not retried")

	require.Len(t, st.calls, 4, "the first attempt and exactly MaxRetries retries")
	offsets := []time.Duration{}
	for i, c := range st.calls {
		require.Equal(t, i+1, c.attempt)
		offsets = append(offsets, c.at.Sub(start))
	}
	require.Equal(t, []time.Duration{0, 5 * time.Second, 7 * time.Second, 15 * time.Second}, offsets)
	xs := st.states()
	require.Len(t, xs, 1)
	require.Equal(t, "dead", xs[0].Status)
	require.Equal(t, 4, xs[0].Attempts)
	require.Contains(t, xs[0].LastError, "card processor down")
	dead, err := st.g.DB.ListDead(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.EqualValues(t, 1, st.stats.Dead.Load())
}

func TestTerminalErrorIsDeadAfterOneAttempt(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return terminal(errors.New("card stolen")) })
	st.s.Produce(actortest.Msg{Payload: order{OrderID: "o1"}})
	st.claimRange()
	st.mock.Add(24 * time.Hour)
	require.Zero(t, st.retry())
	require.Len(t, st.calls, 1)
	xs := st.states()
	require.Equal(t, "dead", xs[0].Status)
	require.Contains(t, xs[0].LastError, "card stolen")
}

func TestDelayDoesNotSpendRetries(t *testing.T) {
	delays := 0
	st := newStepper(t, groupconfig.Declared{}, func(o *order, attempt int) error {
		if delays < 3 {
			delays++
			return delay(time.Minute)
		}
		return errors.New("now it fails")
	})
	st.s.Produce(actortest.Msg{Payload: order{OrderID: "o1"}, Options: policy.Options{MaxRetries: policy.None}})
	st.claimRange()
	for range 3 {
		xs := st.states()
		require.Equal(t, "pending", xs[0].Status)
		require.Zero(t, xs[0].Attempts, "a delay spends no retry")
		st.mock.Add(time.Minute)
		require.Equal(t, 1, st.retry())
	}
	xs := st.states()
	require.Equal(t, "dead", xs[0].Status, "with no retries the first real failure is final")
	require.Equal(t, 3, xs[0].Delays)
	require.Equal(t, 1, xs[0].Attempts)
	for _, c := range st.calls {
		require.Equal(t, 1, c.attempt, "delays do not advance the attempt number")
	}
	require.EqualValues(t, 3, st.stats.Delayed.Load())
}

func TestDelaysPastMaxDelaysCountAsFailures(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return delay(time.Second) })
	st.s.Produce(actortest.Msg{Payload: order{OrderID: "o1"}, Options: policy.Options{MaxRetries: 1, MaxDelays: 1}})
	st.claimRange()                 // delay 1 (free)
	st.mock.Add(time.Second)        //
	require.Equal(t, 1, st.retry()) // delay 2: past MaxDelays, a failure (attempt 1 of 1 retry)
	xs := st.states()
	require.Equal(t, "pending", xs[0].Status)
	require.Equal(t, 1, xs[0].Attempts)
	st.mock.Add(time.Hour)
	require.Equal(t, 1, st.retry())
	require.Equal(t, "dead", st.states()[0].Status)
}

// (That an unknown DeliveryLog mode is refused at Register:
// TestAnUnknownDeliveryLogModeIsRefused, in the root package.)
func TestDeliveryLogModes(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want []string
	}{
		{"", []string{"1 failed"}},
		{policy.LogFailures, []string{"1 failed"}},
		{policy.LogAll, []string{"1 failed", "2 succeeded"}},
		{policy.LogOff, nil},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			st := newStepper(t, groupconfig.Declared{DeliveryLog: tc.mode}, func(_ *order, attempt int) error {
				if attempt == 1 {
					return errors.New("first try fails")
				}
				return nil
			})
			st.s.Produce(actortest.Msg{Payload: order{OrderID: "o1"}})
			st.claimRange()
			st.mock.Add(time.Minute)
			require.Equal(t, 1, st.retry())
			log, err := storetest.Deliveries(context.Background(), st.e.Store, st.g.StreamID(), st.g.ID(), nil)
			require.NoError(t, err)
			var got []string
			for _, d := range log {
				got = append(got, fmt.Sprintf("%d %s", d.Attempt, d.Outcome))
				if d.Outcome == "failed" {
					require.Equal(t, "first try fails", d.Error)
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestDeadLettersNeverPinTheCommittedPosition(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(o *order, _ int) error {
		switch o.OrderID {
		case "m-1":
			return terminal(errors.New("poison"))
		case "m-3":
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Orders("m", 3)...) // m-0..m-2
	st.claimRange()
	committed, err := st.g.DB.Committed(ctx)
	require.NoError(t, err)
	xs := st.states()
	require.Len(t, xs, 1)
	require.Equal(t, "dead", xs[0].Status)
	require.Greater(t, committed.ID, xs[0].MessageID, "the dead letter does not hold the committed position back")

	st.s.Produce(actortest.Msg{Payload: order{OrderID: "m-3"}}, actortest.Msg{Payload: order{OrderID: "m-4"}})
	st.claimRange()
	pinned, err := st.g.DB.Committed(ctx)
	require.NoError(t, err)
	xs = st.states()
	require.Len(t, xs, 2)
	require.Equal(t, "pending", xs[1].Status)
	require.Less(t, pinned.ID, xs[1].MessageID, "an unresolved exception holds it below itself")
	require.GreaterOrEqual(t, pinned.ID, committed.ID)
}

// The retry decision is made with the group config in force when the
// exception row is written, not the one the attempt was claimed under (seed
// 001: "the next claim or exception write uses the current copy"). A
// MaxRetries raised from 1 to 3 while the last allowed attempt ran gives
// that attempt the new budget: the message is retried, not dead.
func TestTheRetryDecisionUsesTheConfigAtTheExceptionWrite(t *testing.T) {
	for _, path := range []string{"range", "exception"} {
		t.Run(path, func(t *testing.T) {
			st := newStepper(t, groupconfig.Declared{Message: policy.Options{MaxRetries: 1}},
				func(*order, int) error { return errors.New("boom") })
			group := st.g.Policy()
			st.common.Group = func() policy.Group { return group }
			st.ranges = claimer.New(claimer.Config{Common: st.common, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
			st.exc, _ = st.newExc()
			raise := func() { group.Message.MaxRetries = 3 } // the refresher's new copy
			ctx := context.Background()
			st.s.Produce(actortest.Orders("m", 1)...)
			if path == "range" { // MaxRetries 0 for the first attempt: its failure would be dead
				group.Message.MaxRetries = policy.None
			}
			jobs, err := st.ranges.Claim(ctx)
			require.NoError(t, err)
			require.Len(t, jobs, 1)
			o := st.ranges.Run(ctx, jobs[0])
			if path == "range" {
				raise()
			}
			_, err = st.ranges.Outcome(ctx, o)
			require.NoError(t, err)
			xs := st.states()
			require.Len(t, xs, 1)
			require.Equal(t, "pending", xs[0].Status, "attempt 1 failed with retries left")
			if path == "exception" { // attempt 2 is the last of MaxRetries 1
				st.mock.Add(time.Hour)
				jobs, err := st.exc.Claim(ctx)
				require.NoError(t, err)
				require.Len(t, jobs, 1)
				o := st.exc.Run(ctx, jobs[0])
				raise()
				_, err = st.exc.Outcome(ctx, o)
				require.NoError(t, err)
				xs = st.states()
				require.Len(t, xs, 1)
				require.Equal(t, "pending", xs[0].Status, "the raised MaxRetries applies to the attempt that ran under the old one")
				require.Equal(t, 2, xs[0].Attempts)
			}
		})
	}
}

// newFirstAttemptFailsStepper drives a group whose retries come 1 s after a
// failure with a handler whose first attempt of every message fails.
func newFirstAttemptFailsStepper(t *testing.T) *stepper {
	t.Helper()
	return newStepper(t, groupconfig.Declared{ExceptionInitialBackoff: time.Second}, func(_ *order, attempt int) error {
		if attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
}

// The exception claimer writes the settlements of unkeyed retries that end
// together in one round trip and one commit (store.SettleExceptions), where
// one each held the exception path to a few hundred rows a second. Each is
// still fenced by its row's token: a row another instance took over
// meanwhile is left to it and counted as a lost lease, and the others are
// settled.
func TestRetriesThatEndTogetherSettleInOneWrite(t *testing.T) {
	st := newFirstAttemptFailsStepper(t)
	ctx := context.Background()
	n := st.common.Concurrency // one claim's worth
	for i := range n {
		st.s.Produce(actortest.Msg{Payload: order{OrderID: fmt.Sprintf("o%d", i)}})
	}
	require.Equal(t, n, st.claimRange())
	require.Len(t, st.states(), n, "an exception row each, due after its backoff")
	st.mock.Add(2 * time.Second)
	jobs, err := st.exc.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, n)
	var outs []claimer.Outcome
	for _, j := range jobs {
		outs = append(outs, st.exc.Run(ctx, j))
	}
	// Another instance takes the third row over (its lease lapsed, say).
	third := jobs[2].Delivery.Msg
	tag, err := st.e.Pool.Exec(ctx, "UPDATE "+st.s.Table("exception")+" SET token = gen_random_uuid() WHERE message_id = $1", third.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	more, err := st.exc.Outcomes(ctx, outs)
	require.NoError(t, err)
	require.Empty(t, more)
	left := st.states()
	require.Len(t, left, 1, "the other retries settled; the row taken over is left to its new holder")
	require.Equal(t, third.ID, left[0].MessageID)
	require.EqualValues(t, 1, st.stats.LeasesLost.Load())
	require.Zero(t, st.exc.Running())
}

// A burst of retries is claimed a batch at a time: the rows beyond the free
// handler slots are leased too, 'queued' (prefetched), and run as slots
// free. When their holder dies, the prefetched rows spend no attempt, and
// come back as takeovers, 'running', each in a slot of its own: a message
// that kills its process still spends its retries. Before, a claim took a
// free slot's worth of rows, and 10% of a burn-down failing once ran at a
// few hundred retries a second.
func TestRetriesBeyondTheFreeSlotsArePrefetchedAndTheirLapseSpendsNoAttempt(t *testing.T) {
	st := newFirstAttemptFailsStepper(t)
	ctx := context.Background()
	const n = 20
	for i := range n {
		st.s.Produce(actortest.Msg{Payload: order{OrderID: fmt.Sprintf("o%d", i)}})
	}
	require.Equal(t, 10, st.claimRange())
	require.Equal(t, 10, st.claimRange())
	require.Len(t, st.states(), n, "an exception row each, due after its backoff")
	st.mock.Add(2 * time.Second)

	slots := st.common.Concurrency
	first, _ := st.newExcWith(50, 0)
	jobs, err := first.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, n, "one claim takes the whole burst")
	was := map[int64]string{}
	for _, x := range st.states() {
		was[x.MessageID] = x.Status
	}
	count := func(status string) (k int) {
		for _, v := range was {
			if v == status {
				k++
			}
		}
		return k
	}
	require.Equal(t, slots, count(policy.StatusRunning), "the free slots' worth start")
	require.Equal(t, n-slots, count(policy.StatusQueued), "the rest are prefetched")

	// Every other one runs and settles (of those started and of those
	// prefetched); then the process dies.
	var outs []claimer.Outcome
	for i, j := range jobs {
		if i%2 == 1 {
			outs = append(outs, first.Run(ctx, j))
		}
	}
	more, err := first.Outcomes(ctx, outs)
	require.NoError(t, err)
	require.Empty(t, more)
	left := st.states()
	require.Len(t, left, n/2)
	st.mock.Add(2 * time.Minute) // past every lease

	other, otherID := st.newExcWith(50, n)
	taken, err := other.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, taken, n/2, "every lapsed row is taken over")
	states := map[int64]store.ExceptionState{}
	for _, x := range st.states() {
		states[x.MessageID] = x
	}
	kinds := map[string]int{}
	for _, j := range taken {
		id := j.Delivery.Msg.ID
		x := states[id]
		kinds[was[id]]++
		require.Equal(t, policy.StatusRunning, x.Status, "message %d: a takeover starts in a slot of its own, never prefetched", id)
		if was[id] == policy.StatusRunning {
			require.Equal(t, 2, x.Attempts, "message %d was running: its holder's death counts as an attempt", id)
			require.Equal(t, 3, j.Delivery.Attempt, "message %d", id)
		} else {
			require.Equal(t, 1, x.Attempts, "message %d was prefetched: its holder's death spends nothing", id)
			require.Equal(t, 2, j.Delivery.Attempt, "message %d", id)
		}
	}
	require.Positive(t, kinds[policy.StatusRunning], "some of the rows taken over had started")
	require.Positive(t, kinds[policy.StatusQueued], "some had been prefetched")
	require.NotEmpty(t, otherID)
	outs = outs[:0]
	for _, j := range taken {
		outs = append(outs, other.Run(ctx, j))
	}
	_, err = other.Outcomes(ctx, outs)
	require.NoError(t, err)
	require.Empty(t, st.states(), "every retry succeeded")
}
