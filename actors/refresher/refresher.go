// Package refresher keeps a Consume session's copy of its group config
// current. It polls the group's worker_config rows every interval and swaps
// the declaration into the shared snapshot the claimers read, so a
// redeclaration reaches every running instance within one interval and the
// claim path never reads config from the database.
//
// It is part of the engine's inside, not an API for users.
package refresher

import (
	"context"
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Config is what the actor needs; every field is required.
type Config struct {
	Store    *store.Store
	GroupID  int64
	Interval time.Duration
	Snapshot *groupconfig.Snapshot
	Clock    clock.Clock
	Logger   *slog.Logger
	// Health, if set, is the session's readiness and permanent-error sink.
	Health *outage.Health
	// Retry is the backoff after a failed read (zero: the default).
	Retry backoff.Policy
}

// Actor is the refresher.
type Actor struct {
	cfg    Config
	outage *outage.Reporter
}

// New returns a refresher.
func New(cfg Config) *Actor {
	return &Actor{cfg: cfg, outage: &outage.Reporter{Logger: cfg.Logger, What: "group config refresh",
		Retry: "with backoff, keeping the last copy", Attrs: []any{"group_id", cfg.GroupID},
		Health: cfg.Health, Backoff: backoff.Backoff{Policy: cfg.Retry}}}
}

// Step reads the group's documents once and swaps them in. It reports
// whether the effective declaration changed.
func (a *Actor) Step(ctx context.Context) (bool, error) {
	docs, err := a.cfg.Store.ReadGroupConfig(ctx, a.cfg.GroupID)
	if err != nil {
		return false, err
	}
	d, err := groupconfig.FromDocs(docs)
	if err != nil {
		return false, err
	}
	return a.cfg.Snapshot.Set(d), nil
}

// Serve refreshes every interval until ctx ends. A failed read keeps the
// last good copy, is logged once per outage and retried with backoff, at
// least every interval.
func (a *Actor) Serve(ctx context.Context) error {
	t := a.cfg.Clock.Ticker(a.cfg.Interval)
	defer t.Stop()
	var retry <-chan time.Time
	var stopRetry func() bool
	defer func() {
		if stopRetry != nil {
			stopRetry()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-retry:
			retry = nil
		}
		changed, err := a.Step(ctx)
		if wait := a.outage.Report(ctx, err); wait > 0 && wait < a.cfg.Interval {
			if stopRetry != nil {
				stopRetry()
			}
			r := a.cfg.Clock.Timer(wait)
			retry, stopRetry = r.C, r.Stop
		}
		if changed {
			a.cfg.Logger.Info("group config changed; new claims and exception writes use it", "group_id", a.cfg.GroupID)
		}
	}
}

// Reporter returns the actor's outage reporter, for the engine's first read.
func (a *Actor) Reporter() *outage.Reporter { return a.outage }
