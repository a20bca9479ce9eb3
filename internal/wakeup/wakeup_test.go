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
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
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

// While one round of wake-ups is being sent, the first call whose wake-up
// arrives waits to send the next round; every later one leaves its wake-up
// with it and returns at once. The next round carries them all, merged per
// stream.
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

	waiter := make(chan error, 1)
	go func() { waiter <- c.Wake(ctx, 2, []string{"x"}, send) }()
	for !c.Waiting() {
		runtime.Gosched()
	}
	// Every later call returns before the round in flight is done.
	require.NoError(t, c.Wake(ctx, 2, []string{"y", "x"}, send))
	require.NoError(t, c.Wake(ctx, 3, nil, send))
	for i := 4; i < 12; i++ {
		require.NoError(t, c.Wake(ctx, int64(i), []string{fmt.Sprintf("k%d", i)}, send))
	}
	many := make([]string, 200) // too many keys to list: wakes the whole stream
	for i := range many {
		many[i] = fmt.Sprintf("key.number.%d.of.a.long.batch", i)
	}
	require.NoError(t, c.Wake(ctx, 12, many, send))
	require.Equal(t, 11, c.Pending(), "streams 2 to 12 wait for the next round")
	mu.Lock()
	require.Len(t, rounds, 1, "no second round while the first is in flight")
	mu.Unlock()
	select {
	case err := <-waiter:
		t.Fatalf("the waiting call returned before sending its round: %v", err)
	default:
	}
	close(release)
	require.NoError(t, <-leader)
	require.NoError(t, <-waiter)
	require.Len(t, rounds, 2, "everything that arrived during the first send went out in one more round")
	require.Equal(t, []string{"1;a"}, rounds[0])
	want := []string{"12", "2;x y", "3;"}
	for i := 4; i < 12; i++ {
		want = append(want, fmt.Sprintf("%d;k%d", i, i))
	}
	slices.Sort(want)
	require.Equal(t, want, rounds[1])
	require.Zero(t, c.Pending())
}

// A failed round's error reaches the call that sent it; the calls that left
// their wake-ups with it have returned already.
func TestAFailedRoundReachesTheCallThatSentIt(t *testing.T) {
	ctx := context.Background()
	var c Combiner
	started, release := make(chan struct{}), make(chan struct{})
	calls := 0
	var mu sync.Mutex
	send := func(context.Context, map[int64]*Keys) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			close(started)
			<-release
			return nil
		}
		return errors.New("connection refused")
	}
	first := make(chan error, 1)
	go func() { first <- c.Wake(ctx, 1, nil, send) }()
	<-started
	waiter := make(chan error, 1)
	go func() { waiter <- c.Wake(ctx, 10, nil, send) }()
	for !c.Waiting() {
		runtime.Gosched()
	}
	require.NoError(t, c.Wake(ctx, 11, nil, send))
	require.NoError(t, c.Wake(ctx, 12, nil, send))
	close(release)
	require.NoError(t, <-first)
	require.ErrorContains(t, <-waiter, "connection refused", "the round's failure reaches the call that sent it")
	require.Equal(t, 2, calls, "the three rode one round")
}

// A waiting call whose context ends returns at once; its wake-up and those
// left with it are sent by the call in flight when it finishes.
func TestACancelledWaitLeavesItsWakeUpsToTheCallInFlight(t *testing.T) {
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
	waiter := make(chan error, 1)
	go func() { waiter <- c.Wake(ctx, 2, []string{"late"}, send) }()
	for !c.Waiting() {
		runtime.Gosched()
	}
	require.NoError(t, c.Wake(context.Background(), 3, nil, send), "left with the waiting call")
	cancel()
	require.ErrorIs(t, <-waiter, context.Canceled)
	require.False(t, c.Waiting())
	close(release)
	require.NoError(t, <-first)
	require.Equal(t, [][]string{{"1;"}, {"2;late", "3;"}}, rounds, "the call in flight sent what the cancelled one left")
}

// After a round, the next one waits PerMessage for each message the last
// one carried, at most MaxHoldOff; a wake-up after the hold-off goes out at
// once. The calls that arrive meanwhile ride one round.
func TestARoundHoldsTheNextOneOffPerMessage(t *testing.T) {
	ctx := context.Background()
	clk := clocks.NewMock()
	c := Combiner{Clock: clk, PerMessage: 100 * time.Microsecond}
	var mu sync.Mutex
	var rounds [][]string
	send := func(_ context.Context, round map[int64]*Keys) error {
		mu.Lock()
		defer mu.Unlock()
		rounds = append(rounds, canonical(round))
		return nil
	}
	sent := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(rounds)
	}
	batch := func(n int) []string { return make([]string, n) } // n messages without routing keys

	require.NoError(t, c.Wake(ctx, 1, batch(30), send), "nothing before it: sent at once")
	require.Equal(t, 1, sent())
	waiter := make(chan error, 1)
	go func() { waiter <- c.Wake(ctx, 2, batch(1), send) }()
	for !c.Waiting() {
		runtime.Gosched()
	}
	require.NoError(t, c.Wake(ctx, 3, batch(1), send), "left with the waiting call")
	clk.Add(2999 * time.Microsecond)
	require.Equal(t, 1, sent(), "30 messages hold the next round off for 3 ms")
	clk.Add(time.Microsecond)
	require.NoError(t, <-waiter)
	require.Equal(t, [][]string{{"1;"}, {"2;", "3;"}}, rounds)

	clk.Add(200 * time.Microsecond) // past the 2 messages' hold-off
	require.NoError(t, c.Wake(ctx, 4, batch(5000), send), "after the hold-off: sent at once")
	require.Equal(t, 3, sent())
	go func() { waiter <- c.Wake(ctx, 5, batch(1), send) }()
	for !c.Waiting() {
		runtime.Gosched()
	}
	clk.Add(MaxHoldOff - time.Microsecond)
	require.Equal(t, 3, sent(), "5,000 messages hold it off for MaxHoldOff")
	clk.Add(time.Microsecond)
	require.NoError(t, <-waiter, "the hold-off is at most MaxHoldOff")
	require.Equal(t, 4, sent())
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
