package sqlstreams

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// A graceful stop while the database is down ends when the work does:
// handlers that honour their context finish what they hold, nothing can be
// committed or handed back, and Consume returns within 2 s of the last
// handler's end (what settled is kept for the consumer's next session), far
// inside Kubernetes' 30 s grace, logging what is really pending, not
// "handlers still running". Before, it retried its hand-back until
// ShutdownTimeout plus the grace (34 s), with default options.
func TestAStopWithTheDatabaseDownEndsWhenTheHandlersDo(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	e.produceN(s, "m", 50)
	var mu sync.Mutex
	var lastEnd time.Time
	running := make(chan struct{}, 50)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, func(ctx context.Context, o *order) error {
			running <- struct{}{}
			work := time.NewTimer(3 * time.Second) // the handler's work
			defer work.Stop()
			defer func() {
				mu.Lock()
				lastEnd = time.Now()
				mu.Unlock()
			}()
			select {
			case <-work.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, nil)
	}()
	for range DefaultMessageConcurrency {
		within(t, running, "a full pool of handlers")
	}
	pgtest.StopFor(t, "fast")
	cancelled := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Consume did not return within a minute of its context ending")
	}
	returned := time.Now()
	mu.Lock()
	last := lastEnd
	mu.Unlock()
	t.Logf("cancelled; the last handler ended %s later, Consume returned %s later",
		last.Sub(cancelled).Round(time.Millisecond), returned.Sub(cancelled).Round(time.Millisecond))
	for _, r := range e.logs.Records() {
		t.Logf("%s %s %s", r.Time.Sub(cancelled).Round(time.Millisecond), r.Level, r.Message)
	}
	require.LessOrEqual(t, returned.Sub(last), 2*time.Second, "Consume returns within 2 s of its last handler's end")
	for _, r := range e.logs.RecordsWith(codes.ShutdownTimeout.ID) {
		t.Errorf("logged %q while no handler was running", r)
	}
	require.Contains(t, strings.Join(e.logs.Messages(slog.LevelWarn), "\n"), "could not hand", "the log says what is left for the next session")
}
