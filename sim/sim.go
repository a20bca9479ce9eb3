package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
)

// Epoch is where every simulation's clock starts.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Options shape a world. The zero value is a valid world with the
// defaults below.
type Options struct {
	// TTL is each instance's InstanceTTL (default 6s); heartbeats are due
	// every TTL/3.
	TTL time.Duration
	// RefreshInterval is the group config refresh interval (default 2s).
	RefreshInterval time.Duration
	// BindingRetryInterval is how often a waiting instance tries again
	// (default 1s).
	BindingRetryInterval time.Duration
	// BatchLimit and QueueSize bound each instance's claims (defaults 5, 10).
	BatchLimit, QueueSize int
	// Broken switches on deliberately broken variants of the engine.
	Broken hooks.Broken
	// SkipRefresh breaks config convergence (instances never refresh);
	// ClaimWhileWaiting lets waiting instances claim; IgnoreLapse lets an
	// instance resumed from a stall past its TTL go on with its old state
	// instead of registering again as a new incarnation.
	SkipRefresh, ClaimWhileWaiting, IgnoreLapse bool
	// Only, if set, checks that one invariant alone (the broken-variant
	// tests show each one catches its own fault).
	Only string
	// Weights overrides random steps' weights by name ("stall": 10), for a
	// broken variant that a rare step exposes.
	Weights map[string]int
}

func (o *Options) defaults() {
	if o.TTL == 0 {
		o.TTL = 6 * time.Second
	}
	if o.RefreshInterval == 0 {
		o.RefreshInterval = 2 * time.Second
	}
	if o.BindingRetryInterval == 0 {
		o.BindingRetryInterval = time.Second
	}
	if o.BatchLimit == 0 {
		o.BatchLimit = 5
	}
	if o.QueueSize == 0 {
		o.QueueSize = 2 * o.BatchLimit
	}
}

// message is what the simulator knows about one produced message.
type message struct {
	n          int // the simulator's own number, in produce order
	id         int64
	key        string
	routingKey string
	conc       policy.Concurrency
	succeeded  bool
	skipped    bool // settled undelivered: the set in force did not route it here
}

// World is one simulation: real PostgreSQL, one mock clock, one seeded
// PRNG deciding everything else. Every step runs on the caller's goroutine.
type World struct {
	// Chained counts exception rows started by the settlement of the row
	// before them in an ordered chain (no claim between).
	Chained int
	// Stalls counts stalls; Lapses those an instance came back from as a
	// new incarnation (its row had expired while it slept).
	Stalls, Lapses int
	// gates and gatesGivenUp count the key gates (decision 0051) granted
	// to and given up by the range claimers of earlier incarnations.
	gates, gatesGivenUp int64
	seed                uint64

	st       *store.Store
	opts     Options
	clock    *clocks.Mock
	rng      *rand.Rand
	logger   *slog.Logger
	streamID int64
	groupID  int64
	db       store.Group // the group's handle on the store
	workers  map[string]int64

	msgs     []*message // committed, in produce order
	byID     map[int64]*message
	nextMsg  int
	open     []*openTx
	inst     []*instance
	nextInst int
	inFlight map[string]int // keyed messages handed out and not finished, by key
	trace    []string

	// Config convergence: the latest declaration, and when it was made.
	declared   groupconfig.Declared
	declaredAt time.Time

	ledger map[int64]string // binding ledger rows seen, for append-only
	// nextResult is the handler's result for the attempt being run.
	nextResult error
	// The binding set in force at the claim being made, and the first
	// violation the Skipped hook saw during it.
	claimDecl int64
	claimSet  []string
	skipErr   error
}

type instState int

const (
	waiting instState = iota
	consuming
	gone
)

