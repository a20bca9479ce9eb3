package outage

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

type sink struct {
	mu   sync.Mutex
	msgs []string
}

func (s *sink) Enabled(context.Context, slog.Level) bool { return true }
func (s *sink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, r.Message)
	return nil
}
func (s *sink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *sink) WithGroup(string) slog.Handler      { return s }

func TestReportsOncePerOutageAndBacksOff(t *testing.T) {
	s := &sink{}
	r := &Reporter{Logger: slog.New(s), What: "claim", Retry: "with backoff",
		Backoff: backoff.Backoff{Policy: backoff.Policy{Initial: 100 * time.Millisecond, Max: time.Second}}}
	ctx := context.Background()
	down := &pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"} // a busy server
	var waits []time.Duration
	for range 5 {
		waits = append(waits, r.Report(ctx, down))
	}
	require.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, time.Second}, waits, "the wait doubles up to Max")
	require.Zero(t, r.Report(ctx, nil))
	require.Zero(t, r.Report(ctx, nil))
	require.Equal(t, 100*time.Millisecond, r.Report(ctx, down), "a success resets the backoff")
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	require.Zero(t, r.Report(stopped, errors.New("context canceled")), "the actor's own stop is no outage")
	require.Equal(t, []string{"claim failed; retrying with backoff", "claim recovered", "claim failed; retrying with backoff"}, s.msgs)
}

// A server out of reach (refused connections, shutting down, starting up)
// is retried at least every UnreachableRetry, however long the outage: a
// refused connection costs it nothing, and each second an actor waits
// after it is back is work left unrecorded.
func TestAnUnreachableServerIsRetriedSoon(t *testing.T) {
	r := &Reporter{Logger: slog.New(&sink{}), What: "claim", Retry: "with backoff",
		Backoff: backoff.Backoff{Policy: backoff.Policy{Initial: 50 * time.Millisecond, Max: 5 * time.Second}}}
	ctx := context.Background()
	var waits []time.Duration
	for _, err := range []error{&pgconn.PgError{Code: "57P01"}, &pgconn.ConnectError{}, &pgconn.ConnectError{},
		&pgconn.PgError{Code: "57P03"}, &pgconn.ConnectError{}, &pgconn.PgError{Code: "53300"}} {
		waits = append(waits, r.Report(ctx, err))
	}
	require.Equal(t, []time.Duration{50 * time.Millisecond, UnreachableRetry, UnreachableRetry, UnreachableRetry, UnreachableRetry,
		1600 * time.Millisecond}, waits, "capped while out of reach; a busy server's error keeps the doubled backoff")
}

// A permanent error goes to the session's health (which ends the session
// with it) and is not logged: Consume returns it.
func TestPermanentErrorsReachTheSessionNotTheLog(t *testing.T) {
	s := &sink{}
	h := NewHealth(clocks.NewMock(), time.Second)
	r := &Reporter{Logger: slog.New(s), What: "claim", Health: h}
	missing := &pgconn.PgError{Code: "42P01", Message: `relation "x.stream_1_range" does not exist`}
	r.Report(context.Background(), missing)
	r.Report(context.Background(), missing)
	select {
	case err := <-h.Fatal():
		require.ErrorContains(t, err, "42P01")
		require.ErrorContains(t, err, "sqlstreams migrate")
	default:
		t.Fatal("the permanent error did not reach the session")
	}
	require.Empty(t, s.msgs)

	// Without a session to end (the manager), it is logged once per outage.
	r2 := &Reporter{Logger: slog.New(s), What: "retention", Retry: "with backoff"}
	r2.Report(context.Background(), missing)
	r2.Report(context.Background(), missing)
	require.Equal(t, []string{"retention failed; retrying with backoff"}, s.msgs[:1])
	require.Len(t, s.msgs, 1)
}

// Health is ready while consuming and no reporter has failed for its TTL or
// longer; its watchers hear of each change, the TTL boundary included.
func TestHealthIsALevel(t *testing.T) {
	mock := clocks.NewMock()
	h := NewHealth(mock, 10*time.Second)
	defer h.Close()
	changes := make(chan struct{}, 16)
	stop := h.Watch(func() { changes <- struct{}{} })
	defer stop()
	require.False(t, h.Ready(), "not consuming yet")
	h.SetConsuming(true)
	<-changes
	require.True(t, h.Ready())

	r := &Reporter{What: "heartbeat", Health: h}
	r.Report(context.Background(), errors.New("connection refused"))
	mock.Add(9 * time.Second)
	require.True(t, h.Ready(), "an outage shorter than the TTL keeps it ready")
	mock.Add(time.Second)
	<-changes // the TTL boundary's timer
	require.False(t, h.Ready(), "failing for the TTL: not ready")
	r.Report(context.Background(), nil)
	<-changes
	require.False(t, h.Ready(), "back, but the incarnation may have lapsed meanwhile")
	h.Confirm()
	<-changes
	require.True(t, h.Ready(), "a heartbeat found its row live")

	// An outage shorter than the TTL needs no confirmation.
	r.Report(context.Background(), errors.New("connection refused"))
	mock.Add(5 * time.Second)
	r.Report(context.Background(), nil)
	<-changes
	require.True(t, h.Ready())

	// After one of the TTL, a new incarnation is ready as it begins.
	r.Report(context.Background(), errors.New("connection refused"))
	mock.Add(10 * time.Second)
	<-changes
	r.Report(context.Background(), nil)
	<-changes
	require.False(t, h.Ready())
	h.SetConsuming(false)
	h.SetConsuming(true)
	require.True(t, h.Ready(), "a new incarnation")
	h.SetConsuming(false)
	require.False(t, h.Ready())
}

