// Package engine runs one Consume session: it builds the session's actor
// tree under a suture supervisor and owns its lifecycle, so that Run returns
// only after every goroutine it started has exited (handlers that ignore
// their context past ShutdownTimeout are the one documented exception: Go
// cannot stop them, so they are reported and left behind).
//
// The tree: a heartbeat per worker (message_consumer, exception_consumer),
// the refresher (the group config snapshot the claimers read), the range
// claimer and the exception claimer. Shutdown order is the point of
// this package. When the caller's context ends, the claimers are asked to
// drain first (no new claims; in-flight handlers get up to ShutdownTimeout;
// finished work is committed and unfinished work handed back with its leases
// expired), and only then is the tree stopped, so the heartbeats give the
// instance rows back last. With graceful shutdown disabled the tree is
// stopped at once and the database is left exactly as a crash would leave it,
// which is what the killed-instance tests rely on.
//
// Whatever the database does, Run returns within ShutdownTimeout plus
// shutdown.Grace of its context ending: the drain's deadlines are one shared
// plan (internal/shutdown), every store call on the way down is bounded by
// it, and what could not be handed back in time lapses with its lease. A
// store error that retrying cannot fix (store.Permanent) ends the session the
// same way, and Run returns it.
//
// It is part of the engine's inside, not an API for users.
package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/alerts"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/shutdown"
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
	StallAfter              time.Duration
	TimeoutGrace            time.Duration
	KeyBusyDelay            time.Duration
	ConfigRefreshInterval   time.Duration
	BindingRetryInterval    time.Duration
}

// ShutdownBudget is the drain bound in force: ShutdownTimeout when the
// session set one, else the group's MessageMax.Timeout (or the library's
// default timeout) plus TimeoutGrace, so a refresh that moves the ceiling
// moves the budget with it.
func ShutdownBudget(o Options, snap *groupconfig.Snapshot) func() time.Duration {
	return func() time.Duration {
		if o.ShutdownTimeout > 0 {
			return o.ShutdownTimeout
		}
		ceiling := snap.Group().Max.Timeout
		if ceiling <= 0 {
			ceiling = policy.DefaultTimeout
		}
		return ceiling + o.TimeoutGrace
	}
}

