package sqlstreams

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// An outage is logged twice a session, whatever its actors do meanwhile:
// one SQL0101 line when the session's first actor fails to reach the
// database, one when an actor reaches it again, with the outage's length.
// Three sessions (each its own client and log) work through a backlog with
// keyed and failing messages when PostgreSQL stops for a few seconds; every
// message is handled once it is back. Before, each actor logged its own
// outage, and the claimers logged one again after every step that made no
// store call (an outcome, a full queue) counted as a recovery: hundreds of
// lines an outage.
func TestAnOutageIsLoggedTwiceASession(t *testing.T) {
	skipOutageWhenShort(t)
	ctx := context.Background()
	const n = 900
	down := 3 * time.Second
	if v := os.Getenv("SQLSTREAMS_OUTAGE"); v != "" { // a longer outage: SQLSTREAMS_OUTAGE=30s
		var err error
		down, err = time.ParseDuration(v)
		require.NoError(t, err, "SQLSTREAMS_OUTAGE")
	}
	retry := Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	first := newEnv(t, &ClientConfig{Retry: retry})
	s := first.stream("orders")
	_, err := s.Consumer("g").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	items := make([]BatchItem[order], n)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("m-%d", i), Amount: i}}
		if i%2 == 1 {
			items[i].Key, items[i].Message = fmt.Sprintf("k%d", i%7), &MessageOptions{Concurrency: Exclusive}
		}
	}
	_, err = s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)

	sinks := []*actortest.Logs{first.logs}
	clients := []*Client{first.client}
	for range 2 {
		sink := actortest.NewLogs(t)
		client, err := NewClient(ctx, first.pool, &ClientConfig{Schema: first.client.Schema(), Logger: slog.New(sink), Retry: retry})
		require.NoError(t, err)
		sinks, clients = append(sinks, sink), append(clients, client)
	}
	got := newHandledSet()
	var failed sync.Map
	var sessions []*session
	for _, client := range clients {
		c, err := Stream[order](client, "orders").Consumer("g").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond})
		require.NoError(t, err)
		sessions = append(sessions, consume(t, c, func(ctx context.Context, o *order) error {
			if _, again := failed.LoadOrStore(o.OrderID, true); o.Amount%10 == 0 && !again {
				return fmt.Errorf("fails once")
			}
			work := time.NewTimer(2 * time.Millisecond) // the handler's work
			defer work.Stop()
			select {
			case <-work.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			got.add(o.OrderID)
			return nil
		}, &ConsumeOptions{BatchLimit: 20, ClaimPollRate: 20 * time.Millisecond, InstanceTTL: 2 * time.Second}))
	}
	within(t, got.fresh, "the sessions at work")

	start := pgtest.StopFor(t, "fast")
	outage := time.NewTimer(down) // the outage's length (a deliberate pause of the database, not a wait for work)
	<-outage.C
	start()
	got.waitAll(t, ids("m", n))
	for _, sess := range sessions {
		require.NoError(t, sess.stop(t))
	}

	for i, sink := range sinks {
		var lines []slog.Record
		for _, r := range sink.Records() {
			if code(r) == codes.StoreOutage.ID {
				lines = append(lines, r)
			}
		}
		var msgs []string
		for _, r := range lines {
			msgs = append(msgs, r.Message)
		}
		t.Logf("session %d: %d SQL0101 lines: %q", i, len(lines), msgs)
		require.NotEmpty(t, lines, "session %d: the outage is logged", i)
		require.LessOrEqual(t, len(lines), 2, "session %d: one line when the outage begins, one when it ends", i)
		require.Contains(t, lines[0].Message, "cannot reach the database")
		if len(lines) == 2 {
			require.Contains(t, lines[1].Message, "reached the database again")
			require.NotEmpty(t, attr(lines[1], "outage"), "the end says how long the outage lasted")
		}
	}
}

// code returns a record's code attribute ("" if none).
func code(r slog.Record) string { return attr(r, "code") }

// attr returns a record's attribute key as text ("" if absent).
func attr(r slog.Record, key string) string {
	v := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}
