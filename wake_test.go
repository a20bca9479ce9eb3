package sqlstreams

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/stretchr/testify/require"
)

// hubHooks gives the client's wake-up hub test hooks whose Listening
// signal delivers, before anything subscribes.
func hubHooks(e *env) *hooks.Hub {
	hk := hooks.NewHub()
	e.client.engine.Hub().SetHooks(hk)
	return hk
}

// A produce wakes an idle consumer through the listener, not its poll: the
// poll here is an hour. When the listening connection is killed, the hub
// says so, reconnects, and wake-ups resume.
func TestProduceWakesIdleConsumerAndListenerReconnects(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	listening := hubHooks(e).Listening.C()
	got := make(chan string, 4)
	ready := NewReadiness()
	consume(t, c, func(_ context.Context, o *order) error { got <- o.OrderID; return nil },
		&ConsumeOptions{ClaimPollRate: time.Hour, Readiness: ready})
	pid := within(t, listening, "the listener")
	within(t, ready.Done(), "the session to consume")

	_, err := s.Produce(ctx, order{OrderID: "first"}, nil)
	require.NoError(t, err)
	require.Equal(t, "first", within(t, got, "the first message"))
	_, err = s.Produce(ctx, order{OrderID: "second"}, nil)
	require.NoError(t, err)
	require.Equal(t, "second", within(t, got, "a message produced while the claimer idles"))

	lost := e.logs.Next("notification listener lost its connection")
	var killed bool
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&killed))
	require.True(t, killed)
	within(t, lost, "the listener to notice")
	newPID := within(t, listening, "the listener to reconnect")
	require.NotEqual(t, pid, newPID)
	_, err = s.Produce(ctx, order{OrderID: "third"}, nil)
	require.NoError(t, err)
	require.Equal(t, "third", within(t, got, "a message after the reconnect"))
}

// A produce wakes a group with bindings only when one of its routing keys
// matches them; a group without bindings wakes on every produce, and so
// does every group when a batch's keys are too many to list.
func TestWakeSkipsGroupsWhoseBindingsMatchNoKey(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	listening := hubHooks(e).Listening.C()
	boundWakes, stopBound := e.client.engine.Hub().Subscribe(c.group.StreamID, c.group.ID, []string{"orders.hit"})
	bound := boundWakes.Ranges
	defer stopBound()
	allWakes, stopAll := e.client.engine.Hub().Subscribe(c.group.StreamID, c.group.ID+1, nil)
	all := allWakes.Ranges
	defer stopAll()
	within(t, listening, "the listener")
	within(t, bound, "the bound subscriber's wake-up when the listener came up") // it wakes before it signals
	within(t, all, "the unbound subscriber's wake-up when the listener came up")

	_, err := s.Produce(ctx, order{OrderID: "miss"}, &ProduceOptions{RoutingKey: "orders.miss"})
	require.NoError(t, err)
	within(t, all, "the unbound subscriber's wake-up")
	require.Empty(t, bound, "one notification wakes both subscribers at once or neither: the bound one matched nothing")
	_, err = s.Produce(ctx, order{OrderID: "none"}, nil)
	require.NoError(t, err)
	within(t, all, "the unbound subscriber's wake-up")
	require.Empty(t, bound, "a message without a routing key matches no binding")

	_, err = s.Produce(ctx, order{OrderID: "hit"}, &ProduceOptions{RoutingKey: "orders.hit"})
	require.NoError(t, err)
	within(t, bound, "the bound subscriber's wake-up")
	within(t, all, "the unbound subscriber's wake-up")

	items := make([]BatchItem[order], 200) // 200 distinct keys do not fit a notification
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprint(i)}, RoutingKey: fmt.Sprintf("orders.miss.key-number-%d", i)}
	}
	_, err = s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)
	within(t, bound, "a wake-up without the key list wakes every group")
	within(t, all, "the unbound subscriber's wake-up")
}

// A listener that stops hearing notifications without its connection
// failing (one that died without a reset reaching the client) is found by
// its own pings and replaced, and every session is woken: quiet claimers
// rely on it (decision 0040).
func TestAListenerThatHearsNothingIsReplaced(t *testing.T) {
	e, _, c := setup(t, nil, "g", 0)
	hub := e.client.engine.Hub()
	hk := hooks.NewHub()
	hk.Check = 50 * time.Millisecond
	hub.SetHooks(hk)
	listening := hk.Listening.C()
	wakes, stop := hub.Subscribe(c.group.StreamID, c.group.ID, nil)
	woken := wakes.Ranges
	defer stop()
	first := within(t, listening, "the listener")
	within(t, woken, "the wake-up when the listener came up") // it wakes before it signals
	hk.Deaf.Store(true)
	second := within(t, listening, "a new listener, after its pings went unheard")
	require.NotEqual(t, first, second, "a new connection")
	hk.Deaf.Store(false)
	within(t, woken, "every session woken after the reconnect")
	require.Contains(t, strings.Join(e.logs.Messages(slog.LevelWarn), "\n"), "notification listener lost")
}

// A listener that comes up wakes every session subscribed by then, the
// first time as after a reconnect: a session subscribes, then probes its
// stream while the hub connects, and a produce that commits between that
// probe and the LISTEN is never notified. A quiet session (decision 0038)
// would leave it for its backstop sweep, minutes later.
func TestAListenerWakesEverySessionWhenItComesUp(t *testing.T) {
	e, _, c := setup(t, nil, "g", 0)
	hub := e.client.engine.Hub()
	listening := hubHooks(e).Listening.C()
	wakes, stop := hub.Subscribe(c.group.StreamID, c.group.ID, nil)
	woken := wakes.Ranges
	defer stop()
	within(t, listening, "the listener")
	within(t, woken, "the session woken when the listener came up")
}

// Batched produces one right after another: each one's wake-up waits out
// the hold-off of the round before it (decision 0044) and still reaches the
// consumer.
func TestAHeldOffWakeUpStillArrives(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	listening := hubHooks(e).Listening.C()
	wakes, stop := e.client.engine.Hub().Subscribe(c.group.StreamID, c.group.ID, nil)
	woken := wakes.Ranges
	defer stop()
	within(t, listening, "the listener")
	within(t, woken, "the wake-up when the listener came up") // it wakes before it signals
	items := make([]BatchItem[order], 100)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprint(i)}}
	}
	for batch := range 3 {
		_, err := s.ProduceBatch(ctx, items, nil)
		require.NoError(t, err)
		within(t, woken, fmt.Sprintf("the wake-up of batch %d", batch))
	}
}
