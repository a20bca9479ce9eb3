// Package manager runs the fleet's maintenance workers (retention today).
// The manager owns no config: each worker's knobs, including how many
// instances the fleet should run, are a metadata document on the worker's
// worker_config row, read when the worker is provisioned and again at every
// heartbeat, so a redeclaration reaches the running worker within one
// heartbeat interval.
//
// Provisioning: a process takes an instance slot of a worker (a
// worker_instance row) under the worker row's lock, and only while the live
// count is below the target, heartbeats it, and gives it back on a graceful
// stop. When a holder dies, its row lapses after TTL and the next
// provisioning step of any manager takes the slot over.
//
// Step runs one provisioning-and-work round synchronously (what tests and
// the simulator drive); Serve runs it on a ticker.
//
// It is part of the engine's inside, not an API for users.
package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Resolved are a worker's knobs with every default applied: the typed
// document of internal/settings.
type Resolved = settings.Resolved

// Worker is one kind of maintenance work.
type Worker interface {
	// Name is the worker's worker_config name.
	Name() string
	// Round does one bounded round of work under the current knobs.
	Round(ctx context.Context, k Resolved) error
}

// Config is the manager's.
type Config struct {
	Store      *store.Store
	Workers    []Worker
	DeclaredBy string
	// TTL is the instance heartbeat TTL; heartbeats (and provisioning
	// attempts) run every TTL/3.
	TTL    time.Duration
	NewID  func() string
	Clock  clocks.Clock
	Logger *slog.Logger
	DBNow  func() store.Now
	// Stop, if set, bounds the give-back of the slots at a stop (the
	// session's shutdown plan); without it the give-back gets shutdown.Grace.
	Stop *shutdown.Plan
	// Outages, if set, is the session's outage log: the manager's outages
	// are logged with the session's, once (outage.Log); without it, its own.
	Outages *outage.Log
}

type slot struct {
	instanceID string
	knobs      Resolved
	lastRound  time.Time
	ran        bool
}

// Actor is the manager.
type Actor struct {
	cfg  Config
	rows map[string]store.FleetWorker
	held map[string]*slot
	// unseen: per worker, the instance id of a provisioning that returned
	// an error, whose insert may have committed all the same (its context
	// ended while the commit was under way). The next step takes the row
	// up if it is there, and a stop gives it back.
	unseen map[string]string
	outage *outage.Reporter
	// rounds counts rounds of work done per worker (Rounds).
	rounds map[string]int
}

// Rounds reports how many rounds of work the worker called name has done on
// this manager. Only the manager's own goroutine (Step) changes it: read it
// between steps.
func (a *Actor) Rounds(name string) int { return a.rounds[name] }

// Standard returns a manager of the library's workers: retention, prune and
// the scheduler (cfg.Workers is replaced).
func Standard(cfg Config) *Actor {
	cfg.Workers = []Worker{
		&Retention{Store: cfg.Store, DBNow: cfg.DBNow, Logger: cfg.Logger},
		&Prune{Store: cfg.Store, DBNow: cfg.DBNow},
		&Scheduler{Store: cfg.Store, Clock: cfg.Clock, DBNow: cfg.DBNow},
	}
	return New(cfg)
}

// New returns a manager.
func New(cfg Config) *Actor {
	return &Actor{cfg: cfg, rows: map[string]store.FleetWorker{}, held: map[string]*slot{}, unseen: map[string]string{}, rounds: map[string]int{},
		outage: &outage.Reporter{Logger: cfg.Logger, What: "manager", Retry: "every heartbeat", Outages: cfg.Outages}}
}

// Workers returns the manager's workers.
func (a *Actor) Workers() []Worker { return a.cfg.Workers }

// Holds reports whether this manager holds an instance slot of the worker.
func (a *Actor) Holds(name string) bool { return a.held[name] != nil }

// Interval is how often Serve steps.
func (a *Actor) Interval() time.Duration { return a.cfg.TTL / 3 }

// Step renews or provisions each worker's slot, refreshes its knobs, and
// runs a round of every held worker whose interval has passed.
func (a *Actor) Step(ctx context.Context) error {
	var errs []error
	for _, w := range a.cfg.Workers {
		if err := a.step(ctx, w); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w.Name(), err))
		}
	}
	return errors.Join(errs...)
}

