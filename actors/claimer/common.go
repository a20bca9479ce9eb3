package claimer

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/incarnation"
	"github.com/c1702965/sqlstreams/internal/observe"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Stats are the actors' counters, safe to read while they run.
type Stats struct {
	Claimed     atomic.Int64 // messages handed to workers from ranges
	Reclaimed   atomic.Int64 // ranges taken over from an expired lease
	Quarantined atomic.Int64 // ranges split into exception rows
	Succeeded   atomic.Int64
	Failed      atomic.Int64 // failed attempts (errors, panics, timeouts)
	Dead        atomic.Int64 // messages that became dead letters
	Delayed     atomic.Int64
	Deferred    atomic.Int64 // keyed messages parked behind a busy or blocked key
	Retried     atomic.Int64 // exception attempts started
	Panics      atomic.Int64
	TimedOut    atomic.Int64
	Abandoned   atomic.Int64 // handlers that ignored their context past the grace
	Committed   atomic.Int64 // ranges committed
	LeasesLost  atomic.Int64 // commits fenced off by a reclaimer
	// ProgressRecorded counts settled prefixes recorded on ranges still in
	// flight (RecordProgress).
	ProgressRecorded atomic.Int64
	Stalls           atomic.Int64 // claims held back by an open transaction past StallAfter
	// AlertsDropped counts alert events a full alerts queue dropped.
	AlertsDropped atomic.Int64
	// KeyGates counts key gates granted; KeyGatesGivenUp those given up
	// because others wanted the keys (decision 0051).
	KeyGates, KeyGatesGivenUp atomic.Int64
}

// Common is what both actors need.
type Common struct {
	// Leftovers, if set, is the consumer's: what a session whose drain
	// could not hand its work back leaves for the next one to write.
	Leftovers *Leftovers
	Store     *store.Store
	// Slabs, if set, is the client's pool of payload slabs: the range
	// claimer claims into it and gives a range's slabs back once it has
	// committed the range and no handler of it may still run. Set only when
	// the handler keeps no payload bytes past its return (the consumer's
	// decoders copy what they keep).
	Slabs      *store.SlabPool
	StreamID   int64
	GroupID    int64
	InstanceID string
	Handler    Handler
	// TxHandler, if set instead of Handler, runs each message inside the
	// transaction that settles it (tx.go, decision 0087).
	TxHandler TxHandler
	// Group returns the group config in force now. It is read at each claim
	// and exception write and never from the database on the claim path.
	Group func() policy.Group
	// Concurrency is the number of handler workers.
	Concurrency int
	// PollRate is how often an idle actor looks for work.
	PollRate time.Duration
	// Lease is the lease length written on a claim; the heartbeat renews it.
	Lease time.Duration
	// KeyBusyDelay is how long a keyed message waits before trying a busy
	// key again.
	KeyBusyDelay time.Duration
	// TimeoutGrace is how long a handler may outlive its Timeout before it
	// is abandoned.
	TimeoutGrace time.Duration
	// ShutdownTimeout bounds how long a stopping handler pool waits for
	// handlers that ignore their context outside a drain (a drain's bound is
	// the shutdown plan's).
	ShutdownTimeout func() time.Duration
	Clock           clocks.Clock
	Logger          *slog.Logger
	DBNow           func() store.Now
	Stats           *Stats
	// Observer receives attempts, claims and their durations (nil: none),
	// labelled with StreamName and GroupName.
	Observer              observe.Observer
	StreamName, GroupName string
	// Drain is the session's shutdown plan: when it begins, the actor stops
	// claiming, lets in-flight handlers finish until its handlers' deadline,
	// and hands the rest back within its hand-back deadline. nil never
	// drains.
	Drain *shutdown.Plan
	// Liveness is the instance's incarnation (its heartbeat's): nothing is
	// claimed while it is not valid, and no handler starts until it is (a
	// process resuming after a stall longer than its lease starts nothing
	// before a renewal proves its leases are its own; a lost incarnation
	// starts nothing more). nil: always valid (step-driven tests).
	Liveness *incarnation.Liveness
	// Health, if set, is the session's readiness and permanent-error sink:
	// the actor reports every store call's result to it.
	Health *outage.Health
	// Retry is the backoff after a failed store call (zero: the default).
	Retry backoff.Policy
	// Listening, if set, reports whether the client's LISTEN connection is
	// up: while it is, a quiet actor skips its poll ticks (decision 0038;
	// quiet.go). nil: never quiet (the simulator, step-driven tests).
	Listening func() bool
	// Alarm, if set, receives a value when another instance of the actor's
	// worker lapsed lately (its heartbeat's renewal says so: decision
	// 0040): the actor sweeps for its leases. With it, a quiet actor skips
	// most reconcile ticks' sweeps too (QuietSweepEvery).
	Alarm <-chan struct{}
	// Holdings, if set, is told whether the actor may hold leases, for its
	// heartbeat (Holdings).
	Holdings *Holdings
	// Nudge, if set, is shared by a session's two claimers: the range
	// claimer gives it when it writes exception rows, the exception claimer
	// takes it.
	Nudge *Nudge
	// Hooks are the session's test hooks (nil in production): steps that
	// fail or panic on demand, traces, signals, settings only tests change
	// (KeyHold, QuietSweeps) and the simulator's broken switches.
	Hooks *hooks.Hooks
}

