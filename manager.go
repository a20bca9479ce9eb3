package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/thejerf/suture/v4"
)

// Manager runs the fleet's maintenance workers: retention, which drops
// messages older than their stream's RetentionTTL; prune, which keeps the
// ledgers bounded; and the scheduler, which produces schedules' due runs. It owns no config:
// each worker's knobs live on its worker_config row (Declare), read when the
// worker is provisioned and at every heartbeat. A client runs one manager
// while it has a Consume session without ConsumeOptions.DisableManager (one
// a process, however many sessions: it runs in one of them, and moves to
// another when that one stops); a process that does not consume can run one
// with Run. However many managers run, each worker
// runs on as many of them as its Instances says (one by default).
type Manager struct{ c *Client }

// oneManagerAProcess runs a Consume session's manager while no other session
// of the same client runs one: one manager a process, however many sessions
// it runs. Every manager asks for each worker's slot every TTL/3, so a
// process of 500 sessions ran 500 managers asking for the same three slots
// (the many-sessions idle window spent most of the server's CPU on them).
// The others wait for their turn at no cost; when the running one's session
// stops, another session's manager takes over (a new slot, when the old
// one was given back).
type oneManagerAProcess struct {
	turn chan struct{}
	svc  suture.Service
}

func (o oneManagerAProcess) Serve(ctx context.Context) error {
	select {
	case o.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-o.turn }()
	return o.svc.Serve(ctx)
}

func (o oneManagerAProcess) String() string { return "manager" }

// Manager returns the client's manager.
func (c *Client) Manager() *Manager { return &Manager{c: c} }

// Worker names.
const (
	// WorkerRetention drops expired messages (StreamConfig.RetentionTTL).
	WorkerRetention = engine.RetentionWorker
	// WorkerPrune keeps the ledgers bounded: superseded binding-declaration
	// attempts, old config snapshots, old delivery-log rows and idempotency
	// keys.
	WorkerPrune = engine.PruneWorker
)

// WorkerConfig is a maintenance worker's declared knobs.
type WorkerConfig struct {
	// Instances is how many managers of the fleet run the worker. Default 1.
	Instances int
	// Suspend runs the worker nowhere (instances 0) until redeclared.
	Suspend bool
	// Interval is how often the worker does a round of work. Default 1m;
	// 10m for prune (its rounds cost a statement per stream and table, and
	// what it drops lives for hours), 1s for the scheduler. It is the
	// fleet's cadence, not each holder's: a worker's rounds begin at most
	// once an interval across every process holding it, and a process that
	// takes a slot over waits for the rest of the interval since the
	// fleet's last round (decision 0053).
	Interval time.Duration
	// Batch bounds the rows one statement touches. Default 5000.
	Batch int
	// MaxBatches bounds the statements of one round. Default 20.
	MaxBatches int
	// DeliveryTTL (prune): delivery-log rows older than this go. Default 7 days.
	DeliveryTTL time.Duration
	// IdempotencyTTL (prune): idempotency keys older than this go, after
	// which the same key produces again. Default 7 days.
	IdempotencyTTL time.Duration
	// ConfigLogKeep (prune): config snapshots kept per worker and per
	// stream, the newest first. Default 0: every earlier document is kept
	// (seed 001: worker_config_log holds the history); set it to bound a
	// ledger that a redeclaring deploy loop grows.
	ConfigLogKeep int
	// InstanceKeep (prune): worker_instance rows (every consumer and worker
	// process that ever ran) stay listed this long after they expired, then
	// go. Default 24h.
	InstanceKeep time.Duration
	// ChunkInterval (retention): how much time one chunk of a stream's log
	// spans; whole chunks are what retention drops, so a stream holds up to
	// about RetentionTTL + ChunkInterval of messages. Default: each
	// stream's RetentionTTL / 4.
	ChunkInterval time.Duration
}

// settings is the stored document: only the fields set.
func (w WorkerConfig) settings() settings.Worker {
	s := settings.Worker{Interval: settings.Of(w.Interval), Batch: w.Batch, MaxBatches: w.MaxBatches,
		DeliveryTTL: settings.Of(w.DeliveryTTL), IdempotencyTTL: settings.Of(w.IdempotencyTTL),
		ConfigLogKeep: w.ConfigLogKeep, InstanceKeep: settings.Of(w.InstanceKeep), ChunkInterval: settings.Of(w.ChunkInterval)}
	switch {
	case w.Suspend:
		zero := 0
		s.Instances = &zero
	case w.Instances > 0:
		n := w.Instances
		s.Instances = &n
	}
	return s
}

func (w WorkerConfig) validate() error {
	if w.Instances < 0 || w.Interval < 0 || w.Batch < 0 || w.MaxBatches < 0 || w.DeliveryTTL < 0 || w.IdempotencyTTL < 0 || w.ConfigLogKeep < 0 || w.InstanceKeep < 0 || w.ChunkInterval < 0 {
		return fmt.Errorf("%w: WorkerConfig fields must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Declare replaces a worker's knobs (newest wins; the previous document
// stays in worker_config_log). Running managers follow at their next
// heartbeat.
func (m *Manager) Declare(ctx context.Context, worker string, cfg WorkerConfig) error {
	switch worker {
	case WorkerRetention, WorkerPrune, WorkerScheduler:
	default:
		return fmt.Errorf("%w: unknown worker %q (want %q, %q or %q)", ErrInvalidConfig, worker, WorkerRetention, WorkerPrune, WorkerScheduler)
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	doc, err := cfg.settings().Doc()
	if err != nil {
		return fmt.Errorf("declare worker %q: %w", worker, err)
	}
	return m.c.store.DeclareFleetWorker(ctx, worker, doc, declaredBy(), m.c.dbNow())
}

// ManagerOptions are a manager's per-run options.
type ManagerOptions struct {
	// InstanceTTL is how long a held worker slot outlives its last
	// heartbeat; heartbeats run every InstanceTTL/3. Default 30s.
	InstanceTTL time.Duration
}

func (o *ManagerOptions) withDefaults() ManagerOptions {
	var out ManagerOptions
	if o != nil {
		out = *o
	}
	if out.InstanceTTL == 0 {
		out.InstanceTTL = 30 * time.Second
	}
	return out
}

func (m *Manager) actor(ttl time.Duration, stop *shutdown.Plan, outages *outage.Log) *engine.Manager {
	c := m.c
	return engine.NewManager(engine.ManagerConfig{
		Store: c.store, DeclaredBy: declaredBy(), TTL: ttl, NewID: engine.NewID, Stop: stop, Outages: outages,
		Clock: c.cfg.Clock, Logger: c.cfg.Logger, DBNow: engine.DBNow(c.cfg.Clock),
	})
}

// Run runs a manager until ctx ends, then gives its worker slots back and
// returns nil; an error ends it only when it could not start.
func (m *Manager) Run(ctx context.Context, opts *ManagerOptions) error {
	o := opts.withDefaults()
	if o.InstanceTTL < 0 {
		return fmt.Errorf("%w: ManagerOptions.InstanceTTL must not be negative", ErrInvalidConfig)
	}
	err := m.actor(o.InstanceTTL, nil, nil).Serve(ctx)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // stopped as asked
	}
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}
