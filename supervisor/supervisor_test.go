package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/thejerf/suture/v4"
)

type fn func(ctx context.Context) error

func (f fn) Serve(ctx context.Context) error { return f(ctx) }

func TestGuardTurnsAQueryTimeoutIntoARestart(t *testing.T) {
	g := Guard("actor", fn(func(context.Context) error { return context.DeadlineExceeded }))
	err := g.Serve(context.Background())
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "suture would remove the actor for good")
	require.Contains(t, err.Error(), "actor")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Guard("actor", fn(func(context.Context) error { return errors.New("boom") })).Serve(ctx)
	require.ErrorIs(t, err, context.Canceled, "its own cancelled context ends the actor")

	err = Guard("actor", fn(func(context.Context) error { return suture.ErrDoNotRestart })).Serve(context.Background())
	require.ErrorIs(t, err, suture.ErrDoNotRestart)
}

// A panicking actor is restarted by the tree, and the panic is logged.
func TestPanickingActorIsRestarted(t *testing.T) {
	var runs atomic.Int32
	restarted := make(chan struct{})
	sink := &records{}
	sup := New("test", slog.New(sink))
	sup.Add(Guard("flaky", fn(func(ctx context.Context) error {
		if runs.Add(1) == 1 {
			panic("first run dies")
		}
		close(restarted)
		<-ctx.Done()
		return ctx.Err()
	})))
	ctx, cancel := context.WithCancel(context.Background())
	done := sup.ServeBackground(ctx)
	<-restarted
	cancel()
	<-done
	require.EqualValues(t, 2, runs.Load())
	require.Contains(t, sink.msgs(), "actor panicked; restarting")
}

type records struct {
	mu atomic.Pointer[[]string]
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	for {
		old := r.mu.Load()
		var next []string
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, rec.Message)
		if r.mu.CompareAndSwap(old, &next) {
			return nil
		}
	}
}
func (r *records) msgs() []string {
	if p := r.mu.Load(); p != nil {
		return *p
	}
	return nil
}
