// Package registrar is the binding-declaration actor of a Consume session
// (seed 0511). Before the session claims anything it declares the group's
// binding set: join or install when the stored set is the same or none is
// stored; swap when the set differs and no live instance of the group
// remains; otherwise wait — visibly, re-attempting every retry interval,
// logging loudly each time, forever. A waiting instance holds no
// worker_instance row, never claims and is never ready. The attempt that
// succeeds inserts the session's worker_instance rows in its own
// transaction, so no other declarer can swap the set between the install
// and the first heartbeat.
//
// It is part of the engine's inside, not an API for users.
package registrar

import (
	"context"
	"log/slog"
	"time"

	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/observe"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Config is what the actor needs.
type Config struct {
	Store      *store.Store
	StreamID   int64
	GroupID    int64
	GroupName  string
	Patterns   []string // normalized
	Regexes    []string
	DeclaredBy string
	Instances  []store.InstanceInsert
	Interval   time.Duration
	Clock      clocks.Clock
	Logger     *slog.Logger
	DBNow      func() store.Now
	// Alerts, if set, is told of every waiting attempt (the alerts actor
	// publishes one alert per wait).
	Alerts *alert.Queue
	// Retry is the backoff after a failed attempt (zero: the default); a
	// failed attempt is retried at least every Interval.
	Retry backoff.Policy
	// DeclaredAt, if set, is the declared_at of this declarer's earlier
	// attempt that waited (Register's): every attempt carries it.
	DeclaredAt *time.Time
	// Outages, if set, is the session's outage log (outage.Log): an outage
	// is logged once with the session's.
	Outages *outage.Log
	// Hooks are the session's test hooks (nil in production): a test makes
	// an attempt fail or panic at its top (hooks.Registrar).
	Hooks *hooks.Hooks
	// Observer, if set, counts each wait once (observe.BindingWait),
	// labelled with StreamName and GroupName.
	Observer   observe.Observer
	StreamName string
}

// Actor is the registrar.
type Actor struct {
	cfg        Config
	declaredAt *time.Time
	since      time.Time
	sent       time.Time // when the last attempt was sent
	waited     bool      // an attempt of the last Run waited
}

// SetInstances replaces the worker_instance rows the next successful
// attempt inserts: a session registering again after its incarnation was
// lost does so under new ids, while its declared_at stays the first
// attempt's.
func (a *Actor) SetInstances(in []store.InstanceInsert) { a.cfg.Instances = in }

// Sent is when the last attempt was sent: after a successful Run, the
// instance rows it inserted last at least the TTL from then.
func (a *Actor) Sent() time.Time { return a.sent }

// Waited reports whether the last Run waited on live incumbents before its
// set was installed or joined.
func (a *Actor) Waited() bool { return a.waited }

// New returns a registrar.
func New(cfg Config) *Actor {
	a := &Actor{cfg: cfg, declaredAt: cfg.DeclaredAt}
	if a.declaredAt != nil {
		a.since = *a.declaredAt
	}
	return a
}

// Step makes one attempt. declared_at stays the first attempt's across
// retries; attempt_at is each attempt's own.
func (a *Actor) Step(ctx context.Context) (store.BindingResult, error) {
	if err := a.cfg.Hooks.At(hooks.Registrar); err != nil {
		return store.BindingResult{}, err
	}
	a.sent = a.cfg.Clock.Now()
	res, err := a.cfg.Store.Group(a.cfg.StreamID, a.cfg.GroupID).DeclareBindings(ctx, store.BindingRequest{
		Patterns: a.cfg.Patterns, Regexes: a.cfg.Regexes,
		DeclaredBy: a.cfg.DeclaredBy, DeclaredAt: a.declaredAt, Instances: a.cfg.Instances, Now: a.cfg.DBNow(),
	})
	if err != nil {
		return res, err
	}
	if a.declaredAt == nil {
		at := res.DeclaredAt
		a.declaredAt = &at
		a.since = a.cfg.Clock.Now()
	}
	return res, nil
}

// Run attempts until the set is installed or joined, or ctx ends. A failed
// attempt (a database restart, say) is logged once per outage and retried
// with backoff, at least every Interval; one that retrying cannot fix (a
// missing table, a missing privilege) is returned.
func (a *Actor) Run(ctx context.Context) (store.BindingResult, error) {
	// The ticker exists before the first attempt reports, so a mock clock
	// advanced after that report always reaches it.
	t := a.cfg.Clock.Ticker(a.cfg.Interval)
	defer t.Stop()
	rep := &outage.Reporter{Logger: a.cfg.Logger, What: "binding declaration attempt", Retry: "with backoff",
		Attrs: []any{"group", a.cfg.GroupName}, Backoff: backoff.Backoff{Policy: a.cfg.Retry}, Outages: a.cfg.Outages}
	var retry <-chan time.Time
	stopRetry := func() bool { return false }
	defer func() { stopRetry() }()
	a.waited = false
	for {
		res, err := a.Step(ctx)
		stopRetry()
		retry = nil
		switch {
		case err != nil && ctx.Err() != nil:
			return res, ctx.Err()
		case store.Permanent(err) != nil:
			return res, store.Permanent(err)
		case err != nil:
			if wait := rep.Report(ctx, err); wait < a.cfg.Interval {
				r := a.cfg.Clock.Timer(wait)
				retry, stopRetry = r.C(), r.Stop
			}
		case res.Outcome != store.BindingWaiting:
			rep.Report(ctx, nil)
			return res, nil
		default:
			rep.Report(ctx, nil)
			a.waited = true
			observe.Or(a.cfg.Observer).Count(a.cfg.StreamName, a.cfg.GroupName, observe.BindingWait, 1)
			a.cfg.Alerts.Send(alert.Event{Kind: alert.BindingWaiting, Since: a.since, Binding: res})
			codes.BindingWaiting.Log(ctx, a.cfg.Logger, "WAITING: consumer group binding set differs from the installed one while live instances hold it; "+
				"this instance will not consume until they are gone",
				"group", a.cfg.GroupName, "wanted", a.cfg.Patterns, "installed", res.Installed,
				"live_sessions", res.Sessions, "waiting_since", res.DeclaredAt, "retry_every", a.cfg.Interval.String())
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-t.C():
		case <-retry:
		}
	}
}
