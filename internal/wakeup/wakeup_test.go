package wakeup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// canonical renders a round as sorted "stream;keys" strings.
func canonical(round map[int64]*Keys) []string {
	var out []string
	for id, k := range round {
		if k.All {
			out = append(out, fmt.Sprint(id))
			continue
		}
		keys := slices.Clone(k.List)
		slices.Sort(keys)
		out = append(out, fmt.Sprintf("%d;%s", id, strings.Join(keys, " ")))
	}
	slices.Sort(out)
	return out
}

// While one round of wake-ups is being sent, the wake-ups of produces that
// commit meanwhile wait for it and then go out together in one round, merged
// per stream; each call returns only once a round carrying its wake-up has
// been sent.
func TestWakeUpsThatArriveDuringASendGoOutTogether(t *testing.T) {
	ctx := context.Background()
	var c Combiner
	var mu sync.Mutex
	var rounds [][]string
	started, release := make(chan struct{}), make(chan struct{})
	send := func(_ context.Context, round map[int64]*Keys) error {
		mu.Lock()
		first := len(rounds) == 0
		rounds = append(rounds, canonical(round))
		mu.Unlock()
		if first {
			close(started)
			<-release
		}
		return nil
	}
	leader := make(chan error, 1)
	go func() { leader <- c.Wake(ctx, 1, []string{"a"}, send) }()
	<-started

	type call struct {
		stream int64
		keys   []string
	}
	calls := []call{{2, []string{"x"}}, {2, []string{"y", "x"}}, {3, nil}}
	for i := 4; i < 12; i++ {
		calls = append(calls, call{int64(i), []string{fmt.Sprintf("k%d", i)}})
	}
	many := make([]string, 200) // too many keys to list: wakes the whole stream
	for i := range many {
		many[i] = fmt.Sprintf("key.number.%d.of.a.long.batch", i)
	}
	calls = append(calls, call{12, many})
	var wg sync.WaitGroup
	errs := make(chan error, len(calls))
	for _, cl := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- c.Wake(ctx, cl.stream, cl.keys, send) }()
	}
	for c.Pending() < 11 { // streams 2 to 12 queued behind the round in flight
		runtime.Gosched()
	}
	mu.Lock()
	require.Len(t, rounds, 1, "no second round while the first is in flight")
	mu.Unlock()
	close(release)
	require.NoError(t, <-leader)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, rounds, 2, "everything that arrived during the first send went out in one more round")
	require.Equal(t, []string{"1;a"}, rounds[0])
	want := []string{"12", "2;x y", "3;"}
	for i := 4; i < 12; i++ {
		want = append(want, fmt.Sprintf("%d;k%d", i, i))
	}
	slices.Sort(want)
	require.Equal(t, want, rounds[1])
}

// When the leader's send fails, every call whose wake-up rode that round
// gets the error: followers too, not only the leader.
func TestAFailedRoundFailsEveryCallItCarried(t *testing.T) {
	ctx := context.Background()
	var c Combiner
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	calls := 0
	var mu sync.Mutex
	send := func(context.Context, map[int64]*Keys) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			once.Do(func() { close(started) })
			<-release
			return nil
		}
		return errors.New("connection refused")
	}
	first := make(chan error, 1)
	go func() { first <- c.Wake(ctx, 1, nil, send) }()
	<-started
	results := make(chan error, 3)
	for i := range 3 {
		go func() { results <- c.Wake(ctx, int64(10+i), nil, send) }()
	}
	for c.Pending() < 3 {
		runtime.Gosched()
	}
	close(release)
	require.NoError(t, <-first)
	for range 3 {
		require.ErrorContains(t, <-results, "connection refused", "the round's failure reaches every call it carried")
	}
	require.Equal(t, 2, calls, "the three rode one round")
}

// A call whose context ends while it waits returns at once; its wake-up
// rides the next round.
func TestACancelledWaitLeavesItsWakeUpForTheNextRound(t *testing.T) {
	var c Combiner
	started, release := make(chan struct{}), make(chan struct{})
	var rounds [][]string
	var mu sync.Mutex
	send := func(_ context.Context, round map[int64]*Keys) error {
		mu.Lock()
		rounds = append(rounds, canonical(round))
		n := len(rounds)
		mu.Unlock()
		if n == 1 {
			close(started)
			<-release
		}
		return nil
	}
	first := make(chan error, 1)
	go func() { first <- c.Wake(context.Background(), 1, nil, send) }()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, c.Wake(ctx, 2, []string{"late"}, send), context.Canceled)
	close(release)
	require.NoError(t, <-first)
	require.NoError(t, c.Wake(context.Background(), 3, nil, send))
	require.Equal(t, [][]string{{"1;"}, {"2;late", "3;"}}, rounds)
}

func TestKeysCollapseToTheStreamPastTheBound(t *testing.T) {
	var k Keys
	k.Add("a", "", "a", "b")
	require.Equal(t, []string{"a", "b"}, k.List)
	for i := range 200 {
		k.Add(fmt.Sprintf("key.number.%d.of.a.long.batch", i))
	}
	require.True(t, k.All)
	require.Nil(t, k.List)
}
