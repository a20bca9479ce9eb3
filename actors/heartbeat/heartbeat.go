// Package heartbeat keeps one worker_instance row alive for a Consume session.
//
// The row is how the fleet knows this process is doing the group's work: its
// expires_at is the heartbeat, and every range lease the instance owns is
// renewed with it, so a live instance keeps its ranges however long a batch
// takes, and a dead one loses them one TTL after its last beat. A renewal
// renews only a live row: if it finds the row lapsed or gone, the instance
// may have been taken over already; the actor says so on its Liveness (internal/incarnation) and
// renews nothing more, and the session registers again under new instance
// ids (a new incarnation), binding check included.
//
// It is part of the engine's inside, not an API for users.
package heartbeat

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/batch"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/incarnation"
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
	Clock          clocks.Clock
	Logger         *slog.Logger
	// DBNow returns the explicit database time for a statement (nil in
	// production, the mock clock's time in simulations).
	DBNow func() store.Now
	// Liveness, if set, is the incarnation this heartbeat keeps: told of
	// each renewal (when it was sent) and of the loss.
	Liveness *incarnation.Liveness
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
	// Beats, if set, is the client's: the instance row is renewed with every
	// other heartbeat's of the process, in one statement, and the beats
	// tick at the same instants (multiples of Interval on the clock) so
	// that they meet. nil: the actor renews its row alone, ticking from its
	// start (the simulator).
	Beats *Beats
	// PeerLapsed, if set, is told when a renewal through Beats reports
	// that another instance of the same worker lapsed lately: the
	// session's claimer sweeps for its leases (decision 0040).
	PeerLapsed func()
	// Holds, if set, reports whether the instance's claimer may hold
	// leases: a beat renews them only then (an idle session's beat is one
	// statement). nil: always.
	Holds func() bool
	// Leases is the kind of lease the instance's claimer takes, which its
	// beats renew (zero: store.AllLeases).
	Leases store.LeaseKinds
	// Stop, if set, bounds the give-back of the row on a graceful stop
	// (the session's shutdown plan); without it the give-back gets
	// shutdown.Grace.
	Stop *shutdown.Plan
}

// Actor is the heartbeat actor.
type Actor struct {
	cfg        Config
	registered bool
	lost       bool // the row lapsed or was gone: nothing more is renewed
	outage     *outage.Reporter
	// answered counts the store calls that succeeded: a beat with nothing
	// to renew (no leases held, a lost row) says nothing of an outage.
	answered atomic.Uint64
}

// New returns a heartbeat actor.
func New(cfg Config) *Actor {
	a := &Actor{cfg: cfg, registered: cfg.Registered}
	a.outage = &outage.Reporter{Logger: cfg.Logger, What: "heartbeat", Retry: "with backoff", Attrs: []any{"instance", cfg.InstanceID},
		Health: cfg.Health, Backoff: backoff.Backoff{Policy: cfg.Retry}, Reached: a.answered.Load}
	return a
}

// Interval is how often the actor beats: a third of the TTL, so two beats
// may fail before the instance is seen as dead.
func (a *Actor) Interval() time.Duration { return a.cfg.TTL / 3 }

// Step registers the row on first use and renews it after. A renewal that
// finds the row lapsed or gone loses the incarnation: the heartbeat reports
// it (SQL0302) and renews nothing more; the engine registers the session
// again, binding check included, under new instance ids.
func (a *Actor) Step(ctx context.Context) error {
	if a.lost {
		return nil
	}
	if !a.registered {
		sent := a.cfg.Clock.Now()
		if err := a.cfg.Store.InsertInstance(ctx, store.InsertInstanceParams{
			ID: a.cfg.InstanceID, WorkerConfigID: a.cfg.WorkerConfigID, DeclaredBy: a.cfg.DeclaredBy, TTL: a.cfg.TTL, Now: a.cfg.DBNow()}); err != nil {
			return err
		}
		a.answered.Add(1)
		a.registered = true
		a.cfg.Liveness.Start(sent)
		return nil
	}
	if a.cfg.Beats != nil { // the leases at the actor's own phase: StepLeases
		r, err := a.cfg.Beats.Renew(ctx, a.cfg.InstanceID, a.cfg.WorkerConfigID, a.cfg.TTL)
		if err != nil {
			return err
		}
		a.answered.Add(1)
		if r.PeerLapsed && a.cfg.PeerLapsed != nil {
			a.cfg.PeerLapsed()
		}
		return a.renewed(ctx, r.Live, r.Sent)
	}
	sent := a.cfg.Clock.Now()
	live, err := a.cfg.Store.RenewInstance(ctx, store.RenewInstanceParams{
		ID: a.cfg.InstanceID, StreamID: a.cfg.StreamID, TTL: a.cfg.TTL, Now: a.cfg.DBNow(), Leases: a.holds()})
	if err != nil {
		return err
	}
	a.answered.Add(1)
	return a.renewed(ctx, live, sent)
}

