package sqlstreams

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A produce wakes an idle consumer through the listener, not its poll: the
// poll here is an hour. When the listening connection is killed, the hub
// says so, reconnects, and wake-ups resume.
func TestProduceWakesIdleConsumerAndListenerReconnects(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	listening := make(chan uint32, 4)
	e.client.hub.OnListen = func(pid uint32) { listening <- pid }
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

	lost := e.logs.next("notification listener lost its connection")
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
