package sqlstreams

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An application whose group an operator manages attaches to it: its
// initial config is declared when the group is created, and afterwards the
// operator's declaration stays, however often the application starts
// (issue 60: a Register with nil silently reverted `groups declare`).
func TestAttachKeepsAnOperatorsConfig(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	initial := &ConsumerConfig{Message: &MessageOptions{Timeout: 10 * time.Second}, Bindings: []string{"orders.#"}}
	c, err := s.Consumer("billing").Attach(ctx, initial)
	require.NoError(t, err)
	in, err := c.Inspect(ctx)
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, in.Config.Message.Timeout, "a new group gets the initial config")
	require.Equal(t, []string{"orders.#"}, in.Config.Bindings)

	g, err := e.client.Group(ctx, "orders", "billing")
	require.NoError(t, err)
	_, err = g.Declare(ctx, ConsumerConfig{Message: &MessageOptions{Timeout: time.Minute}})
	require.NoError(t, err)
	declared, err := g.Inspect(ctx)
	require.NoError(t, err)
	warned := len(e.logs.Messages(slog.LevelWarn))

	for range 2 { // the application restarts, twice
		_, err := s.Consumer("billing").Attach(ctx, initial)
		require.NoError(t, err)
	}
	after, err := g.Inspect(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Minute, after.Config.Message.Timeout, "the operator's declaration stays")
	require.Len(t, after.Log, len(declared.Log), "nothing was declared")
	require.Len(t, e.logs.Messages(slog.LevelWarn), warned, "no SQL0059: nothing changed")

	// Register, by contrast, declares what it is given.
	_, err = s.Consumer("billing").Register(ctx, initial)
	require.NoError(t, err)
	reverted, err := g.Inspect(ctx)
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, reverted.Config.Message.Timeout)
}

// Attach declares the application's binding set as Register does: an
// attached session consumes what its bindings match.
func TestAttachedGroupConsumesWithItsBindings(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	c, err := s.Consumer("eu").Attach(ctx, &ConsumerConfig{Bindings: []string{"orders.eu.#"}})
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "us"}, &ProduceOptions{RoutingKey: "orders.us.ny"})
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "eu"}, &ProduceOptions{RoutingKey: "orders.eu.fr"})
	require.NoError(t, err)
	got := make(chan string, 2)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, func(_ context.Context, o *order) error { got <- o.OrderID; return nil },
			&ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	require.Equal(t, "eu", within(t, got, "the matching message"))
	cancel()
	require.NoError(t, <-done)
	require.Empty(t, got, "only the matching message")
}
