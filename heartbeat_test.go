package sqlstreams

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// A session's two heartbeats each renew the leases their own claimer
// takes (decision 0042): the range claimer's beats its ranges, the
// exception claimer's the retries it runs. Handlers that outlive their
// lease, one in a range and one in a retry, keep both leases.
func TestEachHeartbeatRenewsItsOwnClaimersLeases(t *testing.T) {
	ctx := context.Background()
	const ttl = 3 * time.Second // a beat every second
	client, counter := countingClient(t, "", 0)
	e := &env{t: t, client: client, logs: actortest.NewLogs(t)}
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Start: StartBeginning, ExceptionInitialBackoff: time.Millisecond})
	require.NoError(t, err)

	release := make(chan struct{})
	started := make(chan string, 4)
	var failed atomic.Bool
	handler := func(hctx context.Context, o *order) error {
		if o.OrderID == "retried" && failed.CompareAndSwap(false, true) {
			return errors.New("the first attempt fails")
		}
		started <- o.OrderID
		select {
		case <-release:
			return nil
		case <-hctx.Done():
			return hctx.Err()
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, handler, &ConsumeOptions{InstanceTTL: ttl, BatchLimit: 1})
	}()
	_, err = s.Produce(ctx, order{OrderID: "held"}, nil)
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "retried"}, nil)
	require.NoError(t, err)
	running := map[string]bool{}
	for len(running) < 2 {
		running[within(t, started, "both handlers to be running")] = true
	}
	require.True(t, running["held"] && running["retried"], "running: %v", running)

	// Two beats of each heartbeat after both began.
	renewals := counter.Snapshot()["store.RenewLeases"]
	within(t, counter.When("store.RenewLeases", renewals+4), "four lease renewals")
	ranges, exceptions, err := storetest.LeaseLengths(ctx, client.store, c.group.StreamID)
	require.NoError(t, err)
	require.Len(t, ranges, 1, "the held message's range")
	require.Len(t, exceptions, 1, "the retry")
	require.Greater(t, ranges[0], ttl, "the range's lease was renewed after its claim")
	require.Greater(t, exceptions[0], ttl, "the retry's lease was renewed after its claim")

	close(release)
	cancel()
	require.NoError(t, within(t, done, "Consume to return"))
}
