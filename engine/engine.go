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
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/c1702965/sqlstreams/actors/alerts"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/incarnation"
	"github.com/c1702965/sqlstreams/internal/observe"
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
// session set one, else the group's MessageMax.Timeout plus TimeoutGrace;
// without that ceiling, the timeout of a message that sets none (the
// group's Message.Timeout, clamped by MessageMin, or the library's
// default; decision 0070) plus TimeoutGrace. A refresh that moves them
// moves the budget with them.
func ShutdownBudget(o Options, snap *groupconfig.Snapshot) func() time.Duration {
	return func() time.Duration {
		if o.ShutdownTimeout > 0 {
			return o.ShutdownTimeout
		}
		g := snap.Group()
		ceiling := g.Max.Timeout
		if ceiling <= 0 {
			ceiling = policy.Resolve(policy.Options{}, g).Timeout
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
	StreamName string
	Workers    map[string]int64 // worker name → worker_config id
	// Observer, if set, receives the session's attempts, claims and counted
	// events (ClientConfig.Observer).
	Observer   observe.Observer
	DeclaredBy string
	Handler    claimer.Handler
	// TxHandler, if set instead of Handler, runs each message inside the
	// transaction that settles it (decision 0087).
	TxHandler claimer.TxHandler
	// Slabs, if set, is the client's pool of payload slabs; only a handler
	// that keeps no payload bytes past its return may be given one
	// (claimer.Common.Slabs).
	Slabs   *store.SlabPool
	Options Options
	// Leftovers, if set, is the consumer's: ranges and exception rows a
	// stopped session could not hand back, for this session to write.
	Leftovers *claimer.Leftovers
	// Patterns and Regexes are the declared binding set (normalized; empty
	// is the whole stream).
	Patterns []string
	Regexes  []string
	// DeclaredAt, if set, is when this declarer's first attempt at the
	// binding set was made and waited (Register's one attempt): the
	// session's attempts carry it, so the row that ends the wait records the
	// whole wait (seed 000: declared_at is constant across a declarer's
	// retries).
	DeclaredAt *time.Time
	// Declared, if set, is told once the session's binding set is installed
	// or joined: the wait DeclaredAt began is over.
	Declared func()
	// Shared, if set, is the client's (NewShared): its hub wakes the
	// claimers when the stream is produced to, and every session's
	// heartbeats and config refreshes run together. nil: each alone, no
	// wake-ups.
	Shared *Shared
	// Hooks are the session's test hooks (internal/hooks); nil in
	// production.
	Hooks *hooks.Hooks
	// Alerts, if set, publishes the session's alert events (a binding wait,
	// a delivery stall) on the alerts actor's goroutine, fed by a bounded
	// queue the other actors never wait on.
	Alerts alert.Publish
	// Health is the session's readiness and permanent-error sink; the
	// caller makes it so that its Readiness can watch it. nil: Run makes one.
	Health *outage.Health
	// EndSession, if set, is called once as Run returns, with a context
	// bounded by the session's shutdown plan (Plan.EndContext): what it
	// does on the database (store.Session's end: the lanes' restores) keeps
	// Run within ShutdownTimeout plus shutdown.Grace.
	EndSession func(ctx context.Context)
	// Retry is the backoff of the actors' store calls after a failure.
	Retry  backoff.Policy
	Clock  clocks.Clock
	Logger *slog.Logger
	Stats  *claimer.Stats
	// Manager, if set, makes the fleet's maintenance workers' actor for
	// the session's tree (see actors/manager), bounded by its shutdown plan.
	Manager func(stop *shutdown.Plan, outages *outage.Log) suture.Service
}

// DBNow returns the explicit database time for statements: nil under a real
// clock (the database's now() decides), the mock's time under a mock clock.
func DBNow(c clocks.Clock) func() store.Now {
	if _, ok := c.(*clocks.Mock); !ok {
		return func() store.Now { return nil }
	}
	return func() store.Now { t := c.Now(); return &t }
}

// NewID returns a random UUID (version 4) as text.
func NewID() string { return store.NewID() }

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
//
// A session runs as a sequence of incarnations. Each registers through the
// registrar (the binding check included) under new instance ids and runs its
// own actor tree. When a heartbeat finds its instance row lapsed or gone (the
// process stalled past its TTL: a long GC pause, a frozen container, a
// partition), the incarnation is lost: other instances may hold its leases
// already. Its tree is stopped at once (its claimers' state goes with it:
// ranges, key queues, pending commits), nothing more of it starts (the
// claimers wait on the incarnation's Liveness before every handler), and
// the session registers again as if it had just started. A handler already
// running when the stall began cannot be recalled; its late outcome settles
// nothing, because every settlement names its lease's token.
func Run(ctx context.Context, cfg Config) error {
	o := cfg.Options
	dbNow := DBNow(cfg.Clock)
	logger := cfg.Logger.With("group", cfg.GroupName)
	health := cfg.Health
	if health == nil {
		health = outage.NewHealth(cfg.Clock, o.InstanceTTL)
	}
	health.OnFailure(cfg.Store.ResetIfDisrupted)
	defer health.SetConsuming(false)
	s := &session{cfg: cfg, o: o, dbNow: dbNow, logger: logger, health: health, plan: shutdown.New(cfg.Clock)}
	hub, beats, reads := cfg.Shared.parts(cfg.Hooks)
	s.beats = beats
	if cfg.EndSession != nil {
		defer func() {
			ectx, cancel := s.plan.EndContext(ctx, cfg.Clock)
			defer cancel()
			cfg.EndSession(ectx)
		}()
	}
	if cfg.Alerts != nil { // the alerts actor runs for the whole session, the binding wait included
		s.queue = alert.NewQueue(&cfg.Stats.AlertsDropped)
		if obs := cfg.Observer; obs != nil {
			s.queue.OnDrop = func() { obs.Count(cfg.StreamName, cfg.GroupName, observe.AlertDropped, 1) }
		}
		actx, stopAlerts := context.WithCancel(context.WithoutCancel(ctx))
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			_ = alerts.New(s.queue, cfg.Alerts, logger).Serve(actx)
		}()
		defer func() { stopAlerts(); <-stopped }()
	}
	s.snap = groupconfig.NewSnapshot(groupconfig.Declared{})
	s.ref = refresher.New(refresher.Config{Store: cfg.Store, GroupID: cfg.GroupID, Interval: o.ConfigRefreshInterval, Reads: reads,
		Snapshot: s.snap, Clock: cfg.Clock, Logger: logger, Health: health, Retry: cfg.Retry})
	if err := firstRefresh(ctx, s.ref, cfg.Clock, o.ClaimPollRate); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first read: nothing was started
		}
		return fmt.Errorf("consume %s: %w", cfg.GroupName, err) // the store names the read
	}
	s.reg = registrar.New(registrar.Config{
		Store: cfg.Store, StreamID: cfg.StreamID, GroupID: cfg.GroupID, GroupName: cfg.GroupName,
		Patterns: cfg.Patterns, Regexes: cfg.Regexes, DeclaredBy: cfg.DeclaredBy,
		Interval: o.BindingRetryInterval, Clock: cfg.Clock, Logger: logger, DBNow: dbNow, Alerts: s.queue, Retry: cfg.Retry,
		DeclaredAt: cfg.DeclaredAt, Hooks: cfg.Hooks, Observer: cfg.Observer, StreamName: cfg.StreamName, Outages: health.Outages(),
	})
	if hub != nil {
		wakes, unsubscribe := hub.Subscribe(cfg.StreamID, cfg.GroupID, cfg.Patterns)
		defer unsubscribe()
		s.wake, s.listening = wakes, hub.Listening
	}
	for n := 1; ; n++ {
		lapsed, err := s.incarnation(ctx, n)
		if !lapsed {
			return err
		}
		codes.IncarnationLost.Log(ctx, logger, "instance lapsed (its row expired or was gone at renewal); registering again as a new incarnation",
			"incarnation", n)
	}
}

