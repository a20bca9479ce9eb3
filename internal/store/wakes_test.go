package store

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// While one round of wake-ups is being sent, the wake-ups of produces that
// commit meanwhile wait for it and then go out together in one round, merged
// per stream; each call returns only once a round carrying its wake-up has
// been sent.
func TestWakeCombinerMergesWakeUpsThatArriveDuringASend(t *testing.T) {
	ctx := context.Background()
	var w wakeCombiner
	var mu sync.Mutex
	var rounds [][]string
	started, release := make(chan struct{}), make(chan struct{})
	// Payloads with their keys sorted: calls of one stream merge in whatever
	// order they arrived.
	canonical := func(payloads []string) []string {
		out := make([]string, len(payloads))
		for i, p := range payloads {
			id, keys, _ := strings.Cut(p, ";")
			if !strings.Contains(p, ";") {
				out[i] = p
				continue
			}
			k := strings.Fields(keys)
			slices.Sort(k)
			out[i] = id + ";" + strings.Join(k, " ")
		}
		slices.Sort(out)
		return out
	}
	send := func(_ context.Context, payloads []string) error {
		mu.Lock()
		first := len(rounds) == 0
		p := canonical(payloads)
		rounds = append(rounds, p)
		mu.Unlock()
		if first {
			close(started)
			<-release
		}
		return nil
	}
	sentBy := func(payload string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rounds {
			if slices.Contains(r, payload) {
				return true
			}
		}
		return false
	}

	leader := make(chan error, 1)
	go func() { leader <- w.wake(ctx, 1, []NewMessage{{RoutingKey: "a"}}, send) }()
	<-started

	type call struct {
		stream int64
		keys   []string
	}
	calls := []call{{2, []string{"x"}}, {2, []string{"y", "x"}}, {3, nil}}
	for i := 4; i < 12; i++ {
		calls = append(calls, call{int64(i), []string{fmt.Sprintf("k%d", i)}})
	}
	many := make([]NewMessage, 200) // too many keys to list: wakes the whole stream
	for i := range many {
		many[i].RoutingKey = fmt.Sprintf("key.number.%d.of.a.long.batch", i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(calls)+1)
	for _, c := range calls {
		msgs := make([]NewMessage, len(c.keys))
		for i, k := range c.keys {
			msgs[i].RoutingKey = k
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs <- w.wake(ctx, c.stream, msgs, send) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs <- w.wake(ctx, 12, many, send) }()
	// Every call has queued its wake-up behind the round in flight.
	for {
		w.mu.Lock()
		queued := len(w.pending)
		w.mu.Unlock()
		if queued == 11 { // streams 2 to 12
			break
		}
		runtime.Gosched()
	}
	require.Len(t, rounds, 1, "no second round while the first is in flight")
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
	for _, p := range want {
		require.True(t, sentBy(p))
	}
	for _, p := range rounds[1] {
		_, err := ParseWake(p)
		require.NoError(t, err, p)
		require.False(t, strings.Contains(p, "key.number"), "an overlong key list collapses to the stream")
	}

	// A send's failure reaches the call that led the round.
	err := w.wake(ctx, 1, nil, func(context.Context, []string) error { return fmt.Errorf("connection refused") })
	var wakeErr *WakeError
	require.ErrorAs(t, err, &wakeErr)
}
