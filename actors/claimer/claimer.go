// Package claimer holds the actors that turn a group's log into handler
// calls: the range claimer (this file) and the exception claimer
// (exceptions.go), which share the handler runner (runner.go).
//
// The range claimer claims ranges (one short transaction each), resolves
// every message's policy against the group config of that moment (pinned for
// the message's whole life), leases the keys of exclusive and ordered
// messages, and hands jobs to a pool of handler workers. When every message
// of a range has an outcome the range is committed in one statement: lease
// deleted by token, failures and deferrals written as exception rows, key
// leases released.
//
// The step functions (Claim, Outcome, Run, Flush, HandBack) do their store
// calls synchronously and are what tests and the simulator drive; Serve is
// the thin loop that runs them on a ticker in production.
//
// It is part of the engine's inside, not an API for users.
package claimer

import (
	"context"
	"errors"
	"fmt"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/observe"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/alerts"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/wakeup"
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
	// KeyHold is how long the range claimer keeps an exclusive key's lease
	// after the last range using it settled, while no key it wanted was
	// busy in another instance lately: the next range bringing the key runs
	// it without writing a lease again (decision 0045). 0: DefaultKeyHold;
	// negative: released with the last range using it.
	KeyHold time.Duration
	// TimeoutGrace is how long a handler may outlive its Timeout before it
	// is abandoned.
	TimeoutGrace time.Duration
	// ShutdownTimeout bounds how long a stopping handler pool waits for
	// handlers that ignore their context outside a drain (a drain's bound is
	// the shutdown plan's).
	ShutdownTimeout func() time.Duration
	Clock           clock.Clock
	Logger          *slog.Logger
	DBNow           func() store.Now
	Stats           *Stats
	// Observer receives attempts, claims and their durations (nil: none),
	// labelled with StreamName and GroupName.
	Observer              observe.Observer
	StreamName, GroupName string
	// Fault, if set, is called at the top of every claim: chaos tests make
	// it panic or fail to show the supervisor restarts the actor.
	Fault func(site string) error
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
	Liveness *heartbeat.Liveness
	// Health, if set, is the session's readiness and permanent-error sink:
	// the actor reports every store call's result to it.
	Health *outage.Health
	// Retry is the backoff after a failed store call (zero: the default).
	Retry backoff.Policy
	// Skipped, if set, is told of each message a range settles without
	// delivery because the binding set in force (declaration id) does not
	// route it to the group (the simulator checks it).
	Skipped func(m *store.Message, bindings int64)
	// Broken is nil outside the simulator's tests: see Broken.
	Broken *Broken
	// Listening, if set, reports whether the client's LISTEN connection is
	// up: while it is, a quiet actor skips its poll ticks (decision 0038;
	// quiet.go). nil: never quiet (the simulator, step-driven tests).
	Listening func() bool
	// Alarm, if set, receives a value when another instance of the actor's
	// worker lapsed lately (its heartbeat's renewal says so: decision
	// 0040): the actor sweeps for its leases. With it, a quiet actor skips
	// most reconcile ticks' sweeps too (QuietSweepEvery).
	Alarm <-chan struct{}
	// QuietSweeps overrides QuietSweepEvery (0: QuietSweepEvery); tests
	// make it large to show that an alarm alone brings a takeover.
	QuietSweeps int
	// Holdings, if set, is told whether the actor may hold leases, for its
	// heartbeat (Holdings).
	Holdings *Holdings
	// Nudge, if set, is shared by a session's two claimers: the range
	// claimer gives it when it writes exception rows, the exception claimer
	// takes it.
	Nudge *Nudge
	// Trace, if set, is told what becomes of outcomes: applied in memory,
	// dropped (a stale or cancelled run), written, or lost with the lease.
	// The chaos test accounts for its duplicates with it; nil elsewhere.
	Trace func(kind TraceKind, messages []int64)
	// Signals are test signals (nil: none): see Signals.
	Signals *Signals
}

// Broken holds test-only fault switches. Each breaks one promise on purpose
// so the simulator can show that its invariants catch it; nothing outside
// the simulator's tests sets them.
type Broken struct {
	DropFailures         bool // a range commit omits its exception rows: failed messages vanish
	SkipKeyLeases        bool // keyed messages run at once, without a key lease
	DeliverUnmatched     bool // messages outside the group's binding set are delivered
	IgnoreOrderedFailure bool // a failed ordered message does not hold back its key's later messages
}

// The switches as the claimer reads them: a nil *Broken (every production
// session) is all false.
func (b *Broken) dropFailures() bool         { return b != nil && b.DropFailures }
func (b *Broken) skipKeyLeases() bool        { return b != nil && b.SkipKeyLeases }
func (b *Broken) deliverUnmatched() bool     { return b != nil && b.DeliverUnmatched }
func (b *Broken) ignoreOrderedFailure() bool { return b != nil && b.IgnoreOrderedFailure }

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
	Alerts *alerts.Queue
	// WorkerConfigID is the range claimers' worker row of the group: the
	// claimer asks for the group's key gate (decision 0051) only while no
	// other live instance of it runs. 0: never asked for (step-driven
	// tests that read key-lease rows).
	WorkerConfigID int64
}

// TraceKind is what a Trace event says became of outcomes.
type TraceKind uint8

const (
	TraceApplied   TraceKind = iota // the actor took the outcome in
	TraceDropped                    // the actor ignored it: a stale, handed-back or cancelled run
	TraceRecorded                   // written: a reclaimer does not deliver it again
	TraceLost                       // the write found the lease gone
	TraceLeft                       // left, unwritten, to the consumer's Leftovers
	TraceAdopted                    // taken from the Leftovers by a later session
	TraceAbandoned                  // unwritten when the actor stopped without a hand-back
	TraceBegun                      // the range claimer's begin succeeded (no messages)
)

// trace tells Trace about one message (0: unknown, nothing said). The
// slice is built only when Trace is set: the hot path allocates nothing.
func (c *Common) trace(kind TraceKind, id int64) {
	if c.Trace != nil && id != 0 {
		c.Trace(kind, []int64{id})
	}
}

func (c *Common) traceAll(kind TraceKind, ids []int64) {
	if c.Trace != nil && len(ids) > 0 {
		c.Trace(kind, ids)
	}
}

// doneUnrecorded lists the ids of the range's messages with an outcome not
// yet written.
func (in *inflight) doneUnrecorded() []int64 {
	var ids []int64
	for i, st := range in.state {
		if st == done && !in.rec[i] {
			ids = append(ids, in.r.Messages[i].ID)
		}
	}
	return ids
}

type msgState uint8

const (
	waiting msgState = iota // queued behind its key in this range
	running
	done
)

// Ref names the work a job belongs to, for the actor that dispatched it.
// The range claimer's names one message of one incarnation of a range: a
// range this instance reclaims after its own lease lapsed comes back under a
// new token, possibly with its low bound moved (a hand-back elsewhere
// dropped a settled prefix), so an index means nothing without the token it
// was dispatched under. The exception claimer's names the row's message.
type Ref struct {
	rangeID int64
	token   string
	index   int
	row     store.Position // the exception claimer's
}

// ref is the range claimer's kind of Ref.
type ref = Ref

type inflight struct {
	r       store.Range
	eff     []policy.Effective
	state   []msgState
	writes  []*store.ExceptionWrite // nil: success (or not done)
	log     []store.DeliveryWrite   // delivery-log rows, per the group's mode
	pending int                     // messages without an outcome
	keys    []string                // held keys this range uses (acquired or shared)
	release []store.KeyLease        // keys its settlement releases, once computed
	excKeys map[string]bool         // keys of its messages given exception rows: never kept
	left    bool                    // its keys were detached (release computed)
	// uncertain: a commit attempt failed without saying whether it applied
	// (a reply lost to a cut connection, say), so a later attempt that
	// finds the range gone has found that earlier attempt's work.
	uncertain bool
	// recorded is how many of the range's first messages the database
	// already counts as settled (RecordProgress moved its low bound past
	// them and wrote their rows): a reclaimer starts after them.
	recorded int
	// rec marks the messages whose outcome RecordProgress wrote (the
	// recorded prefix, and beyond it the range's settled set): a reclaimer
	// skips them.
	rec []bool
	// adopted: an earlier session of the consumer left it (Leftovers); it
	// is only recorded and released, and counts in no queue.
	adopted bool
	// handlerLeft: a handler of the range was abandoned and may still read
	// its message, so the range's slabs are not recycled.
	handlerLeft bool
}

// keyState is a key lease this instance holds. Its queue spans the
// instance's ranges: an exclusive key held for one range admits the next
// range's messages of that key behind the running one instead of parking
// them, so a hot key costs no exception round trips. The lease row keeps the
// token of the range that acquired it and is released by the settlement of
// the last range that uses it.
type keyState struct {
	token   string
	ordered bool    // acquired for ordered messages: never shared
	queue   []ref   // messages of the key, in claim order; [0] runs
	ranges  []int64 // ranges using the lease, each once (a few: those in flight)
	// idleAt is when the last range using the lease settled, if the
	// claimer kept it (zero: in use).
	idleAt time.Time
	// since is when the lease was acquired: a key is not kept past
	// MaxKeyKeep times KeyHold from it, so that an exception row of the
	// key elsewhere finds it free between this instance's ranges.
	since time.Time
	// pending: its acquisition has not been applied (acquiring); nothing
	// of the key runs until it has.
	pending bool
	// gated: held under the group's key gate, with no lease row of its own
	// (decision 0051); token is then the range's that brought it, the
	// token its row gets if the gate is given up while it is held.
	gated bool
	// queue1 and ranges1 are the first backing of queue and ranges: most
	// keys have one message and one range in flight, so a key costs one
	// allocation instead of three (newKeyState).
	queue1  [1]ref
	ranges1 [1]int64
}

