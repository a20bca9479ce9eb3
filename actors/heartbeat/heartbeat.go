// Package heartbeat keeps one worker_instance row alive for a Consume session.
//
// The row is how the fleet knows this process is doing the group's work: its
// expires_at is the heartbeat, and every range lease the instance owns is
// renewed with it, so a live instance keeps its ranges however long a batch
// takes, and a dead one loses them one TTL after its last beat. If a renewal
// finds the row gone, the instance was declared dead by someone else; the
// actor says so on Lost, and registers again.
//
// It is part of the engine's inside, not an API for users.
package heartbeat

import (
	"context"
	"github.com/c1702965/sqlstreams/internal/codes"
	"log/slog"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Config is what the actor needs; every field is required.
type Config struct {
	Store          *store.Store
	StreamID       int64
	WorkerConfigID int64
	InstanceID     string
	DeclaredBy     string
	TTL            time.Duration
	Clock          clock.Clock
	Logger         *slog.Logger
	// DBNow returns the explicit database time for a statement (nil in
	// production, the mock clock's time in simulations).
	DBNow func() store.Now
	// Liveness, if set, is told of the instance's liveness as it changes:
	// each renewal, and each time the row was found gone.
	Liveness *Liveness
	// Graceful reports, at stop, whether to give the row back.
	Graceful func() bool
	// Registered says the row already exists (the registrar inserted it
	// with the binding declaration), so the first step renews.
	Registered bool
	// Health, if set, is the session's readiness and permanent-error sink.
	Health *outage.Health
	// Retry is the backoff after a failed beat (zero: the default); a
	// failed beat is retried at least every Interval.
	Retry backoff.Policy
	// Stop, if set, bounds the give-back of the row on a graceful stop
	// (the session's shutdown plan); without it the give-back gets
	// shutdown.Grace.
	Stop *shutdown.Plan
}

// Actor is the heartbeat actor.
type Actor struct {
	cfg        Config
	registered bool
	outage     *outage.Reporter
}

// New returns a heartbeat actor.
func New(cfg Config) *Actor {
	return &Actor{cfg: cfg, registered: cfg.Registered,
		outage: &outage.Reporter{Logger: cfg.Logger, What: "heartbeat", Retry: "with backoff", Attrs: []any{"instance", cfg.InstanceID},
			Health: cfg.Health, Backoff: backoff.Backoff{Policy: cfg.Retry}}}
}

// Liveness is how the heartbeat tells the instance's other actors what it
// learns: the newest renewal (its leases last at least TTL from when it was
// sent) and every time the row was found gone. The heartbeat never waits on
// it; C signals that something changed and Take reads it. A loss is kept
// until it is taken, however many renewals follow. A nil *Liveness ignores
// everything.
type Liveness struct {
	mu      sync.Mutex
	renewed time.Time
	lost    int
	signal  chan struct{}
}

// NewLiveness returns an empty liveness.
func NewLiveness() *Liveness { return &Liveness{signal: make(chan struct{}, 1)} }

func (l *Liveness) renew(at time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if at.After(l.renewed) {
		l.renewed = at
	}
	l.mu.Unlock()
	l.poke()
}

func (l *Liveness) lose() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.lost++
	l.mu.Unlock()
	l.poke()
}

func (l *Liveness) poke() {
	select {
	case l.signal <- struct{}{}:
	default: // a signal is pending already
	}
}

// C receives a value after a change; nil for a nil Liveness.
func (l *Liveness) C() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.signal
}

// Take returns when the newest renewal was sent and how many losses
// happened since the last Take.
func (l *Liveness) Take() (renewed time.Time, lost int) {
	if l == nil {
		return time.Time{}, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	renewed, lost = l.renewed, l.lost
	l.lost = 0
	return renewed, lost
}

// Interval is how often the actor beats: a third of the TTL, so two beats
// may fail before the instance is seen as dead.
func (a *Actor) Interval() time.Duration { return a.cfg.TTL / 3 }

// Step registers the row on first use and renews it after.
func (a *Actor) Step(ctx context.Context) error {
	if !a.registered {
		if err := a.cfg.Store.InsertInstance(ctx, a.cfg.InstanceID, a.cfg.WorkerConfigID, a.cfg.DeclaredBy, a.cfg.TTL, a.cfg.DBNow()); err != nil {
			return err
		}
		a.registered = true
		return nil
	}
	sent := a.cfg.Clock.Now()
	found, err := a.cfg.Store.RenewInstance(ctx, a.cfg.InstanceID, a.cfg.StreamID, a.cfg.TTL, a.cfg.DBNow())
	if err != nil {
		return err
	}
	if found {
		a.cfg.Liveness.renew(sent)
	} else {
		a.registered = false
		a.cfg.Liveness.lose()
		codes.InstanceLost.Log(ctx, a.cfg.Logger, "worker instance row was gone at renewal; registering again", "instance", a.cfg.InstanceID)
		return a.Step(ctx)
	}
	return nil
}

// Serve beats every Interval until ctx ends, then gives the row back when the
// stop is graceful, within the session's shutdown plan. A failed beat is
// logged once per outage and retried with backoff, at least every Interval:
// a database restart must not end the session.
func (a *Actor) Serve(ctx context.Context) error {
	t := a.cfg.Clock.Ticker(a.Interval())
	defer t.Stop()
	var retry <-chan time.Time
	var stopRetry func() bool
	defer func() {
		if stopRetry != nil {
			stopRetry()
		}
	}()
	beat := func() {
		if wait := a.outage.Report(ctx, a.Step(ctx)); wait > 0 && wait < a.Interval() {
			if stopRetry != nil {
				stopRetry()
			}
			r := a.cfg.Clock.Timer(wait)
			retry, stopRetry = r.C, r.Stop
		}
	}
	for {
		select {
		case <-ctx.Done():
			if a.cfg.Graceful() && a.registered {
				dctx, cancel := a.cfg.Stop.Context(ctx, a.cfg.Clock, true)
				defer cancel()
				if err := a.cfg.Store.DeleteInstance(dctx, a.cfg.InstanceID); err != nil {
					codes.InstanceGiveBackFailed.Log(ctx, a.cfg.Logger, "could not give the worker instance row back; it lapses at its TTL",
						"instance", a.cfg.InstanceID, "error", err)
				}
			}
			return ctx.Err()
		case <-t.C:
			beat()
		case <-retry:
			retry = nil
			beat()
		}
	}
}