type instance struct {
	name         string
	patterns     []string
	msgID, excID string
	state        instState
	reg          *registrar.Actor
	beat, exBeat *heartbeat.Actor
	lastBeat     time.Time
	ref          *refresher.Actor
	lastRefresh  time.Time
	snap         *groupconfig.Snapshot
	cl           *claimer.Actor
	ex           *claimer.ExceptionActor
	jobs, exJobs []claimer.Job // handed out, not yet run
	lastTry      time.Time     // last binding attempt while waiting
	stats        *claimer.Stats
	// A stalled instance's actors take no step until stalledUntil (a GC
	// pause, a frozen VM); its handlers in flight at the freeze wait in
	// frozen and frozenExc, out of the in-flight count (nothing can recall
	// them, and the invariants exclude them).
	stalled           bool
	stalledUntil      time.Time
	frozen, frozenExc []claimer.Job
	incarnation       int
}

// New sets up a world on st (a fresh schema): the stream "sim" and its group
// "g", declared with cfg.
func New(ctx context.Context, st *store.Store, seed uint64, opts Options, cfg groupconfig.Declared) (*World, error) {
	opts.defaults()
	w := &World{seed: seed, st: st, opts: opts, clock: clocks.NewMock(), rng: rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d)),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)), byID: map[int64]*message{}, inFlight: map[string]int{},
		ledger: map[int64]string{}}
	w.clock.Set(Epoch)
	row, _, _, _, err := st.RegisterStream(ctx, "sim", []byte(`{}`), "sim", w.now())
	if err != nil {
		return nil, err
	}
	g, err := st.RegisterGroup(ctx, row.ID, "g", "earliest", w.now())
	if err != nil {
		return nil, err
	}
	w.streamID, w.groupID, w.workers = row.ID, g.ID, g.Workers
	w.db = w.st.Group(row.ID, g.ID)
	if err := w.declare(ctx, cfg); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *World) now() store.Now { t := w.clock.Now(); return &t }

// Trace returns the run's trace so far.
func (w *World) Trace() []string { return w.trace }

func (w *World) tracef(format string, args ...any) {
	at := w.clock.Now().Sub(Epoch)
	w.trace = append(w.trace, fmt.Sprintf("%9s  ", at.Truncate(time.Millisecond))+fmt.Sprintf(format, args...))
}

func (w *World) declare(ctx context.Context, cfg groupconfig.Declared) error {
	docs, err := cfg.Docs()
	if err != nil {
		return err
	}
	if _, _, err := w.st.DeclareGroupConfig(ctx, store.GroupConfigParams{GroupID: w.groupID, Docs: docs, DeclaredBy: "sim", Now: w.now()}); err != nil {
		return err
	}
	w.declared, w.declaredAt = cfg, w.clock.Now()
	return nil
}

// Start starts an instance declaring patterns (none: the whole stream). It
// makes its first binding attempt at once.
func (w *World) Start(ctx context.Context, patterns []string) (string, error) {
	set := topic.NormalizeSet(patterns)
	regexes := make([]string, len(set))
	for i, p := range set {
		c, err := topic.Compile(p)
		if err != nil {
			return "", err
		}
		regexes[i] = c.Regex()
	}
	w.nextInst++
	in := &instance{name: fmt.Sprintf("i%d", w.nextInst), patterns: set, msgID: engine.NewID(), excID: engine.NewID(),
		snap: groupconfig.NewSnapshot(groupconfig.Declared{})}
	dbNow := engine.DBNow(w.clock)
	in.reg = registrar.New(registrar.Config{Store: w.st, StreamID: w.streamID, GroupID: w.groupID, GroupName: "g",
		Patterns: set, Regexes: regexes, DeclaredBy: in.name,
		Instances: []store.InstanceInsert{
			{ID: in.msgID, WorkerConfigID: w.workers[store.WorkerMessageConsumer], TTL: w.opts.TTL},
			{ID: in.excID, WorkerConfigID: w.workers[store.WorkerExceptionConsumer], TTL: w.opts.TTL},
		},
		Interval: w.opts.BindingRetryInterval, Clock: w.clock, Logger: w.logger, DBNow: dbNow})
	in.ref = refresher.New(refresher.Config{Store: w.st, GroupID: w.groupID, Interval: w.opts.RefreshInterval,
		Snapshot: in.snap, Clock: w.clock, Logger: w.logger})
	w.inst = append(w.inst, in)
	if _, err := in.ref.Step(ctx); err != nil {
		return "", err
	}
	in.lastRefresh = w.clock.Now()
	return in.name, w.attempt(ctx, in)
}

