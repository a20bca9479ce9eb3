package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/stretchr/testify/require"
)

// A redrive wakes the group's exception claimers in every process, as a
// produce wakes its range claimers: with a consumer running on default
// options, its claimers quiet (decision 0038), each of 20 redriven dead
// letters is handled again within a second. Before, the quiet exception
// claimer found it at its backstop sweep, up to 300 s later.
func TestARedriveIsHandledWithinASecond(t *testing.T) {
	ctx := context.Background()
	_, s, c := setup(t, nil, "g", 0)
	rounds := 20
	if testing.Short() {
		rounds = 3 // each waits for a quiet poll tick: about 2 s
	}
	var mu sync.Mutex
	called := map[string]int{}
	again := make(chan string, rounds)
	ran := make(chan string, rounds)
	h := &hooks.Hooks{}
	h.QuietTick.Init()
	consume(t, c, func(_ context.Context, o *order) error {
		mu.Lock()
		called[o.OrderID]++
		n := called[o.OrderID]
		mu.Unlock()
		if n == 1 {
			ran <- o.OrderID
			return Terminal(errors.New("dead at once"))
		}
		again <- o.OrderID
		return nil
	}, &ConsumeOptions{test: h})
	quiet := func() { // the exception claimer skipped a poll tick: it is quiet
		for within(t, h.QuietTick.C(), "a quiet tick") != "exception rows" {
		}
	}

	var took []time.Duration
	for i := range rounds {
		id := fmt.Sprintf("m-%d", i)
		p, err := s.Produce(ctx, order{OrderID: id}, nil)
		require.NoError(t, err)
		require.Equal(t, id, within(t, ran, "the first run of "+id))
		for redriven := false; !redriven; { // dead once its range committed; then quiet
			quiet()
			redriven, err = c.Redrive(ctx, p.ID)
			require.NoError(t, err)
		}
		at := time.Now()
		require.Equal(t, id, within(t, again, "the redriven run of "+id))
		took = append(took, time.Since(at))
	}
	slices.Sort(took)
	t.Logf("redrive to handler, %d redrives: median %s, max %s", rounds, took[rounds/2].Round(time.Millisecond), took[rounds-1].Round(time.Millisecond))
	require.LessOrEqual(t, took[rounds-1], time.Second, "every redrive is handled within a second")
}

// A Delay's time coming is caught by a timer, not the next poll tick or
// sweep: the second attempt starts within a tenth of a second of its due
// time, with the default poll of a second.
func TestADelayRunsWhenItsTimeComes(t *testing.T) {
	_, s, c := setup(t, nil, "g", 0)
	const delay = 1500 * time.Millisecond
	starts := make(chan time.Time, 2)
	var once sync.Once
	consume(t, c, func(context.Context, *order) error {
		starts <- time.Now()
		var err error
		once.Do(func() { err = Delay(delay) })
		return err
	}, nil)
	_, err := s.Produce(context.Background(), order{OrderID: "later"}, nil)
	require.NoError(t, err)
	first := within(t, starts, "the first attempt")
	second := within(t, starts, "the delayed attempt")
	t.Logf("delayed %s, ran again after %s", delay, second.Sub(first).Round(time.Millisecond))
	require.GreaterOrEqual(t, second.Sub(first), delay)
	require.Less(t, second.Sub(first), delay+100*time.Millisecond+DefaultClaimPollRate/10,
		"the delayed attempt starts when its time comes, not at a poll tick after it")
}

// After a seek, the next session reads from the new position at once: with
// default options, every message a seek to the beginning puts back is
// handled again within a second of Consume starting (the seek is refused
// while an instance is live, so no running claimer can miss it).
func TestASeekIsReadAtOnceByTheNextSession(t *testing.T) {
	ctx := context.Background()
	const n = 5
	e, _, c := setup(t, nil, "g", n)
	seen := make(chan string, 2*n)
	handle := func(_ context.Context, o *order) error { seen <- o.OrderID; return nil }
	first := consume(t, c, handle, nil)
	for range n {
		within(t, seen, "a first run")
	}
	require.NoError(t, first.stop(t))

	g, err := e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	res, err := g.Seek(ctx, SeekBeginning(), nil)
	require.NoError(t, err)
	require.Zero(t, res.After.ID, "before message 1")
	start := time.Now()
	consume(t, c, handle, nil)
	var again []string
	for range n {
		again = append(again, within(t, seen, "a run after the seek"))
	}
	took := time.Since(start)
	t.Logf("%d messages read again %s after Consume started", n, took.Round(time.Millisecond))
	slices.Sort(again)
	require.Equal(t, ids("m", n), again, "every message the seek put back, once")
	require.LessOrEqual(t, took, time.Second, "the next session reads from the new position at once")
}
