package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/stretchr/testify/require"
	"github.com/thejerf/suture/v4"
)

type fn func(ctx context.Context) error

func (f fn) Serve(ctx context.Context) error { return f(ctx) }

func TestGuardTurnsAQueryTimeoutIntoARestart(t *testing.T) {
	g := Guard("actor", fn(func(context.Context) error { return context.DeadlineExceeded }), nil, nil)
	err := g.Serve(context.Background())
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "suture would remove the actor for good")
	require.Contains(t, err.Error(), "actor")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Guard("actor", fn(func(context.Context) error { return errors.New("boom") }), nil, nil).Serve(ctx)
	require.ErrorIs(t, err, context.Canceled, "its own cancelled context ends the actor")

	err = Guard("actor", fn(func(context.Context) error { return suture.ErrDoNotRestart }), nil, nil).Serve(context.Background())
	require.ErrorIs(t, err, suture.ErrDoNotRestart)
}

// A panicking actor is restarted by the tree, and the panic is logged.
func TestPanickingActorIsRestarted(t *testing.T) {
	var runs atomic.Int32
	restarted := make(chan struct{})
	sink := &records{}
	sup := New("test", slog.New(sink), nil)
	sup.Add("flaky", fn(func(ctx context.Context) error {
		if runs.Add(1) == 1 {
			panic("first run dies")
		}
		close(restarted)
		<-ctx.Done()
		return ctx.Err()
	}))
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

// attrSink keeps each record's attributes.
type attrSink struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (s *attrSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *attrSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *attrSink) WithGroup(string) slog.Handler            { return s }
func (s *attrSink) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message}
	rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, m)
	return nil
}

//go:noinline
func raiseDeepInTheActor() { panic("a bug") }

// An actor that recovers a panic to salvage its state and re-panics
// (Repanic) has the panic logged once, with the code and the stack of where
// it was raised, bounded; the hooks are told whether it was injected.
func TestAPanicIsLoggedWithTheStackWhereItWasRaised(t *testing.T) {
	sink := &attrSink{}
	var mu sync.Mutex
	var told []string
	h := &hooks.Hooks{Panicked: func(actor string, injected bool) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, fmt.Sprintf("%s %t", actor, injected))
	}}
	salvaging := func(f func()) error {
		defer func() {
			if v := recover(); v != nil {
				Repanic(v) // as the claimers' serve loop does after its salvage
			}
		}()
		f()
		return nil
	}
	err := Guard("bug", fn(func(context.Context) error { return salvaging(raiseDeepInTheActor) }), slog.New(sink), h).Serve(context.Background())
	require.ErrorContains(t, err, "bug panicked: a bug")
	err = Guard("chaos", fn(func(context.Context) error {
		return salvaging(func() { hooks.Inject(hooks.ClaimerClaim) })
	}), slog.New(sink), h).Serve(context.Background())
	require.ErrorContains(t, err, "injected panic at claimer.claim")

	require.Len(t, sink.recs, 2)
	rec := sink.recs[0]
	require.Equal(t, codes.ActorPanicked.ID, rec["code"])
	require.Equal(t, "bug", rec["actor"])
	require.Equal(t, "a bug", rec["panic"])
	require.Contains(t, rec["stack"], "raiseDeepInTheActor", "the stack of where it was raised, not of the re-panic")
	require.LessOrEqual(t, len(rec["stack"]), MaxStack+len("\n... (cut at 8 KiB)"))
	require.Equal(t, []string{"bug false", "chaos true"}, told)
}

func TestAStackIsBoundedTo8KiB(t *testing.T) {
	long := strings.Repeat("frame\n", 3000)
	require.Len(t, bound(long), MaxStack+len("\n... (cut at 8 KiB)"))
	require.Equal(t, "short", bound("short"))
}