// newKeyState is a key's state with its queue and ranges backed by the
// state's own arrays.
func newKeyState(ks keyState) *keyState {
	p := &ks
	p.queue, p.ranges = p.queue1[:0], p.ranges1[:0]
	return p
}

// keyBusyReason is the last error a keyed message parked behind a busy key
// carries: a key held by another instance, or by this one for an ordered
// message (never shared). Operators read it in the exception states.
const keyBusyReason = "waiting: its key is busy in another instance"

// DefaultKeyHold is Common.KeyHold's default: a burn-down's ranges bring a
// key back within a few of its ranges, tens to hundreds of milliseconds
// apart, and another instance that wants a kept key waits at most this
// long beyond its KeyBusyDelay.
const DefaultKeyHold = 500 * time.Millisecond

// MaxKeyKeep bounds how long, in KeyHolds from its acquisition, a key is
// kept from range to range: a key in every range of a long burn-down is
// let go at least this often, so another instance's exception row of the
// key (a retry) waits at most about this long plus its KeyBusyDelay.
const MaxKeyKeep = 10

// MaxKeptKeys bounds the key leases the range claimer keeps with no range
// using them; past it, the longest kept are released.
const MaxKeptKeys = 16384

// keptKey is an entry of the claimer's queue of kept keys, valid while the
// key's state still has this idleAt.
type keptKey struct {
	key string
	at  time.Time
}

// Actor is the range claimer.
type Actor struct {
	cfg    Config
	db     store.Group
	runner *runner
	ranges map[int64]*inflight
	keys   map[string]*keyState // key leases held, across ranges
	// kept queues the keys held with no range using them, oldest first
	// (decision 0045); nkept counts its valid entries.
	kept  []keptKey
	nkept int
	// contended is when a key this claimer wanted was last busy in
	// another instance: it keeps no key for KeyHold after.
	contended time.Time
	order     []int64 // range ids in claim order, for hand-back
	queued    int     // messages claimed and not settled
	toCommit  []ref   // complete ranges (id, token) whose commit failed and must be retried

	stallSince time.Time
	stalled    bool
	outage     *outage.Reporter

	// The serve loop's claim pacing (the step functions ignore it). starved:
	// the last claim was cut short by a full queue, so a freed slot is a
	// reason to claim again. sweep: the next claim also looks for expired
	// leases and probes the gate; it is due after a begin, then at every
	// sweepTicks-th poll tick (ticks counts them) and every reconcile tick
	// (Lease/3, so a long ClaimPollRate does not leave expired leases
	// waiting for it), and stays due while reclaims find ranges. In between
	// a claim is one statement: a produce's wake is what makes new positions
	// claimable, while an expired or handed-back lease and an open
	// transaction's end wait for the next sweep.
	starved, sweep bool
	ticks          int
	// empty: the last claim of new positions found none, or took the last
	// claimable one (store.Range.Drained), so the next sweep first probes
	// (store.GateProbe: new positions after the head? a lapsed range
	// lease?) and claims only what the probe found. An idle session's
	// sweep is then one statement, cheap to plan, instead of three (the
	// reclaim and claim statements cost most of an idle session's server
	// CPU in planning), and a burst's end costs no claim that finds nothing.
	empty bool
	// found: the last claim read positions (a range claimed or reclaimed).
	found bool
	// released: a hand-back released a range that no wake has announced
	// yet (handBack).
	released bool
	// begunAt is when the serve loop's begin ran: takeovers wait
	// TakeoverGrace after it (zero for the step functions' callers).
	begunAt time.Time
	// idleProbed: the last claim was a sweep whose probe found nothing
	// after the head, no lapsed lease and no stall (quiet).
	idleProbed bool
	// wokenQuiet: a wake reached the claimer while it was quiet. The next
	// claim reads new positions first, and sweeps only if there are none
	// (woken).
	wokenQuiet bool
	// acqs are the key acquisitions claims left pending, oldest first
	// (deferAcquire: the serve loop's claims, and the simulator's).
	acqs         []*acquiring
	deferAcquire bool
	// keyGate is the token of the group's key gate while this claimer
	// holds it (decision 0051), "" otherwise: its exclusive keys are then
	// held without a row each. gateAsked: a pending acquisition asks for
	// it. gateRefused: when it was last refused or given up (it is not
	// asked for again for KeyGateRetry). gateChecked: the last look at
	// whether another instance or a keyed retry wants the keys.
	keyGate                  string
	gateAsked                bool
	gateRefused, gateChecked time.Time
	leaseBook
	parsedOptions
}

// New returns a range claimer.
func New(cfg Config) *Actor {
	a := &Actor{cfg: cfg, db: cfg.Store.Group(cfg.StreamID, cfg.GroupID).InLane(false), runner: cfg.newRunner(),
		outage: cfg.reporter("claimer store call")}
	a.reset()
	return a
}

func (a *Actor) reset() {
	a.ranges = map[int64]*inflight{}
	a.keys = map[string]*keyState{}
	a.kept, a.nkept, a.contended = nil, 0, time.Time{}
	a.order, a.toCommit, a.queued = nil, nil, 0
	a.starved, a.sweep, a.empty, a.found, a.idleProbed, a.wokenQuiet = false, true, false, false, false, false
	a.acqs = nil
	a.keyGate, a.gateAsked = "", false
	a.leasing(a.cfg.Holdings)
}

// quiet: nothing for a poll tick to do while the listener is up (quiet.go).
func (a *Actor) quiet() bool {
	return a.idleProbed && len(a.ranges) == 0 && len(a.keys) == 0 && a.keyGate == "" && len(a.toCommit) == 0 &&
		a.stallSince.IsZero() && a.cfg.Leftovers.Len() == 0
}

// alarmed: a peer instance lapsed: sweep for its leases.
func (a *Actor) alarmed() { a.sweep, a.idleProbed = true, false }

// skipTick: a quiet claimer with alarms skips the reconcile tick's sweep but
// every QuietSweepEvery-th.
func (a *Actor) skipTick() bool {
	return a.leaseBook.skipTick(&a.cfg.Common, a.quiet())
}

// woken: a wake reaching a quiet claimer makes it claim, and sweep if that
// claim finds no new position: a produce's wake (nearly all of them) names
// new positions, a hand-back's lapsed ranges, and a listener's reconnect
// either. Probing first cost every produce's wake a gate probe, planned
// afresh for each stream of a thousand (decision 0041).
func (a *Actor) woken() {
	if a.quiet() {
		a.wokenQuiet = true
	}
}

// Queued returns how many messages are claimed and not yet settled.
func (a *Actor) Queued() int { return a.queued }

// Run executes one job synchronously (the step tests drive).
func (a *Actor) Run(ctx context.Context, j Job) Outcome { return a.runner.Run(ctx, j) }

// Claim takes one range when a whole batch fits in the queue, reclaiming an
// expired lease of the group before reading new positions (outside
// TakeoverGrace), and returns the jobs ready to run.
func (a *Actor) Claim(ctx context.Context) ([]Job, error) {
	held := a.cfg.takeoversHeld(a.begunAt)
	jobs, _, err := a.claimWith(ctx, !held, !held)
	return jobs, err
}

// claimWith is Claim; sweep false skips the look for expired leases and the
// gate probe (the serve loop's claims between sweeps), and reclaim false
// the reclaim alone (TakeoverGrace). reclaimed says whether an expired lease
// was taken over. A claim that finds nothing to run with no range in
// flight lets the kept keys go (decision 0045): the backlog is drained
// here, and a quiet claimer holds nothing (quiet.go).
func (a *Actor) claimWith(ctx context.Context, sweep, reclaim bool) (jobs []Job, reclaimed bool, err error) {
	jobs, reclaimed, err = a.claimOnce(ctx, sweep, reclaim)
	if err == nil && len(jobs) == 0 && len(a.ranges) == 0 && (a.nkept > 0 || a.keyGate != "") && a.cfg.Liveness.Valid() {
		err = errors.Join(a.releaseKept(ctx, true), a.giveUpGate(ctx, false))
	}
	return jobs, reclaimed, err
}

