// Package outage is how actors live with a failing database. A Reporter
// records each store call's result: the caller is told how long to back off
// before its next attempt (ClientConfig.Retry), and a failure that retrying
// cannot fix is handed to the session's Health, which ends the session with
// it instead of retrying forever. An outage is logged once a session
// (SQL0101) when its first actor fails to reach the database, and once when
// one reaches it again, with the outage's length; a Reporter without a
// Health logs its own.
//
// Health is the session's view of all its actors' store calls: the
// readiness level (consuming, and no actor failing for longer than the
// instance TTL, counted from the session's last successful store call) and
// the first permanent error.
//
// It is part of the engine's inside, not an API for users.
package outage

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Reporter tracks one actor's outage. The zero value needs Logger and What.
type Reporter struct {
	Logger *slog.Logger
	What   string // e.g. "claimer store call"
	Retry  string // how it retries, e.g. "with backoff"
	Attrs  []any
	// Health, if set, is the session this actor belongs to: it learns of
	// the actor's outages (readiness) and of permanent errors.
	Health *Health
	// Backoff is the wait before the next attempt after a failure.
	Backoff backoff.Backoff
	// Outages, if set, is the session's outage log, for an actor that
	// reports to no Health (the manager); else the Health's is used.
	Outages *Log
	// Reached, if set, counts the store calls of the actor the database
	// answered (store.Group.Counting). A result reported with no error
	// counts as a success only when it moved since the last report: an
	// actor's step that made no store call says nothing of the database.
	Reached func() uint64

	failing bool
	reached uint64
}

// Report records the result of one attempt and returns how long the actor
// should wait before its next store call: 0 after a success, else the
// backoff. Errors after the actor's own context ended are its stop, not an
// outage.
func (r *Reporter) Report(ctx context.Context, err error) time.Duration {
	moved := true
	if r.Reached != nil {
		n := r.Reached()
		moved, r.reached = n != r.reached, n
	}
	switch {
	case err == nil && !moved:
		return 0 // no store call: nothing learnt of the database
	case err == nil:
		r.Backoff.Succeeded()
		r.Health.succeeded()
		if r.failing {
			r.failing = false
			r.Health.recovered(r)
			if !r.log().back(ctx, r) && r.Logger != nil {
				r.Logger.Info(r.What+" recovered", r.Attrs...)
			}
		}
		return 0
	case ctx.Err() != nil:
		return 0
	}
	r.Health.failure(err)
	p := store.Permanent(err)
	switch {
	case p != nil && r.Health != nil:
		// The session ends with it (Consume returns it): not logged here.
		r.Health.permanent(p)
	case r.failing:
	case p != nil:
		codes.StorePermanent.Log(ctx, r.Logger, r.What+" failed; retrying "+r.Retry, append(append([]any{}, r.Attrs...), "error", err)...)
	case !r.log().lost(ctx, r, err):
		codes.StoreOutage.Log(ctx, r.Logger, r.What+" failed; retrying "+r.Retry, append(append([]any{}, r.Attrs...), "error", err)...)
	}
	if !r.failing {
		r.failing = true
		r.Health.failed(r)
	}
	wait := r.Backoff.Failed()
	if store.Unreachable(err) {
		wait = min(wait, UnreachableRetry)
	}
	return wait
}

// UnreachableRetry caps the wait after a failure that found the server out
// of reach (store.Unreachable: refused or cut connections, a server
// shutting down or starting up). A refused connection costs the server
// nothing, and the sooner an actor is back the less it loses: work settled
// before the outage waits unrecorded in memory, where a crash of the
// instance or a lapse of its lease would have another run it again, and a
// heartbeat that waited out a doubling backoff let a database back within
// a second lapse the instance. A busy server's errors keep the whole
// backoff.
const UnreachableRetry = 100 * time.Millisecond

// Failing reports whether the last attempt failed.
func (r *Reporter) Failing() bool { return r.failing }