// session is what a Consume session's incarnations share.
type session struct {
	cfg    Config
	o      Options
	dbNow  func() store.Now
	logger *slog.Logger
	health *outage.Health
	plan   *shutdown.Plan
	queue  *alert.Queue
	snap   *groupconfig.Snapshot
	ref    *refresher.Actor
	reg    *registrar.Actor
	wake   Wakes
	// listening reports whether the hub's listener is up (nil: no hub);
	// beats are the client's heartbeat batches (nil: each renews alone).
	listening func() bool
	beats     *heartbeat.Beats
}

// incarnation registers the session under new instance ids and runs its
// tree until ctx ends, a permanent error, or the incarnation is lost
// (lapsed: the caller registers again).
func (s *session) incarnation(ctx context.Context, n int) (lapsed bool, err error) {
	cfg, o := s.cfg, s.o
	graceful := !o.DisableGracefulShutdown
	msgID, excID := NewID(), NewID()
	logger := s.logger.With("instance", msgID)
	s.reg.SetInstances([]store.InstanceInsert{
		{ID: msgID, WorkerConfigID: cfg.Workers[store.WorkerMessageConsumer], TTL: o.InstanceTTL},
		{ID: excID, WorkerConfigID: cfg.Workers[store.WorkerExceptionConsumer], TTL: o.InstanceTTL},
	})
	if err := s.register(ctx); err != nil {
		if ctx.Err() != nil {
			return false, nil // stopped while waiting: nothing was started
		}
		return false, fmt.Errorf("consume %s: declare bindings: %w", cfg.GroupName, err)
	}
	if cfg.Declared != nil {
		cfg.Declared()
	}
	if n > 1 || s.reg.Waited() {
		// The config may have moved while the session waited or stalled:
		// the first claims use it, not the copy read before (seed 001: the
		// staleness window is one refresh interval). A failed read keeps
		// the last copy, and the refresher retries.
		_, err := s.ref.Step(ctx)
		s.ref.Reporter().Report(ctx, err)
	}
	msgLive, excLive := incarnation.NewLiveness(cfg.Clock, o.InstanceTTL), incarnation.NewLiveness(cfg.Clock, o.InstanceTTL)
	msgLive.Start(s.reg.Sent())
	excLive.Start(s.reg.Sent())
	msgHold, excHold := &claimer.Holdings{}, &claimer.Holdings{}
	msgAlarm, excAlarm := make(chan struct{}, 1), make(chan struct{}, 1)
	newBeat := func(id, worker string, kinds store.LeaseKinds, live *incarnation.Liveness, hold *claimer.Holdings, alarm chan struct{}) *heartbeat.Actor {
		return heartbeat.New(heartbeat.Config{Registered: true, Holds: hold.May, Leases: kinds, Beats: s.beats, PeerLapsed: func() {
			select {
			case alarm <- struct{}{}:
			default: // one is pending already
			}
		},
			Store: cfg.Store, StreamID: cfg.StreamID, WorkerConfigID: cfg.Workers[worker],
			InstanceID: id, DeclaredBy: cfg.DeclaredBy, TTL: o.InstanceTTL,
			Clock: cfg.Clock, Logger: logger.With("worker", worker), DBNow: s.dbNow, Liveness: live,
			Graceful: func() bool { return graceful }, Health: s.health, Retry: cfg.Retry, Stop: s.plan,
		})
	}
	common := claimer.Common{
		Leftovers: cfg.Leftovers, Store: cfg.Store, Slabs: cfg.Slabs, StreamID: cfg.StreamID, GroupID: cfg.GroupID, Handler: cfg.Handler, TxHandler: cfg.TxHandler, Group: s.snap.Group,
		Concurrency: o.MessageConcurrency, PollRate: o.ClaimPollRate, Lease: o.InstanceTTL,
		KeyBusyDelay: o.KeyBusyDelay, TimeoutGrace: o.TimeoutGrace, ShutdownTimeout: ShutdownBudget(o, s.snap),
		Clock: cfg.Clock, Logger: logger, DBNow: s.dbNow, Stats: cfg.Stats, Drain: s.plan, Hooks: cfg.Hooks,
		Health: s.health, Retry: cfg.Retry, Observer: cfg.Observer, StreamName: cfg.StreamName, GroupName: cfg.GroupName,
		Nudge: &claimer.Nudge{},
	}
	common.Listening = s.listening
	rc := common
	rc.InstanceID, rc.Liveness, rc.Holdings = msgID, msgLive, msgHold
	if s.beats != nil { // the alarms come with the process's beats
		rc.Alarm = msgAlarm
	}
	cl := claimer.New(claimer.Config{Common: rc, BatchLimit: o.BatchLimit, QueueSize: o.QueueSize, StallAfter: o.StallAfter,
		Alerts: s.queue, Wake: s.wake.Ranges, WorkerConfigID: cfg.Workers[store.WorkerMessageConsumer]})
	ec := common
	ec.InstanceID, ec.Liveness, ec.Holdings = excID, excLive, excHold
	if s.beats != nil {
		ec.Alarm = excAlarm
	}
	ex := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec, Prefetch: o.BatchLimit, Wake: s.wake.Exceptions})

	actors := []*drainable{
		{name: "claimer", serve: cl.Serve, done: make(chan error, 1)},
		{name: "exceptions", serve: ex.Serve, done: make(chan error, 1)},
	}
	sup := supervisor.New("consume:"+cfg.GroupName, logger, cfg.Hooks)
	sup.Add("heartbeat", newBeat(msgID, store.WorkerMessageConsumer, store.RangeLeases, msgLive, msgHold, msgAlarm))
	sup.Add("exception-heartbeat", newBeat(excID, store.WorkerExceptionConsumer, store.ExceptionLeases, excLive, excHold, excAlarm))
	sup.Add("refresher", s.ref)
	if cfg.Manager != nil {
		sup.Add("manager", cfg.Manager(s.plan, s.health.Outages()))
	}
	for _, d := range actors {
		sup.Add(d.name, serviceFunc(func(ctx context.Context) error {
			err := d.serve(ctx)
			if errors.Is(err, claimer.ErrDrained) { // the drain finished: stay down
				d.done <- nil
				return suture.ErrDoNotRestart
			}
			return err // anything else, during a drain too, is a reason to restart
		}))
	}
	if n > 1 {
		// The lost incarnation's actors will never report a recovery; and
		// the new tree's claimers take no expired lease over for a while
		// (claimer.TakeoverGrace): the instances cut off with this one
		// record what they settled first.
		s.health.Forget()
	}
	supCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := sup.ServeBackground(supCtx)
	cfg.Hooks.OnStarted(msgID)
	s.health.SetConsuming(true)

	var cause error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-done: // the tree gave up (restart budget exhausted)
			return false, fmt.Errorf("consume %s: %w", cfg.GroupName, err)
		case err := <-s.health.Fatal():
			cause = fmt.Errorf("consume %s: %w", cfg.GroupName, err)
			break wait
		case <-msgLive.C():
		case <-excLive.C():
		}
		if msgLive.Lost() || excLive.Lost() {
			// Lost: stop this tree at once (its leases may be another
			// instance's by now), and register again. Both workers'
			// incarnations end, so both claimers salvage what they
			// settled and leave the rest to the next incarnation, the one
			// whose row was still live too.
			msgLive.Lose()
			excLive.Lose()
			s.health.SetConsuming(false)
			stop()
			s.waitTree(ctx, done, logger, cfg.Clock.Now().Add(shutdown.Grace))
			return true, nil
		}
	}
	s.health.SetConsuming(false)

	// The stop: a graceful drain within the plan, then the tree, within
	// ShutdownTimeout + shutdown.Grace in all.
	var errs []error
	if graceful {
		s.plan.Begin(ShutdownBudget(o, s.snap)())
		claimersBy := cfg.Clock.Timer(shutdown.Until(cfg.Clock, s.plan.HandlersWaitDeadline().Add(500*time.Millisecond)))
		defer claimersBy.Stop()
	drain:
		for _, d := range actors {
			select {
			case err := <-d.done:
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", d.name, err))
				}
			case err := <-done:
				return false, errors.Join(cause, fmt.Errorf("consume %s: %w", cfg.GroupName, err))
			case <-claimersBy.C(): // a claimer still restarting or stuck: stop the tree anyway
				break drain
			}
		}
	}
	finalBy := cfg.Clock.Now().Add(shutdown.Grace)
	if s.plan.Begun() {
		finalBy = s.plan.Deadline()
	}
	stop()
	s.waitTree(ctx, done, logger, finalBy)
	if cause != nil {
		return false, cause
	}
	if len(errs) > 0 {
		return false, fmt.Errorf("consume %s: %w", cfg.GroupName, errors.Join(errs...))
	}
	return false, nil
}