func (a *Actor) step(ctx context.Context, w Worker) error {
	name := w.Name()
	row, ok := a.rows[name]
	if !ok {
		var err error
		if row, err = a.cfg.Store.EnsureFleetWorker(ctx, name, []byte(`{}`), a.cfg.DBNow()); err != nil {
			return err
		}
		a.rows[name] = row
	}
	s := a.held[name]
	var doc []byte
	ahead := 0
	if id, ok := a.unseen[name]; ok && s == nil {
		found, d, n, err := a.cfg.Store.RenewSlot(ctx, id, a.cfg.TTL, a.cfg.DBNow())
		if err != nil {
			return err
		}
		delete(a.unseen, name)
		if found { // the provisioning had committed: the slot is this manager's
			s = &slot{instanceID: id}
			a.held[name] = s
			doc, ahead = d, n
		}
	} else if s != nil {
		found, d, n, err := a.cfg.Store.RenewSlot(ctx, s.instanceID, a.cfg.TTL, a.cfg.DBNow())
		if err != nil {
			return err
		}
		if !found {
			codes.ManagerSlotLost.Log(ctx, a.cfg.Logger, "manager lost its worker slot (its heartbeat lapsed); another process may run it now", "worker", name)
			delete(a.held, name)
			s = nil
		}
		doc, ahead = d, n
	}
	if s == nil {
		id := a.cfg.NewID()
		got, d, err := a.cfg.Store.ProvisionSlot(ctx, store.ProvisionSlotParams{
			WorkerConfigID: row.ID, InstanceID: id, DeclaredBy: a.cfg.DeclaredBy, TTL: a.cfg.TTL, Now: a.cfg.DBNow()})
		if err != nil {
			a.unseen[name] = id
			return err
		}
		if !got {
			return nil
		}
		s = &slot{instanceID: id}
		a.held[name] = s
		doc = d
	}
	var def time.Duration
	if d, ok := w.(interface{ DefaultInterval() time.Duration }); ok {
		def = d.DefaultInterval()
	}
	knobs, err := settings.Resolve(doc, def)
	if err != nil {
		codes.BadWorkerKnobs.Log(ctx, a.cfg.Logger, "worker metadata has unreadable knobs; their defaults apply", "worker", name, "error", err)
	}
	s.knobs = knobs
	// Suspended, or the target was lowered below the older holders: give
	// the slot back.
	if knobs.Instances == 0 || ahead >= knobs.Instances {
		if err := a.cfg.Store.DeleteInstance(ctx, s.instanceID); err != nil {
			return err
		}
		delete(a.held, name)
		return nil
	}
	now := a.cfg.Clock.Now()
	if s.ran && now.Sub(s.lastRound) < knobs.Interval {
		return nil
	}
	// A worker whose interval is longer than a step asks the fleet whether
	// its round is due (store.BeginRound): the interval is the fleet's
	// cadence, so a holder new to the slot does not repeat the round its
	// predecessor did a moment ago. A shorter interval makes every step a
	// round; there is nothing to pace.
	if knobs.Interval > a.Interval() {
		due, since, err := a.cfg.Store.BeginRound(ctx, row.ID, knobs.Interval, a.cfg.DBNow())
		if err != nil {
			return err
		}
		if !due {
			s.ran, s.lastRound = true, now.Add(-since)
			return nil
		}
	}
	s.ran, s.lastRound = true, now
	a.rounds[name]++
	return w.Round(ctx, knobs)
}

// Release gives back every held slot (a graceful stop), and every slot
// whose provisioning it did not see end (unseen), which may have committed.
func (a *Actor) Release(ctx context.Context) error {
	var errs []error
	for name, s := range a.held {
		if err := a.cfg.Store.DeleteInstance(ctx, s.instanceID); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(a.held, name)
	}
	for name, id := range a.unseen {
		if err := a.cfg.Store.DeleteInstance(ctx, id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(a.unseen, name)
	}
	return errors.Join(errs...)
}

// Serve steps every TTL/3 until ctx ends, then gives its slots back, within
// the session's shutdown plan (Config.Stop; shutdown.Grace without one).
func (a *Actor) Serve(ctx context.Context) error {
	t := a.cfg.Clock.Ticker(a.Interval())
	defer t.Stop()
	for {
		a.outage.Report(ctx, a.Step(ctx))
		select {
		case <-ctx.Done():
			dctx, cancel := a.cfg.Stop.Context(ctx, a.cfg.Clock, true)
			defer cancel()
			if err := a.Release(dctx); err != nil {
				codes.ManagerGiveBackFailed.Log(ctx, a.cfg.Logger, "manager could not give its worker slots back; they lapse after the TTL", "error", err)
			}
			return ctx.Err()
		case <-t.C():
		}
	}
}