// Health is a session's readiness and its first permanent store error. A
// nil *Health ignores everything.
type Health struct {
	clock clocks.Clock
	ttl   time.Duration
	fatal chan error

	mu        sync.Mutex
	consuming bool
	failing   map[*Reporter]time.Time
	timers    map[*Reporter]clocks.Timer
	watchers  map[int]func()
	nextWatch int
	closed    bool
	// reached is closed, and dropped, at the next store call of any actor
	// that succeeds, once something waits on it (Reached).
	reached chan struct{}
	waiting atomic.Bool
	// lastOK is when a store call of the session last succeeded (unix
	// nanoseconds; noSuccess before the first): an actor that fails counts
	// as failing since then, so the level turns within the TTL of the
	// outage's start, not of the first call that met it.
	lastOK atomic.Int64
	// recoveredAt is when an actor of the session last reached the
	// database after failing to, or a new incarnation replaced a lost one
	// (RecoveredAt).
	recoveredAt time.Time
	// disrupted, if set, is told of every failed store call (OnFailure).
	disrupted func(error)
	// log is the session's outage log (Log).
	log Log
	// unsure: an actor failed for the TTL or longer, so the incarnation's
	// rows may have lapsed meanwhile. The level stays not ready, after the
	// database is back too, until a heartbeat finds its row live (Confirm)
	// or a new incarnation begins (SetConsuming(true)): otherwise it would
	// turn ready at the first store call that succeeds and back again when
	// the heartbeat finds the row lapsed.
	unsure bool

	bmu  sync.Mutex       // guards the map; each mark is atomic
	busy map[string]*Busy // actor → its liveness mark
}

// NewHealth returns the health of a session whose instance lapses ttl after
// its last heartbeat: it is not ready while any of its actors has been
// failing for ttl or longer.
func NewHealth(clk clocks.Clock, ttl time.Duration) *Health {
	h := &Health{clock: clk, ttl: ttl, fatal: make(chan error, 1), log: Log{clock: clk},
		failing: map[*Reporter]time.Time{}, timers: map[*Reporter]clocks.Timer{}, watchers: map[int]func(){}}
	h.lastOK.Store(noSuccess)
	return h
}

// noSuccess is lastOK before any store call succeeded (a mock clock may
// stand at 0).
const noSuccess = math.MinInt64

// Reached returns a channel closed the next time a store call of one of the
// session's actors succeeds: the database answered. An actor backing off
// after a failure to reach the database waits on it too, so it retries as
// soon as another actor (the heartbeat, every third of the TTL, or any
// other) has proved the database back, instead of at the end of a backoff
// that kept growing through the outage; it ends each wait once. A nil
// *Health's channel never closes.
func (h *Health) Reached() <-chan struct{} {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reached == nil {
		h.reached = make(chan struct{})
		h.waiting.Store(true)
	}
	return h.reached
}

// succeeded records the success and ends the waits on Reached; without
// waiters it costs a clock read and two atomic operations (every successful
// store call comes here).
func (h *Health) succeeded() {
	if h == nil {
		return
	}
	h.lastOK.Store(h.clock.Now().UnixNano())
	if !h.waiting.Load() {
		return
	}
	h.mu.Lock()
	if h.reached != nil {
		close(h.reached)
		h.reached = nil
		h.waiting.Store(false)
	}
	h.mu.Unlock()
}

// OnFailure sets f to be told of every store call of the session's actors
// that fails (the session resets its pool when the server dropped its
// connections: store.ResetIfDisrupted). Set it before the actors start.
func (h *Health) OnFailure(f func(error)) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.disrupted = f
}

func (h *Health) failure(err error) {
	if h == nil {
		return
	}
	h.mu.Lock()
	f := h.disrupted
	h.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// Fatal receives the session's first permanent error.
func (h *Health) Fatal() <-chan error {
	if h == nil {
		return nil
	}
	return h.fatal
}

// SetConsuming says whether the session consumes: its actors run and its
// binding set is in force.
func (h *Health) SetConsuming(on bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.consuming = on
	if on {
		h.unsure = false // a new incarnation: its rows are fresh
	}
	h.mu.Unlock()
	h.notify()
}

// Confirm says a heartbeat found its incarnation's row live: after an
// outage of the TTL or longer, the session is ready again from now.
func (h *Health) Confirm() {
	if h == nil {
		return
	}
	h.mu.Lock()
	was := h.unsure
	h.unsure = false
	h.mu.Unlock()
	if was {
		h.notify()
	}
}

// Ready reports the level: consuming, no actor failing for ttl or longer,
// and, after such an outage, the incarnation confirmed live.
func (h *Health) Ready() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.consuming || h.unsure {
		return false
	}
	now := h.clock.Now()
	for _, since := range h.failing {
		if now.Sub(since) >= h.ttl {
			return false
		}
	}
	return true
}