// attempt makes one binding attempt of a waiting instance; when it installs
// or joins, the instance's actors are built and it consumes.
func (w *World) attempt(ctx context.Context, in *instance) error {
	res, err := in.reg.Step(ctx)
	if err != nil {
		return err
	}
	in.lastTry = w.clock.Now()
	if res.Outcome == store.BindingWaiting {
		if in.cl == nil || !w.opts.ClaimWhileWaiting {
			w.tracef("%s waits: wants %v, installed %v held by %d live", in.name, in.patterns, res.Installed, res.Live)
		}
		if w.opts.ClaimWhileWaiting && in.cl == nil {
			w.build(in)
		}
		return nil
	}
	w.tracef("%s %s %v", in.name, res.Outcome, in.patterns)
	in.state = consuming
	w.build(in)
	return nil
}

func (w *World) build(in *instance) {
	dbNow := engine.DBNow(w.clock)
	beat := func(id, worker string) *heartbeat.Actor {
		return heartbeat.New(heartbeat.Config{Registered: true, Store: w.st, StreamID: w.streamID,
			WorkerConfigID: w.workers[worker], InstanceID: id, DeclaredBy: in.name, TTL: w.opts.TTL,
			Clock: w.clock, Logger: w.logger, DBNow: dbNow,
			Graceful: func() bool { return true }})
	}
	in.beat, in.exBeat = beat(in.msgID, store.WorkerMessageConsumer), beat(in.excID, store.WorkerExceptionConsumer)
	in.lastBeat = w.clock.Now()
	if in.stats != nil {
		w.gates += in.stats.KeyGates.Load()
		w.gatesGivenUp += in.stats.KeyGatesGivenUp.Load()
	}
	in.stats = &claimer.Stats{}
	skipped := func(m *store.Message, bindings int64) {
		if err := w.checkClaimSet(in, m, bindings, false); err != nil && w.skipErr == nil {
			w.skipErr = err
		}
		if sm := w.byID[m.ID]; sm != nil {
			sm.skipped = true
			w.tracef("%s range skips m%d rk=%q", in.name, sm.n, sm.routingKey)
		}
	}
	common := claimer.Common{Hooks: &hooks.Hooks{Skipped: skipped, Broken: w.opts.Broken}, Store: w.st, StreamID: w.streamID, GroupID: w.groupID, Handler: w.handle,
		Group: in.snap.Group, Concurrency: 1, PollRate: time.Second, Lease: w.opts.TTL, KeyBusyDelay: 100 * time.Millisecond,
		TimeoutGrace: time.Second, ShutdownTimeout: func() time.Duration { return time.Second },
		Clock: w.clock, Logger: w.logger, DBNow: dbNow, Stats: in.stats}
	rc := common
	rc.InstanceID = in.msgID
	in.cl = claimer.New(claimer.Config{Common: rc, BatchLimit: w.opts.BatchLimit, QueueSize: w.opts.QueueSize, StallAfter: time.Hour,
		WorkerConfigID: w.workers[store.WorkerMessageConsumer]})
	in.cl.DeferAcquire(true) // as the serve loop: random steps interleave with a claim's key acquisition
	ec := common
	ec.InstanceID = in.excID
	in.ex = claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec, Prefetch: w.opts.BatchLimit}) // as the engine
}

// handle is every instance's handler: it returns what the step decided.
func (w *World) handle(context.Context, *claimer.Delivery) error { return w.nextResult }

func (w *World) instance(name string) (*instance, error) {
	for _, in := range w.inst {
		if in.name == name && in.state != gone {
			return in, nil
		}
	}
	return nil, fmt.Errorf("no running instance %q", name)
}

// KeyGates counts the key gates (decision 0051) the range claimers were
// granted so far, and those they gave up because another instance or a
// keyed retry wanted the keys.
func (w *World) KeyGates() (granted, givenUp int64) {
	granted, givenUp = w.gates, w.gatesGivenUp
	for _, in := range w.inst {
		if in.stats != nil {
			granted += in.stats.KeyGates.Load()
			givenUp += in.stats.KeyGatesGivenUp.Load()
		}
	}
	return granted, givenUp
}