func (a *Actor) claimOnce(ctx context.Context, sweep, reclaim bool) (jobs []Job, reclaimed bool, err error) {
	a.found = false
	if a.queued+a.cfg.BatchLimit > a.cfg.QueueSize {
		a.starved = true
		return nil, false, nil
	}
	a.starved = false
	if !a.cfg.Liveness.Valid() {
		// Nothing was looked at: the claimer polls until a claim runs.
		// Quiet, it would skip its poll ticks, and the wake that brought
		// this claim (a produce's, a hand-back's) would be lost until the
		// next wake or the backstop sweep.
		a.idleProbed = false
		a.cfg.Signals.notValid()
		return nil, false, nil
	}
	if a.cfg.Fault != nil {
		if err := a.cfg.Fault("claimer"); err != nil {
			return nil, false, err
		}
	}
	a.idleProbed = false
	group := a.cfg.Group()
	args := store.ClaimParams{Owner: a.cfg.InstanceID, Limit: a.cfg.BatchLimit, Lease: a.cfg.Lease, Now: a.cfg.DBNow(), Slabs: a.cfg.Slabs}
	obs := a.cfg.observer()
	var probe *store.Gate
	if sweep && a.empty {
		g, err := a.db.GateProbe(ctx, args.Now)
		if err != nil {
			return nil, false, err
		}
		probe = &g
	}
	expired := probe != nil && probe.Expired
	if sweep && reclaim && probe == nil {
		// A busy claimer's sweep (no probe: it claimed positions last
		// time) looks before it reclaims: the look plans in a tenth of
		// the reclaim's time, and a stream's statements are planned
		// afresh on most calls when there are many streams (decision 0042).
		if expired, err = a.db.LeasesExpired(ctx, args.Now); err != nil {
			return nil, false, err
		}
	}
	if sweep && reclaim && expired {
		began := a.cfg.Clock.Now()
		a.leasing(a.cfg.Holdings)
		r, ok, err := a.db.ReclaimRange(ctx, args)
		obs.ClaimDuration(a.cfg.StreamName, a.cfg.GroupName, a.cfg.Clock.Since(began))
		if err != nil {
			return nil, false, err
		}
		if ok {
			a.cfg.Stats.Reclaimed.Add(1)
			obs.Count(a.cfg.StreamName, a.cfg.GroupName, observe.RangeReclaimed, 1)
			if limit := group.MaxRangeReclaimsOrDefault(); r.Reclaims > limit {
				return nil, true, a.quarantine(ctx, r, group, limit)
			}
			a.cfg.Logger.Info("reclaimed an expired range", "range", r.ID, "reclaims", r.Reclaims, "messages", len(r.Messages))
			a.found, a.empty = true, false
			jobs, err := a.dispatch(ctx, r, group)
			return jobs, true, err
		}
	}
	if probe != nil && !probe.Pending { // nothing after the head: not a stall either
		a.clearStall()
		a.idleProbed = !probe.Expired
		return nil, false, nil
	}
	began := a.cfg.Clock.Now()
	a.leasing(a.cfg.Holdings)
	r, ok, err := a.db.ClaimRange(ctx, args)
	obs.ClaimDuration(a.cfg.StreamName, a.cfg.GroupName, a.cfg.Clock.Since(began))
	if ok {
		obs.Count(a.cfg.StreamName, a.cfg.GroupName, observe.RangeClaimed, 1)
	}
	if err != nil {
		return nil, false, err
	}
	if a.empty = !ok; !ok {
		if !sweep {
			return nil, false, nil
		}
		return nil, false, a.checkGate(ctx, probe)
	}
	// A range that took the last claimable position leaves the claimer as
	// an empty claim would have: the next claim is a sweep's, which probes
	// first, and nothing claims at once. A wake (a produce's) still claims
	// without a probe.
	a.found, a.empty = true, r.Drained
	a.clearStall()
	jobs, err = a.dispatch(ctx, r, group)
	return jobs, false, err
}

// quarantine splits a range that keeps killing its holders into independent
// exception rows, so the healthy messages flow and a poison message ends
// dead after its own retries.
func (a *Actor) quarantine(ctx context.Context, r store.Range, group policy.Group, limit int) error {
	writes := make([]store.ExceptionWrite, 0, len(r.Messages))
	for i := range r.Messages {
		m := &r.Messages[i]
		if !m.Matched {
			continue
		}
		e := a.resolve(m, group)
		writes = append(writes, store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: string(e.Concurrency),
			Status: policy.StatusPending, Error: fmt.Sprintf("%s its range was reclaimed %d times (MaxRangeReclaims %d)", store.QuarantinedPrefix, r.Reclaims, limit)})
	}
	s := store.RangeCommit{RangeID: r.ID, Token: r.Token, Exceptions: writes, Now: a.cfg.DBNow()}
	err := a.db.CommitRange(ctx, s)
	a.cfg.Nudge.give() // after the write: the exception claimer's probe must see its rows
	if err != nil {
		if errors.Is(err, store.ErrLeaseLost) {
			return nil
		}
		return err
	}
	a.cfg.Stats.Quarantined.Add(1)
	a.cfg.observer().Count(a.cfg.StreamName, a.cfg.GroupName, observe.RangeQuarantined, 1)
	codes.RangeQuarantined.Log(ctx, a.cfg.Logger, "range quarantined: its messages are retried one by one", "range", r.ID,
		"reclaims", r.Reclaims, "messages", len(r.Messages))
	return nil
}

func (a *Actor) dispatch(ctx context.Context, r store.Range, group policy.Group) ([]Job, error) {
	var stale []Job // other ranges' messages a dropped incarnation was holding up
	if old := a.ranges[r.ID]; old != nil {
		stale = a.dropStale(old)
	}
	jobs := stale
	n := len(r.Messages)
	in := &inflight{r: r, eff: make([]policy.Effective, n), state: make([]msgState, n),
		writes: make([]*store.ExceptionWrite, n), rec: make([]bool, n), pending: n}
	a.ranges[r.ID] = in
	a.order = append(a.order, r.ID)
	if n == 0 { // a reclaimed lease over positions that no longer exist
		return stale, a.settle(ctx, r.ID)
	}
	a.queued += n

	// The keyed messages' indexes, in log order; whether any is ordered.
	var keyedIdx []int
	anyOrdered := false
	for i := range r.Messages {
		m := &r.Messages[i]
		if !m.Matched && !a.cfg.Broken.deliverUnmatched() { // not routed to this group: settled without delivery
			if a.cfg.Skipped != nil {
				a.cfg.Skipped(m, r.Bindings)
			}
			in.state[i] = done
			in.pending--
			a.queued--
			continue
		}
		a.cfg.Stats.Claimed.Add(1)
		in.eff[i] = a.resolve(m, group)
		if !in.eff[i].Concurrency.Keyed() || m.Key == "" || a.cfg.Broken.skipKeyLeases() {
			if jobs == nil {
				jobs = make([]Job, 0, n)
			}
			in.state[i] = running
			jobs = append(jobs, a.job(in, i))
			continue
		}
		if keyedIdx == nil {
			keyedIdx = make([]int, 0, n-i)
		}
		keyedIdx = append(keyedIdx, i)
		anyOrdered = anyOrdered || in.eff[i].Concurrency == policy.Ordered
	}
	if a.keyGate != "" && !anyOrdered {
		return a.admitGated(ctx, in, jobs, keyedIdx)
	}

	// Keyed messages, by key in order of first appearance. The keyed
	// entries share one array (keyBuf), sized for the keyed messages: it
	// never grows, so pointers into it stay valid.
	var byKey map[string]*keyed
	var keyOrder []string
	var keyBuf []keyed
	for _, i := range keyedIdx {
		m := &r.Messages[i]
		k := byKey[m.Key]
		if k == nil {
			if keyBuf == nil {
				keyBuf = make([]keyed, 0, len(keyedIdx))
				byKey = make(map[string]*keyed, min(len(keyedIdx), 64))
			}
			keyBuf = append(keyBuf, keyed{})
			k = &keyBuf[len(keyBuf)-1]
			k.idx = k.one[:0]
			byKey[m.Key] = k
			keyOrder = append(keyOrder, m.Key)
		}
		k.idx = append(k.idx, i)
		k.ordered = k.ordered || in.eff[i].Concurrency == policy.Ordered
	}
	var want []store.KeyClaim
	var wanted []string
	exclusive := false
	now := a.cfg.Clock.Now()
	for _, key := range keyOrder {
		// A key this instance holds (or is acquiring) is shared below, or
		// parked as busy when either side is ordered (an ordered key's
		// order is decided by the database, never by a queue in one
		// process). An exclusive key is held at once under the key gate.
		// The others are acquired.
		if a.keys[key] == nil {
			k := byKey[key]
			if a.keyGate != "" && !k.ordered {
				a.keys[key] = newKeyState(keyState{token: r.Token, since: now, gated: true})
				continue
			}
			want = append(want, store.KeyClaim{Key: key, Ordered: k.ordered, Position: r.Messages[k.idx[0]].Position})
			wanted = append(wanted, key)
			exclusive = exclusive || !k.ordered
		}
	}
	isWanted := func(key string) bool { return slices.Contains(wanted, key) }
	if len(wanted) > 8 {
		set := make(map[string]bool, len(wanted))
		for _, key := range wanted {
			set[key] = true
		}
		isWanted = func(key string) bool { return set[key] }
	}
	for _, key := range keyOrder {
		jobs = a.admit(jobs, in, key, byKey[key], isWanted(key))
	}
	if len(want) == 0 {
		return a.admitted(ctx, in, jobs)
	}
	// The wanted keys' messages wait, queued behind the key's pending
	// lease, for the acquisition: the serve loop runs it off its path, on
	// another connection, while it goes on claiming and committing
	// (decision 0050); the step callers run it at once unless they
	// deferred it.
	a.leasing(a.cfg.Holdings)
	req := store.AcquireKeys{RangeID: r.ID, Want: want, Token: r.Token, Owner: a.cfg.InstanceID, TTL: a.cfg.Lease, Now: a.cfg.DBNow()}
	if exclusive && a.askGate() {
		req.Gate, req.WorkerConfigID, a.gateAsked = store.NewID(), a.cfg.WorkerConfigID, true
	}
	a.acqs = append(a.acqs, &acquiring{token: r.Token, keys: wanted, req: req})
	if a.deferAcquire {
		return jobs, nil
	}
	more, err := a.Acquire(ctx)
	return append(jobs, more...), err
}