// Config is one session.
type Config struct {
	Store      *store.Store
	StreamID   int64
	GroupID    int64
	GroupName  string
	Workers    map[string]int64 // worker name → worker_config id
	DeclaredBy string
	Handler    claimer.Handler
	Options    Options
	// Patterns and Regexes are the declared binding set (normalized; empty
	// is the whole stream).
	Patterns []string
	Regexes  []string
	// Hub, if set, wakes the range claimer when the stream is produced to.
	Hub *Hub
	// Fault, if set, is called at the top of every claim (chaos tests).
	Fault func(site string) error
	// Alerts, if set, publishes the session's alert events (a binding wait,
	// a delivery stall) on the alerts actor's goroutine, fed by a bounded
	// queue the other actors never wait on.
	Alerts alerts.Publish
	// Health is the session's readiness and permanent-error sink; the
	// caller makes it so that its Readiness can watch it. nil: Run makes one.
	Health *outage.Health
	// Retry is the backoff of the actors' store calls after a failure.
	Retry  backoff.Policy
	Clock  clock.Clock
	Logger *slog.Logger
	Stats  *claimer.Stats
	// OnStart, if set, is called with the message consumer's instance id
	// once the instance rows exist and the actors are about to run.
	OnStart func(instanceID string)
	// Manager, if set, makes the fleet's maintenance workers' actor for
	// the session's tree (see actors/manager), bounded by its shutdown plan.
	Manager func(stop *shutdown.Plan) suture.Service
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

type serviceFunc func(ctx context.Context) error

func (f serviceFunc) Serve(ctx context.Context) error { return f(ctx) }

// drainable is an actor that stops on its own once its drain finishes.
type drainable struct {
	name  string
	serve func(ctx context.Context) error
	done  chan error
}

// Run consumes until ctx ends. It returns nil after a clean stop, and the
// error after a permanent store failure.
func Run(ctx context.Context, cfg Config) error {
	o := cfg.Options
	graceful := !o.DisableGracefulShutdown
	dbNow := DBNow(cfg.Clock)
	msgID, excID := NewID(), NewID()
	logger := cfg.Logger.With("group", cfg.GroupName, "instance", msgID)
	health := cfg.Health
	if health == nil {
		health = outage.NewHealth(cfg.Clock, o.InstanceTTL)
	}
	defer health.SetConsuming(false)
	plan := shutdown.New(cfg.Clock)
	var queue *alerts.Queue
	if cfg.Alerts != nil { // the alerts actor runs for the whole session, the binding wait included
		queue = alerts.NewQueue(&cfg.Stats.AlertsDropped)
		actx, stopAlerts := context.WithCancel(context.WithoutCancel(ctx))
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			_ = alerts.New(queue, cfg.Alerts, logger).Serve(actx)
		}()
		defer func() { stopAlerts(); <-stopped }()
	}

	liveness := heartbeat.NewLiveness()
	newBeat := func(id, worker string, liveness *heartbeat.Liveness) *heartbeat.Actor {
		return heartbeat.New(heartbeat.Config{Registered: true,
			Store: cfg.Store, StreamID: cfg.StreamID, WorkerConfigID: cfg.Workers[worker],
			InstanceID: id, DeclaredBy: cfg.DeclaredBy, TTL: o.InstanceTTL,
			Clock: cfg.Clock, Logger: logger.With("worker", worker), DBNow: dbNow, Liveness: liveness,
			Graceful: func() bool { return graceful }, Health: health, Retry: cfg.Retry, Stop: plan,
		})
	}
	snap := groupconfig.NewSnapshot(groupconfig.Declared{})
	ref := refresher.New(refresher.Config{Store: cfg.Store, GroupID: cfg.GroupID, Interval: o.ConfigRefreshInterval,
		Snapshot: snap, Clock: cfg.Clock, Logger: logger, Health: health, Retry: cfg.Retry})
	if err := firstRefresh(ctx, ref, cfg.Clock, o.ClaimPollRate); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first read: nothing was started
		}
		return fmt.Errorf("consume %s: read group config: %w", cfg.GroupName, err)
	}
	reg := registrar.New(registrar.Config{
		Store: cfg.Store, StreamID: cfg.StreamID, GroupID: cfg.GroupID, GroupName: cfg.GroupName,
		Patterns: cfg.Patterns, Regexes: cfg.Regexes, DeclaredBy: cfg.DeclaredBy,
		Instances: []store.InstanceInsert{
			{ID: msgID, WorkerConfigID: cfg.Workers[store.WorkerMessageConsumer], TTL: o.InstanceTTL},
			{ID: excID, WorkerConfigID: cfg.Workers[store.WorkerExceptionConsumer], TTL: o.InstanceTTL},
		},
		Interval: o.BindingRetryInterval, Clock: cfg.Clock, Logger: logger, DBNow: dbNow, Alerts: queue, Retry: cfg.Retry,
	})
	if _, err := reg.Run(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting: nothing was started
		}
		return fmt.Errorf("consume %s: declare bindings: %w", cfg.GroupName, err)
	}
	msgBeat := newBeat(msgID, store.WorkerMessageConsumer, liveness)
	excBeat := newBeat(excID, store.WorkerExceptionConsumer, nil)

	common := claimer.Common{
		Store: cfg.Store, StreamID: cfg.StreamID, GroupID: cfg.GroupID, Handler: cfg.Handler, Group: snap.Group,
		Concurrency: o.MessageConcurrency, PollRate: o.ClaimPollRate, Lease: o.InstanceTTL,
		KeyBusyDelay: o.KeyBusyDelay, TimeoutGrace: o.TimeoutGrace, ShutdownTimeout: ShutdownBudget(o, snap),
		Clock: cfg.Clock, Logger: logger, DBNow: dbNow, Stats: cfg.Stats, Drain: plan, Fault: cfg.Fault,
		Health: health, Retry: cfg.Retry,
	}
	rc := common
	rc.InstanceID = msgID
	var wake <-chan struct{}
	if cfg.Hub != nil {
		ch, unsubscribe := cfg.Hub.Subscribe(cfg.StreamID, cfg.Patterns)
		defer unsubscribe()
		wake = ch
	}
	cl := claimer.New(claimer.Config{Common: rc, BatchLimit: o.BatchLimit, QueueSize: o.QueueSize, StallAfter: o.StallAfter,
		Liveness: liveness, Alerts: queue, Wake: wake})
	ec := common
	ec.InstanceID = excID
	ex := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec})

	actors := []*drainable{
		{name: "claimer", serve: cl.Serve, done: make(chan error, 1)},
		{name: "exceptions", serve: ex.Serve, done: make(chan error, 1)},
	}
	sup := supervisor.New("consume:"+cfg.GroupName, logger)
	sup.Add(supervisor.Guard("heartbeat", msgBeat))
	sup.Add(supervisor.Guard("exception-heartbeat", excBeat))
	sup.Add(supervisor.Guard("refresher", ref))
	if cfg.Manager != nil {
		sup.Add(supervisor.Guard("manager", cfg.Manager(plan)))
	}
	for _, d := range actors {
		sup.Add(supervisor.Guard(d.name, serviceFunc(func(ctx context.Context) error {
			err := d.serve(ctx)
			if errors.Is(err, claimer.ErrDrained) { // the drain finished: stay down
				d.done <- nil
				return suture.ErrDoNotRestart
			}
			return err // anything else, during a drain too, is a reason to restart
		})))
	}
	supCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := sup.ServeBackground(supCtx)
	if cfg.OnStart != nil {
		cfg.OnStart(msgID)
	}
	health.SetConsuming(true)

	var cause error
	select {
	case <-ctx.Done():
	case err := <-done: // the tree gave up (restart budget exhausted)
		return fmt.Errorf("consume %s: %w", cfg.GroupName, err)
	case err := <-health.Fatal():
		cause = fmt.Errorf("consume %s: %w", cfg.GroupName, err)
	}
	health.SetConsuming(false)

	// The stop: a graceful drain within the plan, then the tree, within
	// ShutdownTimeout + shutdown.Grace in all.
	var errs []error
	if graceful {
		plan.Begin(ShutdownBudget(o, snap)())
		claimersBy := cfg.Clock.Timer(shutdown.Until(cfg.Clock, plan.HandlersWaitDeadline().Add(500*time.Millisecond)))
		defer claimersBy.Stop()
	wait:
		for _, d := range actors {
			select {
			case err := <-d.done:
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", d.name, err))
				}
			case err := <-done:
				return errors.Join(cause, fmt.Errorf("consume %s: %w", cfg.GroupName, err))
			case <-claimersBy.C: // a claimer still restarting or stuck: stop the tree anyway
				break wait
			}
		}
	}
	finalBy := cfg.Clock.Now().Add(shutdown.Grace)
	if plan.Begun() {
		finalBy = plan.Deadline()
	}
	stop()
	final := cfg.Clock.Timer(shutdown.Until(cfg.Clock, finalBy))
	defer final.Stop()
	select {
	case <-done:
	case <-final.C:
		codes.StopOverran.Log(ctx, logger, "session did not stop within ShutdownTimeout plus the shutdown grace; returning anyway",
			"grace", shutdown.Grace.String())
	}
	if cause != nil {
		return cause
	}
	if len(errs) > 0 {
		return fmt.Errorf("consume %s: %w", cfg.GroupName, errors.Join(errs...))
	}
	return nil
}

// firstRefresh reads the group's config before anything starts, retrying
// with backoff (at least every poll) while the database is unreachable (a
// restart during a deploy must not fail Consume). It returns the error when
// retrying cannot fix it, and ctx's error when ctx ends.
func firstRefresh(ctx context.Context, ref *refresher.Actor, clk clock.Clock, every time.Duration) error {
	rep := ref.Reporter()
	for {
		_, err := ref.Step(ctx)
		wait := rep.Report(ctx, err)
		if err == nil {
			return nil
		}
		if p := store.Permanent(err); p != nil {
			return p
		}
		t := clk.Timer(min(wait, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