// Reached closes at the next store call of any actor of the session that
// succeeds, once per wait: an actor backing off after an outage waits on it
// and retries as soon as the database answers someone.
func TestReachedClosesAtTheNextSuccess(t *testing.T) {
	h := NewHealth(clocks.NewMock(), time.Minute)
	defer h.Close()
	ctx := context.Background()
	down := &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}
	claimer := &Reporter{What: "claimer store call", Health: h}
	beat := &Reporter{What: "heartbeat", Health: h}
	require.Positive(t, claimer.Report(ctx, down))
	require.Positive(t, beat.Report(ctx, down))
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	waiting := h.Reached()
	require.False(t, closed(waiting), "closed while every actor still fails")
	require.Positive(t, beat.Report(ctx, down))
	require.False(t, closed(waiting), "a failure ends no wait")
	require.Zero(t, beat.Report(ctx, nil)) // the heartbeat reaches the database
	require.True(t, closed(waiting), "the heartbeat reached the database")
	again := h.Reached()
	require.False(t, closed(again), "a later wait ends only at a later success")
	require.Zero(t, beat.Report(ctx, nil)) // a success that recovered nothing still proves the database reachable
	require.True(t, closed(again))
	var none *Health
	require.Nil(t, none.Reached())
}

// A session logs an outage twice, whatever its actors report meanwhile: once
// when its first actor fails (SQL0101, naming it), once when one reaches the
// database again, with the outage's length. A result with no store call
// behind it (Reached did not move) is neither a failure nor a recovery.
func TestASessionLogsAnOutageTwice(t *testing.T) {
	ctx := context.Background()
	s := &sink{}
	clk := clocks.NewMock()
	h := NewHealth(clk, time.Minute)
	var claims, beats atomic.Uint64
	claimer := &Reporter{Logger: slog.New(s), What: "claimer store call", Retry: "with backoff", Health: h, Reached: claims.Load}
	beat := &Reporter{Logger: slog.New(s), What: "heartbeat", Retry: "with backoff", Health: h, Reached: beats.Load}
	manager := &Reporter{Logger: slog.New(s), What: "manager", Retry: "every heartbeat", Outages: h.Outages()}
	down := &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}

	claimer.Report(ctx, down)
	beat.Report(ctx, down)
	manager.Report(ctx, down)
	for range 10 {
		claimer.Report(ctx, nil) // an outcome that made no store call
		beat.Report(ctx, nil)    // a beat with nothing to renew
		claimer.Report(ctx, down)
	}
	require.True(t, claimer.Failing(), "no store call reached the database")
	clk.Add(3 * time.Second)
	claims.Add(1) // a claim that reached it
	claimer.Report(ctx, nil)
	require.False(t, claimer.Failing())
	beats.Add(1)
	beat.Report(ctx, nil)
	manager.Report(ctx, nil)
	require.Equal(t, []string{
		"session cannot reach the database: claimer store call failed; its actors retry with backoff",
		"session reached the database again after an outage",
	}, s.msgs)
}

// The level turns not ready once the session has not reached its database
// for the TTL, counted from its last successful store call, not from the
// first call that failed: a heartbeat renews every third of the TTL, so
// the first failure can come that long into an outage (issue 60: not
// ready 6–12 s into an outage with an InstanceTTL of 5 s).
func TestHealthTurnsWithinTheTTLOfTheLastSuccess(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	h := NewHealth(mock, 5*time.Second)
	defer h.Close()
	changes := make(chan struct{}, 16)
	stop := h.Watch(func() { changes <- struct{}{} })
	defer stop()
	h.SetConsuming(true)
	<-changes
	ctx := context.Background()
	heartbeat := &Reporter{What: "heartbeat", Health: h}
	claimer := &Reporter{What: "claim", Health: h}
	heartbeat.Report(ctx, nil) // a renewal: the database answered
	mock.Add(5 * time.Second / 3)
	heartbeat.Report(ctx, errors.New("connection refused")) // the next one, into the outage
	mock.Add(5*time.Second - 5*time.Second/3 - time.Millisecond)
	require.True(t, h.Ready(), "reached within the TTL")
	mock.Add(time.Millisecond)
	require.False(t, h.Ready(), "the TTL since the database last answered: not ready")
	told, cancel := context.WithTimeout(ctx, 10*time.Second) // a bound on the timer's goroutine, not a wait for time to pass
	defer cancel()
	select {
	case <-changes: // the watchers heard of it
	case <-told.Done():
		t.Fatal("the watchers were not told at the TTL boundary")
	}

	// A failure long after the last success turns it not ready at once.
	heartbeat.Report(ctx, nil)
	h.Confirm()
	mock.Add(time.Minute) // idle: no store call
	claimer.Report(ctx, errors.New("connection refused"))
	require.False(t, h.Ready())
}