// register runs the registrar until the session's binding set is installed
// or joined, under a supervisor of its own like every other actor: a panic
// restarts it (the actor outlives its Serve, so declared_at and the wait's
// start carry over), an outage is its Run's backoff, and a permanent error
// is returned. It runs before the session's tree, which it decides to start.
func (s *session) register(ctx context.Context) error {
	result := make(chan error, 1)
	sup := supervisor.New("register:"+s.cfg.GroupName, s.logger, s.cfg.Hooks)
	sup.Add("registrar", serviceFunc(func(ctx context.Context) error {
		_, err := s.reg.Run(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		result <- err // nil, or an error retrying cannot fix
		return suture.ErrDoNotRestart
	}))
	sctx, stop := context.WithCancel(ctx)
	done := sup.ServeBackground(sctx)
	select {
	case err := <-result:
		stop()
		s.waitTree(ctx, done, s.logger, s.cfg.Clock.Now().Add(shutdown.Grace))
		return err
	case <-ctx.Done():
		stop()
		s.waitTree(ctx, done, s.logger, s.cfg.Clock.Now().Add(shutdown.Grace))
		return ctx.Err()
	case err := <-done: // the supervisor gave up (restart budget exhausted)
		stop()
		return err
	}
}

// waitTree waits for a stopped tree until by, and says so if it overran.
func (s *session) waitTree(ctx context.Context, done <-chan error, logger *slog.Logger, by time.Time) {
	final := s.cfg.Clock.Timer(shutdown.Until(s.cfg.Clock, by))
	defer final.Stop()
	select {
	case <-done:
	case <-final.C():
		codes.StopOverran.Log(ctx, logger, "session did not stop within ShutdownTimeout plus the shutdown grace; returning anyway",
			"grace", shutdown.Grace.String())
	}
}

// firstRefresh reads the group's config before anything starts, retrying
// with backoff (at least every poll) while the database is unreachable (a
// restart during a deploy must not fail Consume). It returns the error when
// retrying cannot fix it, and ctx's error when ctx ends.
func firstRefresh(ctx context.Context, ref *refresher.Actor, clk clocks.Clock, every time.Duration) error {
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
		case <-t.C():
		}
	}
}