// Watch calls f (on a goroutine of its own choosing, never under a lock)
// whenever the level may have changed, until the returned func is called.
func (h *Health) Watch(f func()) (stop func()) {
	if h == nil {
		return func() {}
	}
	h.mu.Lock()
	id := h.nextWatch
	h.nextWatch++
	h.watchers[id] = f
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.watchers, id)
		h.mu.Unlock()
	}
}

// Forget drops every actor's outage: a new incarnation of the session
// starts with new actors, and the old ones' failures must not hold its
// readiness down (they will never report a recovery). It counts as a
// recovery (RecoveredAt): the session lost its incarnation because it could
// not renew it, an outage of its own.
func (h *Health) Forget() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.recoveredAt = h.clock.Now()
	for r, t := range h.timers {
		t.Stop()
		delete(h.timers, r)
	}
	clear(h.failing)
	h.mu.Unlock()
	h.notify()
}

// Close stops the health's timers; nothing changes after it.
func (h *Health) Close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed, h.consuming = true, false
	for r, t := range h.timers {
		t.Stop()
		delete(h.timers, r)
	}
	h.mu.Unlock()
	h.notify()
}

func (h *Health) notify() {
	h.mu.Lock()
	fs := make([]func(), 0, len(h.watchers))
	for _, f := range h.watchers {
		fs = append(fs, f)
	}
	h.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func (h *Health) failed(r *Reporter) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	// Failing since the session last reached the database: a heartbeat
	// renews every third of the TTL, so its first failure may come that
	// long into the outage, which began after the last success.
	now := h.clock.Now()
	since := now
	if ok := h.lastOK.Load(); ok != noSuccess && ok < now.UnixNano() {
		since = time.Unix(0, ok)
	}
	h.failing[r] = since
	turn := since.Add(h.ttl).Sub(now)
	if turn <= 0 {
		h.unsure = true
		h.mu.Unlock()
		h.notify()
		return
	}
	// The level turns at since+ttl: wake the watchers then.
	h.timers[r] = h.clock.AfterFunc(turn, func() {
		h.mu.Lock()
		if _, still := h.failing[r]; still && !h.closed {
			h.unsure = true
		}
		h.mu.Unlock()
		h.notify()
	})
	h.mu.Unlock()
}

// RecoveredAt is when the session last came back from an outage of its
// own: one of its actors reached the database after failing to, or a new
// incarnation replaced one that lapsed. Zero if never; a nil *Health's is
// zero. The claimers take no expired lease over for a while after it (see
// claimer.TakeoverGrace): the other instances that lived through the same
// outage are coming back too, and each should record what it settled
// before anyone runs its messages again.
func (h *Health) RecoveredAt() time.Time {
	if h == nil {
		return time.Time{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.recoveredAt
}

// log is where the reporter's outages are logged: its Outages, its
// Health's, or nil (it logs its own).
func (r *Reporter) log() *Log {
	if r.Outages != nil {
		return r.Outages
	}
	if r.Health != nil {
		return &r.Health.log
	}
	return nil
}

// Log is a session's outage log: an outage is logged (SQL0101) when the
// first of the session's actors fails to reach the database, and again
// when one reaches it, with the outage's length; whatever fails or
// recovers in between is not. The zero value needs its clock (a Health's
// is set up by NewHealth).
type Log struct {
	clock clocks.Clock
	mu    sync.Mutex
	// out: an actor failed to reach the database since the last store
	// call of any of them that did; since: when the outage began.
	out   bool
	since time.Time
}

// Outages returns the session's outage log, for actors that report to
// no Health (a nil Health's is nil).
func (h *Health) Outages() *Log {
	if h == nil {
		return nil
	}
	return &h.log
}

// lost is told of an actor's first failure of an outage; only the
// session's first is logged. It reports whether the log took it (a nil
// one does not: the reporter logs its own).
func (l *Log) lost(ctx context.Context, r *Reporter, err error) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	first := !l.out
	if first {
		l.out, l.since = true, l.clock.Now()
	}
	l.mu.Unlock()
	if first {
		codes.StoreOutage.Log(ctx, r.Logger, "session cannot reach the database: "+r.What+" failed; its actors retry "+r.Retry,
			append(append([]any{}, r.Attrs...), "error", err)...)
	}
	return true
}

// back is told of an actor's first store call that reached the database
// after it failed to: the session's first after an outage logs the
// outage's end and length. It reports whether the log took it.
func (l *Log) back(ctx context.Context, r *Reporter) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	was, since := l.out, l.since
	l.out = false
	l.mu.Unlock()
	if was {
		codes.StoreOutage.Log(ctx, r.Logger, "session reached the database again after an outage", append(append([]any{}, r.Attrs...),
			"outage", l.clock.Since(since).Round(time.Millisecond).String())...)
	}
	return true
}