func (w *World) live() []*instance {
	var out []*instance
	for _, in := range w.inst {
		if in.state != gone {
			out = append(out, in)
		}
	}
	return out
}

// awake lists the live instances that are not stalled.
func (w *World) awake() []*instance {
	var out []*instance
	for _, in := range w.live() {
		if !in.stalled {
			out = append(out, in)
		}
	}
	return out
}

func (w *World) consumers() []*instance {
	var out []*instance
	for _, in := range w.inst {
		if in.stalled {
			continue
		}
		if in.state == consuming || (in.state == waiting && in.cl != nil && w.opts.ClaimWhileWaiting) {
			out = append(out, in)
		}
	}
	return out
}

// Summary is the state of every produced message, for the trace.
func (w *World) Summary(ctx context.Context) (string, error) {
	status, err := w.status(ctx)
	if err != nil {
		return "", err
	}
	var handled, skipped, dead, pending []string
	for _, m := range w.msgs {
		switch {
		case status[m.id] == policy.StatusDead:
			dead = append(dead, fmt.Sprintf("m%d", m.n))
		case m.succeeded && status[m.id] == "":
			handled = append(handled, fmt.Sprintf("m%d", m.n))
		case m.skipped && status[m.id] == "":
			skipped = append(skipped, fmt.Sprintf("m%d", m.n))
		default:
			pending = append(pending, fmt.Sprintf("m%d", m.n))
		}
	}
	return fmt.Sprintf("handled %d, not routed here %d [%s], dead %d [%s], unsettled %d [%s]", len(handled),
		len(skipped), strings.Join(skipped, " "), len(dead), strings.Join(dead, " "),
		len(pending), strings.Join(pending, " ")), nil
}

// Settle runs the live consuming instances until every message is handled
// or dead, advancing the clock as retries come due; it fails after limit
// rounds.
func (w *World) Settle(ctx context.Context, limit int) error {
	for round := 0; round < limit; round++ {
		unsettled, err := w.unsettled(ctx)
		if err != nil {
			return err
		}
		if len(unsettled) == 0 {
			return nil
		}
		for _, in := range w.consumers() {
			for in.cl.Acquiring() { // as the serve loop: an acquisition always comes back
				if err := w.Acquire(ctx, in); err != nil {
					return err
				}
			}
			for in.cl.Queued()+w.opts.BatchLimit <= w.opts.QueueSize {
				before := len(in.jobs)
				if err := w.Claim(ctx, in); err != nil {
					return err
				}
				if len(in.jobs) == before {
					break
				}
			}
			for len(in.jobs) > 0 {
				if err := w.RunOne(ctx, in, false, "ok"); err != nil {
					return err
				}
			}
			if err := w.Retry(ctx, in); err != nil {
				return err
			}
			for len(in.exJobs) > 0 {
				if err := w.RunOne(ctx, in, true, "ok"); err != nil {
					return err
				}
			}
		}
		if err := w.Check(ctx); err != nil {
			return err
		}
		if err := w.Advance(ctx, 500*time.Millisecond, 0); err != nil {
			return err
		}
	}
	unsettled, err := w.unsettled(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, m := range unsettled {
		names = append(names, fmt.Sprintf("m%d", m.n))
	}
	detail := fmt.Sprintf("after %d settle rounds, unsettled: %s", limit, strings.Join(names, " "))
	if !w.checks("NoMessageLost") {
		return errors.New("did not settle: " + detail)
	}
	return &Violation{Invariant: "NoMessageLost", Detail: detail}
}

// unsettled lists messages neither handled nor dead.
func (w *World) unsettled(ctx context.Context) ([]*message, error) {
	status, err := w.status(ctx)
	if err != nil {
		return nil, err
	}
	var out []*message
	for _, m := range w.msgs {
		if status[m.id] == policy.StatusDead || ((m.succeeded || m.skipped) && status[m.id] == "") {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// sortedKeys is deterministic map iteration.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