// KeyGateRetry is how long, in KeyHolds, the range claimer waits after
// its key gate was refused or given up before it asks again (decision
// 0051): a group with other sessions refuses it, and a fleet's instances
// would otherwise ask at every claim.
const KeyGateRetry = MaxKeyKeep

// askGate: a claim that must acquire exclusive keys asks for the group's
// key gate too. Only while the claimer keeps keys (the gate is keeping
// every key), knows its worker row, does not hold or ask for the gate
// already, and was not refused or gave it up within KeyGateRetry.
func (a *Actor) askGate() bool {
	if a.cfg.WorkerConfigID == 0 || a.keyGate != "" || a.gateAsked || a.cfg.Broken.skipKeyLeases() {
		return false
	}
	now := a.cfg.Clock.Now()
	return a.keeping(now) && (a.gateRefused.IsZero() || now.Sub(a.gateRefused) >= KeyGateRetry*a.cfg.keyHold())
}

// giveUpGate gives the key gate up (decision 0051): the exclusive keys
// still held under it get a lease row each, by the token of the range
// that brought them, in the statement that frees it. Until it succeeds
// the gate stays held and the keys gated (a later flush tries again).
//
// wanted: given up because others want the keys (checkKeyGate), so it is
// not asked for again for KeyGateRetry; a drained claimer or a hand-back
// gives it up without that wait.
func (a *Actor) giveUpGate(ctx context.Context, wanted bool) error {
	if a.keyGate == "" {
		return nil
	}
	var keys []store.KeyLease
	for key, ks := range a.keys {
		if ks.gated {
			keys = append(keys, store.KeyLease{Key: key, Token: ks.token})
		}
	}
	a.leasing(a.cfg.Holdings) // the keys' rows
	_, missing, err := a.db.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: a.keyGate, Owner: a.cfg.InstanceID, Keys: keys,
		TTL: a.cfg.Lease, Now: a.cfg.DBNow()})
	if err != nil {
		return err
	}
	// Freed now, or by an earlier attempt whose reply was lost (its rows
	// were written then), or lost with the incarnation (which starts
	// nothing more): either way the keys are rows or nothing from here.
	for _, ks := range a.keys {
		ks.gated = false
	}
	a.keyGate = ""
	if wanted {
		a.gateRefused = a.cfg.Clock.Now()
		a.cfg.Stats.KeyGatesGivenUp.Add(1)
	}
	if missing > 0 {
		return fmt.Errorf("give up the key gate: %d held keys are leased by another live holder", missing)
	}
	return nil
}

// checkKeyGate gives the key gate up when another live instance of the
// group's range claimers runs or a keyed message waits in the exception
// table (store.KeyGateWanted), looked at once a KeyHold while it is held.
func (a *Actor) checkKeyGate(ctx context.Context) error {
	if a.keyGate == "" {
		return nil
	}
	now := a.cfg.Clock.Now()
	if !a.gateChecked.IsZero() && now.Sub(a.gateChecked) < a.cfg.keyHold() {
		return nil
	}
	wanted, err := a.db.KeyGateWanted(ctx, a.cfg.InstanceID, a.cfg.WorkerConfigID, a.cfg.DBNow())
	if err != nil {
		return err
	}
	a.gateChecked = now
	if !wanted {
		return nil
	}
	return a.giveUpGate(ctx, true)
}

// maxAcquires bounds the key acquisitions the serve loop runs at once,
// each on a connection of the pool. They lease disjoint keys (a key being
// acquired is pending in the key map, so no later claim wants it), but one
// at a time applies them in claim order, as the simulator does, and two
// measured no better on two cores (BENCHMARKS.md, session 24).
const maxAcquires = 1

// keyed is a range's messages of one key, and whether any is ordered. one
// is idx's first backing: with many keys, most have one message a range.
type keyed struct {
	idx     []int
	one     [1]int
	ordered bool
}

// acquiring is a range's key acquisition not applied yet. Its keys are in
// the claimer's key map, pending: their messages (the range's, and later
// ranges' that share them) are queued and none runs until it is applied.
type acquiring struct {
	token   string   // the range's: the lease rows' token
	keys    []string // the wanted keys, in order of first appearance
	req     store.AcquireKeys
	started bool // the serve loop runs it
	// gate: the key gate under which its exclusive keys were taken out of
	// the statement when it started (underGate); they are held if the
	// claimer still holds that gate when the result is applied.
	gate string
}

// Acquired is a key acquisition's result (store.Group.AcquireKeys).
type Acquired struct {
	Held, Blocked map[string]bool
	Err           error
	of            *acquiring // nil: the oldest pending
}

// Acquiring reports that claims left key acquisitions pending
// (DeferAcquire), which Acquire applies in claim order.
func (a *Actor) Acquiring() bool { return len(a.acqs) > 0 }

// DeferAcquire makes a claim that must acquire key leases leave the
// acquisition pending (Acquiring) instead of running it: the serve loop
// runs it on another connection while claims, outcomes, commits and
// flushes go on, and the simulator interleaves other steps with it.
func (a *Actor) DeferAcquire(on bool) { a.deferAcquire = on }

// Acquire runs the oldest pending key acquisition (if any) and applies it.
func (a *Actor) Acquire(ctx context.Context) ([]Job, error) {
	if len(a.acqs) == 0 {
		return nil, nil
	}
	p := a.acqs[0]
	if a.underGate(p) {
		return a.acquired(ctx, Acquired{of: p})
	}
	held, blocked, err := a.db.AcquireKeys(ctx, p.req)
	return a.acquired(ctx, Acquired{Held: held, Blocked: blocked, Err: err, of: p})
}

// underGate takes out of an acquisition that starts now the exclusive
// keys the claimer holds under its key gate (decision 0051): a range
// claimed while the gate was being asked for wants them. It reports
// whether nothing is left for the statement.
func (a *Actor) underGate(p *acquiring) bool {
	if a.keyGate == "" || p.req.Gate != "" {
		return false
	}
	var rest []store.KeyClaim
	for _, k := range p.req.Want {
		if k.Ordered {
			rest = append(rest, k)
		}
	}
	if len(rest) < len(p.req.Want) {
		p.gate, p.req.Want = a.keyGate, rest
	}
	return len(rest) == 0
}

// acquisition returns the oldest pending acquisition's store call that
// has not started, to run off the serve loop on a connection of the pool
// (the loop's lane is busy with claims and commits); nil if there is none.
func (a *Actor) acquisition() func(context.Context) Acquired {
	for _, p := range a.acqs {
		if p.started {
			continue
		}
		p.started = true
		if a.underGate(p) {
			return func(context.Context) Acquired { return Acquired{of: p} }
		}
		db, req := a.cfg.Store.Group(a.cfg.StreamID, a.cfg.GroupID), p.req
		return func(ctx context.Context) Acquired {
			held, blocked, err := db.AcquireKeys(ctx, req)
			return Acquired{Held: held, Blocked: blocked, Err: err, of: p}
		}
	}
	return nil
}

// acquiringAtOnce: how many acquisitions serve runs at once.
func (a *Actor) acquiringAtOnce() int { return maxAcquires }