func (h *Health) recovered(r *Reporter) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.recoveredAt = h.clock.Now()
	if since, ok := h.failing[r]; ok && h.recoveredAt.Sub(since) >= h.ttl {
		h.unsure = true // its timer may not have run yet
	}
	delete(h.failing, r)
	if t := h.timers[r]; t != nil {
		t.Stop()
		delete(h.timers, r)
	}
	h.mu.Unlock()
	h.notify()
}

func (h *Health) permanent(err error) {
	select {
	case h.fatal <- err:
	default: // the first one is what the session returns
	}
}

// Busy is one actor's liveness mark: busy since a time, or waiting for its
// next event. An actor takes its mark once (Health.Busy) and sets it on
// every turn of its loop with two atomic stores, no lock.
type Busy struct {
	clock clocks.Clock
	since atomic.Int64 // unix nanoseconds busy since; notBusy while waiting
}

// notBusy is a waiting mark's since (a mock clock may stand at 0).
const notBusy = math.MinInt64

// Working marks the actor busy from now, if it was waiting.
func (b *Busy) Working() {
	if b != nil && b.since.Load() == notBusy {
		b.since.Store(b.clock.Now().UnixNano())
	}
}

// Waiting marks the actor waiting for its next event.
func (b *Busy) Waiting() {
	if b != nil {
		b.since.Store(notBusy)
	}
}

// Busy returns the liveness mark of the actor named key (one per key). A
// loop that stays busy for longer than a bound is wedged (Wedged): the
// liveness probe's one reason to fail. A store call that fails at once (a
// database outage) keeps the loop turning, so an outage never makes the
// process look wedged. A nil *Health returns a nil mark, which ignores
// everything.
func (h *Health) Busy(key string) *Busy {
	if h == nil {
		return nil
	}
	h.bmu.Lock()
	defer h.bmu.Unlock()
	if h.busy == nil {
		h.busy = map[string]*Busy{}
	}
	b, ok := h.busy[key]
	if !ok {
		b = &Busy{clock: h.clock}
		b.since.Store(notBusy)
		h.busy[key] = b
	}
	return b
}

// Working marks the actor named key busy (see Busy).
func (h *Health) Working(key string) { h.Busy(key).Working() }

// Waiting marks the actor named key waiting (see Busy).
func (h *Health) Waiting(key string) { h.Busy(key).Waiting() }

// Wedged reports an actor that has been busy for longer than bound, if any.
func (h *Health) Wedged(bound time.Duration) (key string, since time.Time, wedged bool) {
	if h == nil {
		return "", time.Time{}, false
	}
	now := h.clock.Now()
	h.bmu.Lock()
	defer h.bmu.Unlock()
	for k, b := range h.busy {
		if ns := b.since.Load(); ns != notBusy {
			if t := time.Unix(0, ns); now.Sub(t) > bound {
				return k, t, true
			}
		}
	}
	return "", time.Time{}, false
}