// Config is the range claimer's config.
type Config struct {
	Common
	// BatchLimit is the most messages one claim takes.
	BatchLimit int
	// QueueSize bounds messages claimed and not yet settled; a claim
	// happens only when a whole batch fits.
	QueueSize int
	// StallAfter is how long claims may find rows held back by an open
	// transaction before the stall is logged and counted.
	StallAfter time.Duration
	// Wake, if set, receives a value when the stream is produced to: the
	// claimer claims at once instead of at its next poll.
	Wake <-chan struct{}
	// Alerts, if set, is told of each stall once, with when it began.
	Alerts *alert.Queue
	// WorkerConfigID is the range claimers' worker row of the group: the
	// claimer asks for the group's key gate (decision 0051) only while no
	// other live instance of it runs. 0: never asked for (step-driven
	// tests that read key-lease rows).
	WorkerConfigID int64
}

// doneUnrecorded lists the ids of the range's messages with an outcome not

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// keyHold is how long the range claimer keeps an exclusive key's lease
// after the last range using it settled, while no key it wanted was busy in
// another instance lately: the next range bringing the key runs it without
// writing a lease again (decision 0045). DefaultKeyHold unless the hooks
// set one (negative: released with the last range using it).
func (c *Common) keyHold() time.Duration {
	if h := c.Hooks.Hold(); h != 0 {
		return h
	}
	return DefaultKeyHold
}

func (c *Common) observer() observe.Observer { return observe.Or(c.Observer) }

// observeAttempt hands one finished attempt to the observer; attempts is
// the count before it.
func (c *Common) observeAttempt(o Outcome, next policy.Next, attempts int, producedAt time.Time) {
	if c.Observer == nil {
		return
	}
	out := observe.Error
	kind, _ := policy.Classify(o.Err)
	switch {
	case o.Err == nil:
		out = observe.Success
	case kind == policy.Terminal:
		out = observe.Terminal
	case kind == policy.Delay && next.Attempts == attempts:
		out = observe.Delay
	case errors.Is(o.Err, policy.ErrTimeout):
		out = observe.Timeout
	case errors.Is(o.Err, policy.ErrPanic):
		out = observe.Panic
	}
	c.Observer.AttemptDone(observe.Attempt{Stream: c.StreamName, Group: c.GroupName, Outcome: out, Attempt: attempts + 1,
		Dead: next.Status == policy.StatusDead, Duration: o.Duration, SinceProduced: max(0, o.Started.Sub(producedAt))})
}

// count records an attempt's result; attempts is the count before it.
func (s *Stats) count(next policy.Next, err error, attempts int) {
	kind, _ := policy.Classify(err)
	switch {
	case next.Delete:
		s.Succeeded.Add(1)
	case kind == policy.Delay && next.Attempts == attempts:
		s.Delayed.Add(1)
	default:
		s.Failed.Add(1)
	}
	if next.Status == policy.StatusDead {
		s.Dead.Add(1)
	}
}

// newRunner returns the handler runner of an actor with this config: a
// handler starts only once the incarnation is valid.
func (c *Common) newRunner() *runner {
	r := &runner{handler: c.Handler, clock: c.Clock, grace: c.TimeoutGrace, stats: c.Stats}
	if th := c.TxHandler; th != nil {
		r.handler = func(ctx context.Context, d *Delivery) error { return th(ctx, d.Tx, d) }
		r.tx = &txMode{pool: c.Store.Pool(), batch: MaxTxBatch} // its settler is the actor's
	}
	if c.Liveness != nil {
		r.gate = c.Liveness.Wait
	}
	return r
}

// reporter returns the actor's outage reporter: once-per-outage logging,
// the backoff, and the session's health. answered counts the actor's store
// calls the database answered: a step that made none (most outcomes, a
// claim held back) says nothing of an outage.
func (c *Common) reporter(what string, answered *atomic.Uint64) *outage.Reporter {
	return &outage.Reporter{Logger: c.Logger, What: what, Retry: "with backoff", Attrs: []any{"group_id", c.GroupID},
		Health: c.Health, Backoff: backoff.Backoff{Policy: c.Retry}, Reached: answered.Load}
}
