package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A group's status counts the messages it has left by state: available
// (not claimed yet), in flight (claimed, not settled), retrying, dead. Lag
// is what is left to handle: every state but dead.
func TestStatusCountsEachStateOfTheBacklog(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{ExceptionInitialBackoff: time.Hour}, func(o *order, _ int) error {
		switch o.OrderID {
		case "dead":
			return Terminal(errors.New("card stolen"))
		case "retry":
			return errors.New("card processor down")
		}
		return nil
	})
	ctx := context.Background()
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	for _, id := range []string{"dead", "retry", "ok"} {
		_, err := s.Produce(ctx, order{OrderID: id}, nil)
		require.NoError(t, err)
	}
	require.Equal(t, 3, st.claimRange())
	settled, err := g.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, [5]int64{0, 0, 1, 0, 1}, counts(settled), "available, in flight, retrying, quarantined, dead")
	require.EqualValues(t, 1, settled.Lag, "the retrying message is left to handle; the dead letter is not")

	st.e.produceN(s, "ok", 15)
	jobs, err := st.ranges.Claim(ctx) // a range of BatchLimit (10), not run yet
	require.NoError(t, err)
	require.Len(t, jobs, 10)
	busy, err := g.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, [5]int64{5, 10, 1, 0, 1}, counts(busy))
	require.EqualValues(t, 16, busy.Lag)
	require.False(t, busy.Estimated)
	require.EqualValues(t, 1, busy.Ranges)

	// Past the bound, the counts are estimates and say so.
	bounded, err := g.status(ctx, 3)
	require.NoError(t, err)
	require.True(t, bounded.Estimated)
	require.EqualValues(t, 5, bounded.Available, "3 counted, and the ids after the last one counted")
	require.EqualValues(t, 10, bounded.InFlight, "the ranges' id spans")

	st.runAll(jobs)
	done, err := g.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, [5]int64{5, 0, 1, 0, 1}, counts(done))
}

func counts(s *GroupStatus) [5]int64 {
	return [5]int64{s.Available, s.InFlight, s.Retrying, s.Quarantined, s.Dead}
}

// Redriving dead letters adds them, and only them, to what is left
// (issue 60: redriving 2 moved the lag from 0 to 19).
func TestRedriveAddsOnlyTheRedrivenMessagesToTheLag(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{ExceptionInitialBackoff: time.Hour}, func(o *order, _ int) error {
		if o.Amount < 2 {
			return Terminal(errors.New("card stolen"))
		}
		return nil
	})
	ctx := context.Background()
	st.e.produceN(s, "m", 20)
	st.drainRanges()
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	before, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, before.Lag)
	require.EqualValues(t, 2, before.Dead)
	n, err := g.RedriveAll(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	after, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, after.Dead)
	require.EqualValues(t, 2, after.Retrying)
	require.EqualValues(t, 2, after.Lag, "the two redriven messages, not the positions after the first")
}

// A group with bindings counts only the messages its bindings match: the
// others are never its to handle.
func TestStatusOfABoundGroupCountsOnlyWhatMatches(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{Bindings: []string{"orders.eu.#"}}, func(*order, int) error { return nil })
	ctx := context.Background()
	for i := range 7 {
		key := "orders.us.ny"
		if i%2 == 0 {
			key = "orders.eu.fr"
		}
		_, err := s.Produce(ctx, order{OrderID: fmt.Sprint(i)}, &ProduceOptions{RoutingKey: key})
		require.NoError(t, err)
	}
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	all, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, all.Available, "4 of the 7 match")
	require.EqualValues(t, 4, all.Lag)
	jobs, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	claimed, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, claimed.Available)
	require.EqualValues(t, 4, claimed.InFlight, "only the range's matching messages are in flight")
	st.runAll(jobs)
}

// A seek to the head reads as the head, not as the beginning: the
// positions shown are the last message at or before it (issue 60: "after
// 0 0", then COMMITTED 0).
func TestSeekToHeadReadsAsTheHead(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	st.e.produceN(s, "m", 3)
	last, err := s.Produce(ctx, order{OrderID: "last"}, nil)
	require.NoError(t, err)
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	dry, err := g.Seek(ctx, SeekHead(), &SeekOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, last.ID, dry.After.ID)
	res, err := g.Seek(ctx, SeekHead(), nil)
	require.NoError(t, err)
	require.Equal(t, last.ID, res.After.ID)
	status, err := g.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, last.ID, status.Committed.ID)
	require.Equal(t, last.ID, status.Cursor.ID)
	require.Equal(t, status.Head, status.Committed)
	require.Zero(t, status.Lag)
	back, err := g.Seek(ctx, SeekBeginning(), nil)
	require.NoError(t, err)
	require.Equal(t, last.ID, back.BeforeCursor.ID)
	require.Zero(t, back.After.ID)
}

// Status counts Consume sessions, not worker rows (a session holds one per
// worker), and lists each session once (issue 60: the count was twice the
// sessions).
func TestStatusCountsSessionsNotWorkerRows(t *testing.T) {
	e, _, c := setup(t, nil, "g", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	for range 2 {
		ready := NewReadiness()
		go func() {
			done <- c.Consume(ctx, func(context.Context, *order) error { return nil },
				&ConsumeOptions{Readiness: ready, DisableManager: true})
		}()
		require.NoError(t, ready.Wait(ctx))
	}
	g, err := e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	s, err := g.Status(ctx)
	require.NoError(t, err)
	require.Len(t, s.Members, 2)
	for _, m := range s.Members {
		require.Len(t, m.Instances, 2, "a session holds one instance row per worker")
		require.True(t, m.Live)
	}
	in, err := g.Inspect(ctx)
	require.NoError(t, err)
	require.Len(t, in.Members, 2)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
}
