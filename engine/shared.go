package engine

import (
	"log/slog"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/manager"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/observe"
	"github.com/c1702965/sqlstreams/internal/store"
)

// The engine is the root package's only way to the actors: what a caller
// names of theirs is named here.
type (
	// Handler runs one delivery (the range and exception claimers' handler).
	Handler = claimer.Handler
	// TxHandler runs one delivery inside the transaction that settles it.
	TxHandler = claimer.TxHandler
	// Delivery is what a Handler is given.
	Delivery = claimer.Delivery
	// Stats are a session's counters, safe to read while it runs.
	Stats = claimer.Stats
	// Leftovers are what a stopped session could not hand back, kept by
	// its consumer for the next session to write (Config.Leftovers).
	Leftovers = claimer.Leftovers
	// Manager runs the fleet's maintenance workers (actors/manager).
	Manager = manager.Actor
	// ManagerConfig is a Manager's config.
	ManagerConfig = manager.Config
)

// The fleet's maintenance workers (actors/manager).
const (
	RetentionWorker = manager.RetentionWorker
	PruneWorker     = manager.PruneWorker
	SchedulerWorker = manager.SchedulerWorker
)

// NewManager returns a manager running the standard maintenance workers
// (retention, prune, scheduler) under cfg.
func NewManager(cfg ManagerConfig) *Manager { return manager.Standard(cfg) }

// ConfigReadBound bounds one batched config read of a client's sessions
// (refresher.Reads).
const ConfigReadBound = 10 * time.Second

// Shared is what every Consume session of one client shares, made once by
// the client and given to each session (Config.Shared): the wake-up Hub
// (one LISTEN connection), the heartbeats' beats (a process's instance rows
// renewed in one statement) and the config reads (every session's group
// config read together).
type Shared struct {
	hub   *Hub
	beats *heartbeat.Beats
	reads *refresher.Reads
}

// NewShared returns a client's shared parts; nothing runs until a session
// uses them.
func NewShared(st *store.Store, clk clocks.Clock, logger *slog.Logger, obs observe.Observer) *Shared {
	return &Shared{
		hub:   NewHub(st, clk, logger, obs),
		beats: heartbeat.NewBeats(st, clk, DBNow(clk)),
		reads: refresher.NewReads(st, clk, ConfigReadBound),
	}
}

// Hub returns the client's wake-up hub.
func (s *Shared) Hub() *Hub { return s.hub }

// parts are a session's shares: none for a nil Shared (each session
// alone), and no hub when the test hooks run it without one.
func (s *Shared) parts(h *hooks.Hooks) (*Hub, *heartbeat.Beats, *refresher.Reads) {
	if s == nil {
		return nil, nil, nil
	}
	if h != nil && h.NoListener {
		return nil, s.beats, s.reads
	}
	return s.hub, s.beats, s.reads
}

// MaxTxMessages is the most messages a transactional handler's session
// runs in one transaction (claimer.MaxTxBatch).
const MaxTxMessages = claimer.MaxTxBatch
