// Package engine runs one Consume session: it builds the session's actor
// tree under a suture supervisor and owns its lifecycle, so that Run returns
// only after every goroutine it started has exited.
//
// Shutdown order is the point of this package. When the caller's context
// ends, the claimer is asked to drain first (no new claims; in-flight handlers
// get up to ShutdownTimeout; finished ranges are committed and unfinished ones
// handed back with their leases expired), and only then is the tree stopped,
// so the heartbeat gives the instance row back last. With graceful shutdown
// disabled the tree is stopped at once and the database is left exactly as a
// crash would leave it, which is what the killed-instance tests rely on.
package engine

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/supervisor"
	"github.com/thejerf/suture/v4"
)

// Options are the session's resolved instance options.
type Options struct {
	BatchLimit              int
	QueueSize               int
	MessageConcurrency      int
	ClaimPollRate           time.Duration
	InstanceTTL             time.Duration
	ShutdownTimeout         time.Duration
	DisableGracefulShutdown bool
	ExceptionBackoff        time.Duration
	StallAfter              time.Duration
}

// Config is one session.
type Config struct {
	Store          *store.Store
	StreamID       int64
	GroupID        int64
	GroupName      string
	WorkerConfigID int64
	DeclaredBy     string
	Handler        claimer.Handler
	Options        Options
	Clock          clock.Clock
	Logger         *slog.Logger
	Stats          *claimer.Stats
	// OnStart, if set, is called with the instance id once the instance row
	// exists and the actors are about to run.
	OnStart func(instanceID string)
}

// DBNow returns the explicit database time for statements: nil under a real
// clock (the database's now() decides), the mock's time under a mock clock.
func DBNow(c clock.Clock) func() store.Now {
	if _, ok := c.(*clock.Mock); !ok {
		return func() store.Now { return nil }
	}
	return func() store.Now { t := c.Now(); return &t }
}

// NewID returns a random UUID (version 4) as text.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Run consumes until ctx ends. It returns nil after a clean stop.
func Run(ctx context.Context, cfg Config) error {
	instanceID := NewID()
	logger := cfg.Logger.With("group", cfg.GroupName, "instance", instanceID)
	dbNow := DBNow(cfg.Clock)
	o := cfg.Options
	graceful := !o.DisableGracefulShutdown

	lost := make(chan struct{}, 1)
	hb := heartbeat.New(heartbeat.Config{
		Store: cfg.Store, StreamID: cfg.StreamID, WorkerConfigID: cfg.WorkerConfigID,
		InstanceID: instanceID, DeclaredBy: cfg.DeclaredBy, TTL: o.InstanceTTL,
		Clock: cfg.Clock, Logger: logger, DBNow: dbNow, Lost: lost,
		Graceful: func() bool { return graceful },
	})
	if err := hb.Step(ctx); err != nil {
		return fmt.Errorf("consume %s: register instance: %w", cfg.GroupName, err)
	}

	drain := make(chan struct{})
	cl := claimer.New(claimer.Config{
		Store: cfg.Store, StreamID: cfg.StreamID, GroupID: cfg.GroupID, InstanceID: instanceID,
		Handler: cfg.Handler, BatchLimit: o.BatchLimit, QueueSize: o.QueueSize,
		Concurrency: o.MessageConcurrency, PollRate: o.ClaimPollRate, Lease: o.InstanceTTL,
		ExceptionBackoff: o.ExceptionBackoff, StallAfter: o.StallAfter, ShutdownTimeout: o.ShutdownTimeout,
		Clock: cfg.Clock, Logger: logger, DBNow: dbNow, Stats: cfg.Stats, Lost: lost, Drain: drain,
	})
	drained := make(chan error, 1)
	claimerSvc := supervisor.Guard("claimer", serviceFunc(func(ctx context.Context) error {
		err := cl.Serve(ctx)
		select {
		case <-drain:
			if ctx.Err() == nil { // the drain finished: report it and stay down
				drained <- err
				return suture.ErrDoNotRestart
			}
		default:
		}
		return err
	}))

	sup := supervisor.New("consume:"+cfg.GroupName, logger)
	sup.Add(supervisor.Guard("heartbeat", hb))
	sup.Add(claimerSvc)
	supCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := sup.ServeBackground(supCtx)
	if cfg.OnStart != nil {
		cfg.OnStart(instanceID)
	}

	var result error
	select {
	case <-ctx.Done():
	case err := <-done: // the tree gave up (restart budget exhausted)
		return fmt.Errorf("consume %s: %w", cfg.GroupName, err)
	}
	if graceful {
		close(drain)
		select {
		case err := <-drained:
			if err != nil {
				result = fmt.Errorf("consume %s: %w", cfg.GroupName, err)
			}
		case err := <-done:
			return fmt.Errorf("consume %s: %w", cfg.GroupName, err)
		}
	}
	stop()
	<-done
	return result
}

type serviceFunc func(ctx context.Context) error

func (f serviceFunc) Serve(ctx context.Context) error { return f(ctx) }