// acquired applies an acquisition's result (the oldest pending one's when
// res does not say which): a key held
// starts its first queued message; a key busy elsewhere, blocked behind an
// earlier message of its ordered key, or whose acquisition failed parks
// every message queued behind it (as an exception row, which spends no
// retry). What the statement took for keys no range wants any more (their
// ranges went meanwhile), or may have taken before it failed, is released.
func (a *Actor) acquired(ctx context.Context, res Acquired) ([]Job, error) {
	p := res.of
	if p == nil && len(a.acqs) > 0 {
		p = a.acqs[0]
	}
	if p == nil {
		return nil, res.Err
	}
	// An acquisition dropped meanwhile (a hand-back) places nothing: what
	// it took is let go of, as for keys whose ranges went.
	i := slices.Index(a.acqs, p)
	if i >= 0 {
		a.acqs = slices.Delete(a.acqs, i, i+1)
	}
	var jobs []Job
	var gone []store.KeyLease
	touched := map[int64]bool{}
	gated := false
	if p.req.Gate != "" {
		a.gateAsked = false
		switch {
		case res.Held[store.KeyGateKey] && i >= 0:
			a.keyGate, a.gateChecked, gated = p.req.Gate, a.cfg.Clock.Now(), true
			a.cfg.Stats.KeyGates.Add(1)
		case res.Err == nil && !res.Held[store.KeyGateKey]:
			a.gateRefused = a.cfg.Clock.Now()
		}
	}
	var errs []error
	if res.Held[store.KeyGateKey] && i < 0 {
		// Granted to an acquisition dropped meanwhile (a hand-back): freed
		// at once. One granted by an attempt whose reply was lost is the
		// instance's without its knowing: Reconcile frees it.
		if _, _, err := a.db.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: p.req.Gate, Owner: a.cfg.InstanceID, Now: a.cfg.DBNow()}); err != nil {
			errs = append(errs, err)
		}
	}
	for _, key := range p.keys {
		ks := a.keys[key]
		if i < 0 || ks == nil || !ks.pending || ks.token != p.token {
			if res.Held[key] || i >= 0 && res.Err != nil {
				gone = append(gone, store.KeyLease{Key: key, Token: p.token})
			}
			continue
		}
		ks.pending = false
		ks.gated = (gated || p.gate != "" && p.gate == a.keyGate) && !ks.ordered
		switch {
		case p.gate != "" && !ks.ordered: // taken out of the statement for the gate (underGate)
			if !ks.gated { // given up meanwhile, before the key had a row
				a.dropKey(key, ks, a.cfg.KeyBusyDelay, keyBusyReason, touched)
			} else if len(ks.queue) > 0 {
				jobs = append(jobs, a.start(ks.queue[0]))
			}
		case res.Err != nil:
			gone = append(gone, store.KeyLease{Key: key, Token: p.token})
			a.dropKey(key, ks, a.cfg.KeyBusyDelay, "waiting: its key could not be leased", touched)
		case res.Blocked[key]: // the statement gave it back
			a.dropKey(key, ks, 0, "waiting behind an earlier unresolved message of its ordered key", touched)
		case !res.Held[key]:
			a.contended = a.cfg.Clock.Now()
			a.dropKey(key, ks, a.cfg.KeyBusyDelay, keyBusyReason, touched)
		case len(ks.queue) > 0:
			jobs = append(jobs, a.start(ks.queue[0]))
		}
	}
	if len(gone) > 0 {
		if _, err := a.db.ReleaseKeys(ctx, gone); err != nil {
			errs = append(errs, err) // Reconcile lets them go
		}
	}
	for _, id := range slices.Clone(a.order) { // settling forgets ranges: walk a copy
		if in := a.ranges[id]; in != nil && touched[id] && in.pending == 0 {
			if err := a.settle(ctx, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if res.Err != nil {
		errs = append([]error{res.Err}, errs...)
	}
	return jobs, errors.Join(errs...)
}

// dropKey forgets a pending key whose lease was not taken: every message
// queued behind it parks, and the ranges it touched are marked.
func (a *Actor) dropKey(key string, ks *keyState, after time.Duration, why string, touched map[int64]bool) {
	delete(a.keys, key)
	for _, q := range ks.queue {
		if in := a.ranges[q.rangeID]; in != nil && in.r.Token == q.token {
			a.park(in, q.index, after, why)
			touched[q.rangeID] = true
		}
	}
	for _, id := range ks.ranges {
		if in := a.ranges[id]; in != nil {
			in.keys = slices.DeleteFunc(in.keys, func(k string) bool { return k == key })
		}
	}
}

// admitted settles a range whose messages all have outcomes once its keyed
// messages are placed.
func (a *Actor) admitted(ctx context.Context, in *inflight, jobs []Job) ([]Job, error) {
	if in.pending == 0 {
		return jobs, a.settle(ctx, in.r.ID)
	}
	return jobs, nil
}

// admitGated places a range's keyed messages while the claimer holds the
// group's key gate and none of them is ordered: every key is held at once
// (decision 0051), so nothing is acquired and each message is placed as it
// comes, in log order, with one lookup of its key. It places them as
// dispatch's general path would: a key new to the claimer is held under
// the gate; a key it holds for exclusive messages is shared (queued behind
// its earlier messages, a kept one back in use); a key it holds for an
// ordered message parks the message, as busy.
//
// The general path groups a range's messages by key first, and at a key
// gate's usual load (a range of a thousand messages of as many keys) its
// maps and per-key passes were the range claimer's largest cost beyond a
// parallel range's.
func (a *Actor) admitGated(ctx context.Context, in *inflight, jobs []Job, keyedIdx []int) ([]Job, error) {
	r := &in.r
	var now time.Time
	for _, i := range keyedIdx {
		key := r.Messages[i].Key
		ks := a.keys[key]
		switch {
		case ks == nil:
			if now.IsZero() {
				now = a.cfg.Clock.Now()
			}
			ks = newKeyState(keyState{token: r.Token, since: now, gated: true})
			a.keys[key] = ks
		case ks.ordered: // held for an ordered message: never shared
			a.park(in, i, a.cfg.KeyBusyDelay, keyBusyReason)
			continue
		case !ks.idleAt.IsZero(): // kept: in use again
			ks.idleAt = time.Time{}
			a.nkept--
		}
		// The range joins the key once: its first message of the key
		// appended it last (nothing else runs during dispatch).
		if n := len(ks.ranges); n == 0 || ks.ranges[n-1] != r.ID {
			ks.ranges = append(ks.ranges, r.ID)
			in.keys = append(in.keys, key)
		}
		idle := len(ks.queue) == 0 && !ks.pending
		ks.queue = append(ks.queue, ref{rangeID: r.ID, token: r.Token, index: i})
		if idle {
			if jobs == nil {
				jobs = make([]Job, 0, len(keyedIdx))
			}
			jobs = append(jobs, a.start(ks.queue[0]))
		}
	}
	return a.admitted(ctx, in, jobs)
}

// admit places a range's messages of one key: queued behind this
// instance's lease of it, or behind a new pending lease (wanted: the
// acquisition decides), or parked when the key is held for an ordered
// message on one side (an ordered lease is never shared). It returns jobs
// with the job that starts, if any, appended.
func (a *Actor) admit(jobs []Job, in *inflight, key string, k *keyed, wanted bool) []Job {
	r := &in.r
	ks := a.keys[key]
	switch {
	case wanted:
		ks = newKeyState(keyState{token: r.Token, ordered: k.ordered, since: a.cfg.Clock.Now(), pending: true})
		a.keys[key] = ks
	case !ks.ordered && !k.ordered: // shared: queued behind this instance's earlier messages
		if !ks.idleAt.IsZero() { // kept: in use again
			ks.idleAt = time.Time{}
			a.nkept--
		}
	case !ks.idleAt.IsZero():
		// A kept exclusive key that an ordered message wants: let it go
		// with this range, and the message waits as for a busy key.
		delete(a.keys, key)
		a.nkept--
		in.release = append(in.release, store.KeyLease{Key: key, Token: ks.token})
		for _, i := range k.idx {
			a.park(in, i, a.cfg.KeyBusyDelay, keyBusyReason)
		}
		return jobs
	default: // held (or being acquired) for an ordered message, or wanted by one
		for _, i := range k.idx {
			a.park(in, i, a.cfg.KeyBusyDelay, keyBusyReason)
		}
		return jobs
	}
	if !slices.Contains(ks.ranges, r.ID) {
		ks.ranges = append(ks.ranges, r.ID)
	}
	in.keys = append(in.keys, key)
	idle := len(ks.queue) == 0 && !ks.pending
	for _, i := range k.idx {
		ks.queue = append(ks.queue, ref{rangeID: r.ID, token: r.Token, index: i})
	}
	if idle {
		return append(jobs, a.start(ks.queue[0]))
	}
	return jobs
}

// start marks a queued message running and returns its job.
func (a *Actor) start(rf ref) Job {
	in := a.ranges[rf.rangeID]
	in.state[rf.index] = running
	return a.job(in, rf.index)
}

func (a *Actor) job(in *inflight, i int) Job {
	e := in.eff[i]
	return Job{Ref: ref{rangeID: in.r.ID, token: in.r.Token, index: i}, Delivery: Delivery{
		Msg: &in.r.Messages[i], Attempt: 1, Concurrency: e.Concurrency, Timeout: e.Timeout, Bindings: in.r.Bindings}}
}

// park parks message i as a pending exception row without spending a
// retry.
func (a *Actor) park(in *inflight, i int, after time.Duration, why string) {
	m := &in.r.Messages[i]
	in.state[i] = done
	in.writes[i] = &store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: string(in.eff[i].Concurrency),
		Status: policy.StatusPending, Error: why, After: after}
	in.markExc(m.Key)
	in.pending--
	a.queued--
	a.cfg.Stats.Deferred.Add(1)
}

// checkGate runs after an empty claim: if committed rows wait behind an open
// transaction for longer than StallAfter, the stall is logged once and
// counted. Nothing is skipped; delivery resumes when the transaction ends.
// probe is the gate as the sweep's probe read it before the claim, if it did.
func (a *Actor) checkGate(ctx context.Context, probe *store.Gate) error {
	if probe == nil {
		g, err := a.db.GateProbe(ctx, a.cfg.DBNow())
		if err != nil {
			return err
		}
		probe = &g
	}
	g := *probe
	if !g.Pending {
		a.clearStall()
		a.idleProbed = !g.Expired // checkGate follows a sweep's empty claim
		return nil
	}
	now := a.cfg.Clock.Now()
	if a.stallSince.IsZero() {
		a.stallSince = now
		return nil
	}
	if a.stalled || now.Sub(a.stallSince) < a.cfg.StallAfter {
		return nil
	}
	a.stalled = true
	a.cfg.Stats.Stalls.Add(1)
	a.cfg.observer().Count(a.cfg.StreamName, a.cfg.GroupName, observe.DeliveryStall, 1)
	blockers, err := a.cfg.Store.GateBlockers(ctx, g.Xmin)
	if err != nil {
		return err
	}
	attrs := []any{"group_id", a.cfg.GroupID, "waiting", now.Sub(a.stallSince).String(), "oldest_open_xid", g.Xmin}
	for _, b := range blockers {
		attrs = append(attrs, "blocker_pid", b.PID, "blocker_application", b.ApplicationName,
			"blocker_xact_start", b.XactStart, "blocker_state", b.State)
	}
	codes.DeliveryStalled.Log(ctx, a.cfg.Logger, "delivery stalled: committed messages wait behind an open transaction", attrs...)
	a.cfg.Alerts.Send(alerts.Event{Kind: alerts.DeliveryStalled, Since: a.stallSince, Waited: now.Sub(a.stallSince), Blockers: blockers})
	return nil
}

func (a *Actor) clearStall() {
	if a.stalled {
		a.cfg.Logger.Info("delivery resumed after a stall", "group_id", a.cfg.GroupID)
	}
	a.stallSince, a.stalled = time.Time{}, false
}

// Outcome records one finished job, releases the next message of its key,
// and commits the range when every message has an outcome. A canceled
// outcome settles nothing: the message is handed back with its range.
func (a *Actor) Outcome(ctx context.Context, o Outcome) ([]Job, error) {
	rf := o.Ref
	in, ok := a.ranges[rf.rangeID]
	if !ok || in.r.Token != rf.token || in.state[rf.index] != running || o.Canceled {
		a.cfg.trace(TraceDropped, o.msgID)
		return nil, nil // a range dropped after a lost lease or a hand-back, or an earlier incarnation's job
	}
	i := rf.index
	m := &in.r.Messages[i]
	a.cfg.trace(TraceApplied, m.ID)
	// The result is computed before anything changes: should a step panic,
	// the actor's salvage (serve.go) finds the range as it was.
	group := a.cfg.Group()
	e := a.atWrite(in.eff[i], m, group)
	next := policy.Decide(e, group.InitialBackoffOrDefault(), 0, 0, o.Err)
	var w *store.ExceptionWrite
	if !next.Delete {
		w = &store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: string(e.Concurrency),
			Status: next.Status, Attempts: next.Attempts, Delays: next.Delays, Error: errText(o.Err), After: next.After}
	}
	outcome := policy.OutcomeOf(next, o.Err, 0)
	in.state[i], in.writes[i] = done, w
	in.handlerLeft = in.handlerLeft || o.handlerLeft
	if w != nil {
		in.markExc(m.Key)
	}
	in.pending--
	a.queued--
	if group.Logs(outcome) {
		in.log = append(in.log, store.DeliveryWrite{Position: m.Position, Attempt: 1, Outcome: outcome, Error: errText(o.Err)})
	}
	a.cfg.Stats.count(next, o.Err, 0)
	a.cfg.observeAttempt(o, next, 0, m.ProducedAt)
	var jobs []Job
	if ks := a.keys[m.Key]; ks != nil && m.Key != "" && len(ks.queue) > 0 && ks.queue[0] == rf {
		ks.queue = ks.queue[1:]
		if e.Concurrency == policy.Ordered && !next.Delete && !a.cfg.Broken.ignoreOrderedFailure() {
			// A later message of an ordered key waits for this one. An
			// ordered lease is never shared, so they are all this range's.
			for _, q := range ks.queue {
				a.park(a.ranges[q.rangeID], q.index, 0, "waiting behind an earlier unresolved message of its ordered key")
			}
			ks.queue = nil
		} else if len(ks.queue) > 0 {
			jobs = append(jobs, a.start(ks.queue[0]))
		}
	}
	if in.pending > 0 {
		return jobs, nil
	}
	return jobs, a.settle(ctx, rf.rangeID)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// keyHold is KeyHold with its default.
func (c *Common) keyHold() time.Duration {
	if c.KeyHold == 0 {
		return DefaultKeyHold
	}
	return c.KeyHold
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

func (a *Actor) settle(ctx context.Context, id int64) error {
	if err := a.commit(ctx, id); err != nil {
		a.toCommit = append(a.toCommit, ref{rangeID: id, token: a.ranges[id].r.Token})
		return err
	}
	return nil
}

// dropStale forgets an earlier incarnation of a range this instance has just
// reclaimed (its own lease had lapsed): its jobs' outcomes, its queued key
// refs and its pending commit belong to a lease that is gone, and applied to
// the new incarnation they would settle messages that never ran. Key leases
// it alone used are left to Reconcile, which releases leases under tokens
// the claimer no longer knows.
func (a *Actor) dropStale(old *inflight) []Job {
	var heads []string // keys whose running message was the old incarnation's
	for _, key := range old.keys {
		if ks := a.keys[key]; ks != nil && len(ks.queue) > 0 && ks.queue[0].rangeID == old.r.ID && ks.queue[0].token == old.r.Token {
			heads = append(heads, key)
		}
	}
	a.releaseKeys(old)
	var jobs []Job
	for _, key := range heads { // the next message of the key, another range's, starts
		if ks := a.keys[key]; ks != nil && len(ks.queue) > 0 && !ks.pending {
			jobs = append(jobs, a.start(ks.queue[0]))
		}
	}
	if !old.adopted {
		a.queued -= old.pending
	}
	a.forget(old.r.ID)
	kept := a.toCommit[:0]
	for _, c := range a.toCommit {
		if c.rangeID != old.r.ID {
			kept = append(kept, c)
		}
	}
	a.toCommit = kept
	return jobs
}

func (a *Actor) commit(ctx context.Context, id int64) error {
	in := a.ranges[id]
	var writes []store.ExceptionWrite
	for _, w := range in.writes {
		if w != nil && !a.cfg.Broken.dropFailures() {
			writes = append(writes, *w)
		}
	}
	s := store.RangeCommit{RangeID: id, Token: in.r.Token, Exceptions: writes, Deliveries: in.log, Keys: a.settleKeys(in), Now: a.cfg.DBNow()}
	err := a.db.CommitRange(ctx, s)
	if len(writes) > 0 {
		a.cfg.Nudge.give() // after the write: the exception claimer's probe must see its rows
	}
	if a.cfg.Trace != nil {
		switch {
		case err == nil || (errors.Is(err, store.ErrRangeGone) && in.uncertain):
			a.cfg.traceAll(TraceRecorded, in.doneUnrecorded())
		case errors.Is(err, store.ErrRangeGone) || errors.Is(err, store.ErrLeaseLost):
			a.cfg.traceAll(TraceLost, in.doneUnrecorded())
		}
	}
	switch {
	case errors.Is(err, store.ErrRangeGone) && in.uncertain:
		// No one holds the range and its row is gone: the earlier attempt
		// whose outcome was unknown applied. Nothing is delivered again.
		a.cfg.Logger.Info("range committed by an earlier attempt whose reply was lost", "range", id)
		a.cfg.Stats.Committed.Add(1)
		a.forget(id)
		return nil
	case errors.Is(err, store.ErrRangeGone):
		a.cfg.Stats.LeasesLost.Add(1)
		codes.RangeLeaseLost.Log(ctx, a.cfg.Logger, "range lease lost before commit; another instance reclaimed the range and has settled it", "range", id)
		a.forget(id)
		return nil
	case errors.Is(err, store.ErrLeaseLost):
		a.cfg.Stats.LeasesLost.Add(1)
		codes.RangeLeaseLost.Log(ctx, a.cfg.Logger, "range lease lost before commit; a reclaimer delivers it again", "range", id)
		a.forget(id)
		return nil
	case err != nil:
		in.uncertain = true
		return err
	}
	a.cfg.Stats.Committed.Add(1)
	if in.pending == 0 && !in.handlerLeft && !in.adopted {
		in.r.Recycle(a.cfg.Slabs) // every handler of it has returned
	}
	a.forget(id)
	return nil
}

// releaseKeys detaches a leaving range from the keys it used and returns the
// leases no other range of this instance uses. They are dropped from the
// instance's map before the statement runs: if it fails, nothing more is
// queued behind a lease whose release may already have committed, and the
// retry releases the same rows by the same tokens.
func (a *Actor) releaseKeys(in *inflight) []store.KeyLease { return a.leaveKeys(in, false) }

// settleKeys is releaseKeys for a range being committed: an exclusive key
// it was the last to use is kept instead (decision 0045) while no key this
// claimer wanted was busy elsewhere within KeyHold, the range gave none of
// the key's messages an exception row (its retry would wait for the key),
// the lease is younger than MaxKeyKeep KeyHolds and fewer than MaxKeptKeys
// are kept. Kept keys idle for KeyHold, or all of them once a key was busy,
// go with this range's release; the rest go on the flush tick, at a
// hand-back, or when a claim finds nothing with no range in flight.
func (a *Actor) settleKeys(in *inflight) []store.KeyLease {
	if in.left { // computed by an earlier attempt of this commit
		return in.release
	}
	return a.leaveKeys(in, true)
}

func (a *Actor) leaveKeys(in *inflight, settling bool) []store.KeyLease {
	in.left = true
	now := a.cfg.Clock.Now()
	keep := settling && a.keeping(now)
	for _, key := range in.keys {
		ks := a.keys[key]
		if ks == nil {
			continue
		}
		ks.ranges = slices.DeleteFunc(ks.ranges, func(id int64) bool { return id == in.r.ID })
		kept := ks.queue[:0]
		for _, q := range ks.queue {
			if q.rangeID != in.r.ID {
				kept = append(kept, q)
			}
		}
		ks.queue = kept
		if len(ks.ranges) == 0 && ks.gated { // no row: nothing to keep or release
			delete(a.keys, key)
			continue
		}
		if len(ks.ranges) == 0 {
			if keep && !ks.ordered && !ks.pending && !in.excKeys[key] && a.nkept < MaxKeptKeys &&
				now.Sub(ks.since) < MaxKeyKeep*a.cfg.keyHold() {
				ks.idleAt = now
				a.kept = append(a.kept, keptKey{key: key, at: now})
				a.nkept++
				continue
			}
			in.release = append(in.release, store.KeyLease{Key: key, Token: ks.token})
			delete(a.keys, key)
		}
	}
	in.keys = nil
	if settling {
		in.release = append(in.release, a.dueKept(now, !keep)...)
	}
	return in.release
}

// keeping: the claimer keeps keys now (KeyHold positive, and no key it
// wanted was busy elsewhere within it).
func (a *Actor) keeping(now time.Time) bool {
	hold := a.cfg.keyHold()
	return hold > 0 && (a.contended.IsZero() || now.Sub(a.contended) >= hold)
}

// dueKept takes out of the instance's keys the kept ones idle for KeyHold,
// or all of them, and returns their leases for release.
func (a *Actor) dueKept(now time.Time, all bool) []store.KeyLease {
	var out []store.KeyLease
	hold := a.cfg.keyHold()
	n := 0
	for ; n < len(a.kept); n++ {
		e := a.kept[n]
		ks := a.keys[e.key]
		if ks == nil || !ks.idleAt.Equal(e.at) {
			continue // in use again, or let go since
		}
		if !all && now.Sub(e.at) < hold {
			break
		}
		out = append(out, store.KeyLease{Key: e.key, Token: ks.token})
		delete(a.keys, e.key)
		a.nkept--
	}
	a.kept = a.kept[n:]
	if len(a.kept) > 2*MaxKeptKeys { // mostly entries of keys in use again
		live := a.kept[:0]
		for _, e := range a.kept {
			if ks := a.keys[e.key]; ks != nil && ks.idleAt.Equal(e.at) {
				live = append(live, e)
			}
		}
		a.kept = live
	}
	if len(a.kept) == 0 {
		a.kept = nil
	}
	return out
}

// releaseKept lets go of the kept keys that are due (all of them when asked
// or a key was busy lately) in a statement of their own: the flush tick's,
// when no commit came to carry them. A tick between two ranges lets go of
// only the due ones: the claim that finds the stream drained releases the
// rest (claimWith).
func (a *Actor) releaseKept(ctx context.Context, all bool) error {
	if a.nkept == 0 {
		return nil
	}
	now := a.cfg.Clock.Now()
	keys := a.dueKept(now, all || !a.keeping(now))
	_, err := a.db.ReleaseKeys(ctx, keys)
	return err // on failure the rows stay under tokens the claimer no longer holds: Reconcile lets them go
}

// markExc records that the range gives a message of key an exception row.
func (in *inflight) markExc(key string) {
	if key == "" {
		return
	}
	if in.excKeys == nil {
		in.excKeys = map[string]bool{}
	}
	in.excKeys[key] = true
}

func (a *Actor) forget(id int64) {
	delete(a.ranges, id)
	for i, rid := range a.order {
		if rid == id {
			a.order = append(a.order[:i], a.order[i+1:]...)
			break
		}
	}
}

// Reconcile lets go of what the database says this instance holds but the
// claimer does not know of: a claim or key acquisition whose reply was lost
// to a cut connection committed all the same, and the heartbeat would keep
// it alive forever. The claimer's state is exact between steps (it alone
// claims for its instance), so anything else is such a leftover.
func (a *Actor) Reconcile(ctx context.Context) error {
	known := make([]int64, 0, len(a.ranges))
	for id := range a.ranges {
		known = append(known, id)
	}
	keys := make([]store.KeyLease, 0, len(a.keys))
	for k, ks := range a.keys {
		if !ks.gated {
			keys = append(keys, store.KeyLease{Key: k, Token: ks.token})
		}
	}
	if a.keyGate != "" {
		keys = append(keys, store.KeyLease{Key: store.KeyGateKey, Token: a.keyGate})
	}
	for _, p := range a.acqs {
		// A gate being asked for may be granted while this runs (the serve
		// loop runs the acquisition beside it): known, as pending keys are.
		if p.req.Gate != "" {
			keys = append(keys, store.KeyLease{Key: store.KeyGateKey, Token: p.req.Gate})
		}
	}
	ranges, leases, err := a.db.ForgetUnknownRanges(ctx, store.ForgetRanges{Owner: a.cfg.InstanceID, Ranges: known, Keys: keys, Now: a.cfg.DBNow()})
	if err != nil {
		return err
	}
	if ranges+leases > 0 {
		codes.UnknownLeasesReleased.Log(ctx, a.cfg.Logger, "let go of leases this instance held without knowing (a reply lost to a cut connection)",
			"ranges", ranges, "key_leases", leases)
	}
	return nil
}

// Flush retries commits that failed earlier (a database restart, say), then
// records the settled prefixes of the ranges still in flight.
func (a *Actor) Flush(ctx context.Context) error {
	if err := a.retryCommits(ctx); err != nil {
		return err
	}
	if err := a.RecordProgress(ctx); err != nil {
		return err
	}
	if err := a.checkKeyGate(ctx); err != nil {
		return err
	}
	return a.releaseKept(ctx, false)
}

// retryCommits retries the commits that failed earlier.
func (a *Actor) retryCommits(ctx context.Context) error {
	pending := a.toCommit
	a.toCommit = nil
	for i, c := range pending {
		if in := a.ranges[c.rangeID]; in == nil || in.r.Token != c.token {
			continue // gone, or reclaimed since under a new token
		}
		if err := a.commit(ctx, c.rangeID); err != nil {
			a.toCommit = append(a.toCommit, pending[i:]...)
			return err
		}
	}
	return nil
}

// settledPrefix returns how many of the range's first messages have an
// outcome.
func settledPrefix(in *inflight) int {
	n := 0
	for n < len(in.state) && in.state[n] == done {
		n++
	}
	return n
}

// RecordProgress writes, in one statement for every range still in flight,
// what each has settled since the last record: its low bound moves past its
// settled prefix, the messages settled beyond the prefix join the range's
// settled set, and their exception and delivery-log rows are written, so a
// range reclaimed after this instance dies (or its lease lapses, or the
// actor restarts) delivers only what had not settled. It runs once per
// flush tick: a range that settles whole within a tick is committed instead
// and costs nothing more. Ranges complete and awaiting their commit are left
// to it.
func (a *Actor) RecordProgress(ctx context.Context) error {
	var ps []store.Progress
	var upto []int
	var fresh [][]int // per progress, the messages it writes
	for _, id := range a.order {
		in := a.ranges[id]
		if in.pending == 0 {
			continue
		}
		n := settledPrefix(in)
		p := store.Progress{RangeID: id, Token: in.r.Token}
		if n > in.recorded {
			p.Lo = in.r.Messages[n-1].Position
		}
		var idx []int
		for i := in.recorded; i < len(in.state); i++ {
			if in.state[i] != done || in.rec[i] {
				continue
			}
			idx = append(idx, i)
			if i >= n {
				p.Settled = append(p.Settled, in.r.Messages[i].ID)
			}
			if w := in.writes[i]; w != nil && !a.cfg.Broken.dropFailures() {
				p.Exceptions = append(p.Exceptions, *w)
			}
		}
		if len(idx) == 0 && n <= in.recorded {
			continue
		}
		p.Deliveries = in.log // every row in it is a settled message's, not yet written
		ps, upto, fresh = append(ps, p), append(upto, n), append(fresh, idx)
	}
	if len(ps) == 0 {
		return nil
	}
	advanced, err := a.db.RecordProgress(ctx, ps, a.cfg.DBNow())
	for _, p := range ps {
		if len(p.Exceptions) > 0 {
			a.cfg.Nudge.give() // after the write: the exception claimer's probe must see its rows
			break
		}
	}
	if err != nil {
		return err
	}
	for i, p := range ps {
		in := a.ranges[p.RangeID]
		if !advanced[p.RangeID] || in == nil || in.r.Token != p.Token {
			if in != nil && a.cfg.Trace != nil {
				a.cfg.traceAll(TraceLost, in.doneUnrecorded())
			}
			continue // lease lost: the commit finds out and says so
		}
		if a.cfg.Trace != nil {
			ids := make([]int64, 0, len(fresh[i]))
			for _, j := range fresh[i] {
				ids = append(ids, in.r.Messages[j].ID)
			}
			a.cfg.traceAll(TraceRecorded, ids)
		}
		for _, j := range fresh[i] {
			in.writes[j] = nil // written: the commit must not write it again
			in.rec[j] = true
		}
		in.log = nil
		in.recorded = max(in.recorded, upto[i])
		a.cfg.Stats.ProgressRecorded.Add(1)
	}
	return nil
}

// HandBack returns every range still in flight: a range whose messages all
// have outcomes is committed; any other has its settled prefix recorded (as
// every flush tick does) and is released with its lease expired now, so
// another instance takes the rest at once.
func (a *Actor) HandBack(ctx context.Context) error {
	// The acquisitions still pending have not run (the serve loop applies
	// a running one before it hands back): their ranges go back with the
	// rest, and the pending keys with them.
	a.acqs, a.gateAsked = nil, false
	var errs []error
	if err := a.Flush(ctx); err != nil { // retried commits, then the prefixes
		errs = append(errs, err)
	}
	for _, id := range append([]int64(nil), a.order...) {
		in := a.ranges[id]
		if in.pending == 0 {
			if err := a.commit(ctx, id); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		rel := store.Release{RangeID: in.r.ID, Token: in.r.Token, Keys: a.releaseKeys(in), Now: a.cfg.DBNow()}
		err := a.db.ReleaseRange(ctx, rel)
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			errs = append(errs, err) // kept: a later HandBack tries again
			continue
		}
		a.released = a.released || err == nil
		if !in.adopted {
			a.queued -= in.pending
		}
		a.forget(id)
	}
	if err := a.releaseKept(ctx, true); err != nil {
		errs = append(errs, err)
	}
	if err := a.giveUpGate(ctx, false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Serve runs the actor until ctx ends (an abrupt stop: nothing is committed
// or handed back) or until the session's drain finishes (ErrDrained); see
// serve.
func (a *Actor) Serve(ctx context.Context) error {
	a.deferAcquire = true
	return serve(ctx, a, a.outage, a.runner, a.cfg.Concurrency, a.cfg.QueueSize, a.cfg.Wake)
}

// The loop methods serve drives.

func (a *Actor) common() *Common  { return &a.cfg.Common }
func (a *Actor) what() string     { return "in-flight ranges" }
func (a *Actor) handlers() string { return "handlers" }
func (a *Actor) eager() bool      { return a.starved }
func (a *Actor) inFlight() int    { return a.queued }
func (a *Actor) draining()        {}

// claimAfter: an outcome frees a slot, a reason to claim only when the
// queue was what held the last claim back.
func (a *Actor) claimAfter([]Job) bool { return a.starved }

// begin expires the ranges a restarted claimer's earlier run held: they are
// no longer known, and the heartbeat would keep them alive.
func (a *Actor) begin(ctx context.Context) error {
	// The first sweep probes before it claims: a session that starts idle
	// (thousands of them, at a fleet's start) takes no lease it must then
	// renew and reconcile.
	a.sweep, a.empty, a.begunAt = true, true, a.cfg.Clock.Now()
	if err := a.cfg.Store.ExpireOwnedRanges(ctx, a.cfg.InstanceID, a.cfg.StreamID, a.cfg.DBNow()); err != nil {
		return err
	}
	if a.cfg.Leftovers != nil {
		// What an earlier session left is recorded and released now, not
		// at the first poll tick (ClaimPollRate may be long).
		if err := a.flushAdopting(ctx); err != nil {
			return err
		}
	}
	if a.cfg.Trace != nil {
		a.cfg.Trace(TraceBegun, nil)
	}
	a.settled() // the instance's leases were all let go of
	return nil
}

// settled: nothing of this instance's is left in the database that the
// actor does not know of (a begin, a reconcile); with nothing in memory
// either, the heartbeat renews no leases.
func (a *Actor) settled() {
	a.cleared(a.cfg.Holdings, len(a.ranges) > 0 || len(a.keys) > 0 || a.keyGate != "")
}

// claim is the loop's claim: a sweep (expired leases, the gate probe) only
// when one is due and no takeover is held back (Common.takeoversHeld), and
// again after a reclaim, since more leases may have expired together.
func (a *Actor) claim(ctx context.Context) ([]Job, bool, error) {
	before := a.queued
	held := a.cfg.takeoversHeld(a.begunAt)
	// Held, a sweep still probes (a listening claimer may turn quiet; one
	// that has just begun claims nothing it did not find) but reclaims
	// nothing; a lapsed lease it found keeps the claimer from quiet, and
	// the next sweep tick after the grace reclaims it.
	sweep := a.sweep && (!held || a.cfg.listening() || a.empty)
	if a.wokenQuiet && !sweep && a.cfg.Liveness.Valid() {
		a.wokenQuiet = false
		jobs, _, err := a.claimWith(ctx, false, false)
		if err != nil || a.found { // new positions (or a failure): the wake was a produce's
			return jobs, err == nil && a.more(before), err
		}
		a.sweep, sweep = true, true // none: a hand-back's or a reconnect's wake
	}
	jobs, reclaimed, err := a.claimWith(ctx, sweep, !held)
	if sweep && err == nil && !a.starved && a.cfg.Liveness.Valid() { // the sweep ran
		a.sweep = reclaimed
	}
	return jobs, err == nil && (reclaimed || a.more(before)), err
}

// more: another claim may follow at once, since the last one took a whole
// batch (queued was before it) and did not take the last claimable position.
func (a *Actor) more(before int) bool { return !a.empty && a.queued-before >= a.cfg.BatchLimit }

// sweepTicks is every how many poll ticks the poll's extra work is done
// (see MinSweep): 1 unless ClaimPollRate is below MinSweep.
func sweepTicks(poll time.Duration) int {
	if poll <= 0 || poll >= MinSweep {
		return 1
	}
	return int((MinSweep + poll - 1) / poll)
}

// TakeoverGrace is how long after its session came back from an outage
// (outage.Health.RecoveredAt: an actor reached the database after failing
// to, or a new incarnation replaced a lapsed one) a claimer takes no expired
// lease over: a range's sweep and the exception claim's takeover of running
// rows wait, new positions and due rows do not. Every instance cut off by the
// same outage comes back within about UnreachableRetry, and one whose
// leases expired meanwhile first records what its handlers had settled: a
// lapsed incarnation's salvage, the next session's adoption of a stopped
// session's leftovers. A takeover that came first ran those messages again
// (most of the chaos run's repeats after a PostgreSQL restart). It is half
// the lease, at most MaxTakeoverGrace: a lease that expired during the
// outage was already overdue, and an instance that died for good is taken
// over that much later.
func TakeoverGrace(lease time.Duration) time.Duration { return min(lease/2, MaxTakeoverGrace) }

// MaxTakeoverGrace bounds TakeoverGrace.
const MaxTakeoverGrace = time.Second

// takeoversHeld reports whether the session came back from an outage, or
// the actor began (begunAt; zero for the step functions' callers), less
// than TakeoverGrace ago. A session that begins may be starting right after
// an outage it never saw (its process restarted, or it was started while the
// database was down): its first sweep would race the instances coming back
// from it.
func (c *Common) takeoversHeld(begunAt time.Time) bool {
	at := c.Health.RecoveredAt()
	if begunAt.After(at) {
		at = begunAt
	}
	return !at.IsZero() && c.Clock.Now().Before(at.Add(TakeoverGrace(c.Lease)))
}

// MinSweep bounds how often an actor does the work a poll does beyond
// reading new positions: the range claimer's look for expired and
// handed-back leases and its gate probe, and the exception claimer's claim
// of rows that fell due (its statement visits every key with unresolved
// rows, the most expensive a claimer runs). A ClaimPollRate below it makes
// new positions claimed that often, not those. An expired lease is
// reclaimed, and a retry runs, at most this much later than it could be.
const MinSweep = 100 * time.Millisecond

func (a *Actor) outcome(ctx context.Context, o Outcome) ([]Job, error) { return a.Outcome(ctx, o) }
func (a *Actor) written(context.Context) error                         { return nil }

// flush: on a poll tick, failed commits are retried, and every sweepTicks
// (at most every MinSweep) the sweep becomes due and progress is recorded
// and leftovers adopted. Recording at every tick of a 5 ms ClaimPollRate
// held the loop, and with it the handlers of keyed messages (whose next job
// waits for the loop), in a statement every tick while ranges were in
// flight. Any other flush (after an outage, a salvage) does everything.
func (a *Actor) flush(ctx context.Context, tick bool) ([]Job, error) {
	if tick {
		if a.ticks++; a.ticks < sweepTicks(a.cfg.PollRate) {
			return nil, a.retryCommits(ctx)
		}
		a.ticks, a.sweep = 0, true // the sweep tick
	}
	return nil, a.flushAdopting(ctx)
}
func (a *Actor) reconcile(ctx context.Context) error {
	a.sweep = true // every Lease/3, however long ClaimPollRate is
	holds := len(a.ranges) > 0 || len(a.keys) > 0
	if !a.touched && !holds {
		return nil // nothing taken since the last reconcile: nothing unknown to let go of
	}
	if err := a.Reconcile(ctx); err != nil {
		return err
	}
	a.settled()
	return nil
}

// handBack hands back, then wakes the stream's sessions (quiet ones
// included) so that another instance takes what was released over at once.
// The wake is best effort: without it the ranges are taken over at the next
// sweep.
//
// The wake follows every attempt that finds ranges released and not yet
// woken for, whether or not the attempt as a whole succeeded: an attempt
// that released a range and then failed (say, on a kept key's release) is
// retried with that range already forgotten, and a wake owed for the first
// attempt was lost with it.
func (a *Actor) handBack(ctx context.Context) error {
	err := a.HandBack(ctx)
	if a.released && a.cfg.Listening != nil {
		if a.cfg.Store.SendWakes(ctx, map[int64]*wakeup.Keys{a.cfg.StreamID: {All: true}}) == nil {
			a.released = false
		}
	}
	return err
}
func (a *Actor) abandon() {
	if a.cfg.Trace != nil {
		for _, in := range a.ranges {
			a.cfg.traceAll(TraceAbandoned, in.doneUnrecorded())
		}
	}
}

// newRunner returns the handler runner of an actor with this config: a
// handler starts only once the incarnation is valid.
func (c *Common) newRunner() *runner {
	r := &runner{handler: c.Handler, clock: c.Clock, grace: c.TimeoutGrace, stats: c.Stats}
	if c.Liveness != nil {
		r.gate = c.Liveness.Wait
	}
	return r
}

// reporter returns the actor's outage reporter: once-per-outage logging,
// the backoff, and the session's health.
func (c *Common) reporter(what string) *outage.Reporter {
	return &outage.Reporter{Logger: c.Logger, What: what, Retry: "with backoff", Attrs: []any{"group_id", c.GroupID},
		Health: c.Health, Backoff: backoff.Backoff{Policy: c.Retry}}
}
