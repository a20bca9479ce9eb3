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
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/batch"
	"github.com/c1702965/sqlstreams/internal/clocks"
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
	Clock    clocks.Clock
	Logger   *slog.Logger
	// Health, if set, is the session's readiness and permanent-error sink.
	Health *outage.Health
	// Retry is the backoff after a failed read (zero: the default).
	Retry backoff.Policy
	// Reads, if set, is the client's: while Serve runs, the read is batched
	// with every other session's of the process, and the refreshes tick at
	// the multiples of Interval on the clock so that they meet. nil: each
	// reads alone, ticking from its start (the simulator).
	Reads *Reads
}

// Reads batches the group config reads of every session of a client into
// one statement (store.ReadGroupConfigs).
type Reads struct {
	*batch.Batcher[int64, map[string][]byte]
}

// MaxReadBatch bounds the groups one statement reads.
const MaxReadBatch = 5000

// NewReads returns a client's batched reads; nothing runs until Join. A
// statement may take bound.
func NewReads(st *store.Store, clk clocks.Clock, bound time.Duration) *Reads {
	read := func(ctx context.Context, ids []int64) ([]map[string][]byte, error) {
		docs, err := st.ReadGroupConfigs(ctx, ids)
		if err != nil {
			return nil, err
		}
		out := make([]map[string][]byte, len(ids))
		for i, id := range ids {
			if out[i] = docs[id]; out[i] == nil {
				out[i] = map[string][]byte{}
			}
		}
		return out, nil
	}
	return &Reads{batch.New(clk, MaxReadBatch, read, func([]int64) time.Duration { return bound })}
}

// Actor is the refresher.
type Actor struct {
	cfg    Config
	outage *outage.Reporter
	// batched: Serve runs, joined to cfg.Reads (a Step outside it, the
	// engine's, reads alone).
	batched atomic.Bool
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
	var docs map[string][]byte
	var err error
	if a.batched.Load() {
		docs, err = a.cfg.Reads.Do(ctx, a.cfg.GroupID)
	} else {
		docs, err = a.cfg.Store.ReadGroupConfig(ctx, a.cfg.GroupID)
	}
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
	tick, rearm := t.C(), func() {}
	if a.cfg.Reads != nil {
		leave := a.cfg.Reads.Join()
		defer leave()
		a.batched.Store(true)
		defer a.batched.Store(false)
		aligned := a.cfg.Clock.Timer(batch.Aligned(a.cfg.Clock, a.cfg.Interval))
		defer aligned.Stop()
		tick, rearm = aligned.C(), func() { aligned.Reset(batch.Aligned(a.cfg.Clock, a.cfg.Interval)) }
	}
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
		case <-tick:
			rearm()
		case <-retry:
			retry = nil
		}
		changed, err := a.Step(ctx)
		if wait := a.outage.Report(ctx, err); wait > 0 && wait < a.cfg.Interval {
			if stopRetry != nil {
				stopRetry()
			}
			r := a.cfg.Clock.Timer(wait)
			retry, stopRetry = r.C(), r.Stop
		}
		if changed {
			a.cfg.Logger.Info("group config changed; new claims and exception writes use it", "group_id", a.cfg.GroupID)
		}
	}
}

// Reporter returns the actor's outage reporter, for the engine's first read.
func (a *Actor) Reporter() *outage.Reporter { return a.outage }