func (a *Actor) holds() bool { return a.cfg.Holds == nil || a.cfg.Holds() }

// renewed takes a renewal's result: a row found lapsed or gone loses the
// incarnation.
func (a *Actor) renewed(ctx context.Context, live bool, sent time.Time) error {
	if !live {
		a.lost = true
		a.cfg.Liveness.Lose()
		codes.InstanceLost.Log(ctx, a.cfg.Logger, "worker instance row had lapsed or was gone at renewal; the session registers again as a new incarnation",
			"instance", a.cfg.InstanceID)
		return nil
	}
	a.cfg.Liveness.Renewed(sent)
	a.cfg.Health.Confirm() // the incarnation outlived any outage: ready again
	return nil
}

// StepLeases renews the leases of every range and exception row the
// instance owns, while its claimer may hold some and its incarnation is
// valid. With Beats, Step renews the row alone, at the process's common
// instants, and this runs at the actor's own phase: a process's lease
// renewals (a statement per stream) stay spread over the interval instead
// of asking the pool for a connection all at once.
func (a *Actor) StepLeases(ctx context.Context) error {
	if a.lost || !a.registered || !a.holds() || !a.cfg.Liveness.Valid() {
		return nil
	}
	err := a.cfg.Store.RenewLeases(ctx, store.RenewLeasesParams{
		Kinds: a.cfg.Leases, InstanceID: a.cfg.InstanceID, StreamID: a.cfg.StreamID, TTL: a.cfg.TTL, Now: a.cfg.DBNow()})
	if err == nil {
		a.answered.Add(1)
	}
	return err
}

// Lost reports whether this heartbeat's incarnation was lost.
func (a *Actor) Lost() bool { return a.lost }

// Serve beats every Interval until ctx ends, then gives the row back when the
// stop is graceful, within the session's shutdown plan. A failed beat is
// logged once per outage and retried with backoff, at least every Interval:
// a database restart must not end the session.
func (a *Actor) Serve(ctx context.Context) error {
	var tick, leaseTick <-chan time.Time
	rearm := func() {}
	t := a.cfg.Clock.Ticker(a.Interval())
	defer t.Stop()
	tick = t.C()
	if a.cfg.Beats != nil {
		leave := a.cfg.Beats.Join()
		defer leave()
		aligned := a.cfg.Clock.Timer(batch.Aligned(a.cfg.Clock, a.Interval()))
		defer aligned.Stop()
		tick, leaseTick = aligned.C(), t.C()
		rearm = func() { aligned.Reset(batch.Aligned(a.cfg.Clock, a.Interval())) }
	}
	var retry <-chan time.Time
	var stopRetry func() bool
	defer func() {
		if stopRetry != nil {
			stopRetry()
		}
	}()
	beat := func(step func(context.Context) error) {
		if wait := a.outage.Report(ctx, step(ctx)); wait > 0 && wait < a.Interval() {
			if stopRetry != nil {
				stopRetry()
			}
			r := a.cfg.Clock.Timer(wait)
			retry, stopRetry = r.C(), r.Stop
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
		case <-tick:
			beat(a.Step)
			rearm()
		case <-leaseTick:
			beat(a.StepLeases)
		case <-retry:
			retry = nil
			beat(func(ctx context.Context) error {
				if err := a.Step(ctx); err != nil || a.cfg.Beats == nil {
					return err
				}
				return a.StepLeases(ctx)
			})
		}
	}
}
