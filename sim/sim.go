package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/refresher"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/jackc/pgx/v5"
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
	clock    *clock.Mock
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
	w := &World{seed: seed, st: st, opts: opts, clock: clock.NewMock(), rng: rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d)),
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
	if _, _, err := w.st.DeclareGroupConfig(ctx, w.groupID, docs, "sim", w.now()); err != nil {
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

// Produce writes n messages in one transaction. conc "" is parallel; key
// and routing key may be empty.
func (w *World) Produce(ctx context.Context, n int, key string, conc policy.Concurrency, routingKey string) error {
	ms, err := w.produce(ctx, nil, n, key, conc, routingKey)
	if err != nil {
		return err
	}
	w.produced(ms)
	w.tracef("produce m%d..m%d key=%q %s rk=%q", ms[0].n, ms[len(ms)-1].n, key, orParallel(conc), routingKey)
	return nil
}

// openTx is a producer transaction held open across steps: its messages
// exist only when it commits, below positions handed out meanwhile.
type openTx struct {
	tx   pgx.Tx
	msgs []*message
}

// Begin produces n messages in a transaction it leaves open.
func (w *World) Begin(ctx context.Context, n int) error {
	tx, err := w.st.Pool().Begin(ctx)
	if err != nil {
		return err
	}
	ms, err := w.produce(ctx, tx, n, "", "", "")
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	w.open = append(w.open, &openTx{tx: tx, msgs: ms})
	w.tracef("produce m%d..m%d in a transaction left open", ms[0].n, ms[len(ms)-1].n)
	return nil
}

// Commit commits the oldest open producer transaction.
func (w *World) Commit(ctx context.Context) error {
	if len(w.open) == 0 {
		return nil
	}
	o := w.open[0]
	w.open = w.open[1:]
	if err := o.tx.Commit(ctx); err != nil {
		return err
	}
	w.produced(o.msgs)
	w.tracef("commit m%d..m%d", o.msgs[0].n, o.msgs[len(o.msgs)-1].n)
	return nil
}

// Close rolls back open producer transactions (their messages never existed).
func (w *World) Close(ctx context.Context) {
	for _, o := range w.open {
		_ = o.tx.Rollback(ctx)
	}
	w.open = nil
}

func (w *World) produced(ms []*message) {
	for _, m := range ms {
		w.msgs = append(w.msgs, m)
		w.byID[m.id] = m
	}
}

func (w *World) produce(ctx context.Context, q store.Querier, n int, key string, conc policy.Concurrency, routingKey string) ([]*message, error) {
	msgs := make([]store.NewMessage, n)
	var optDoc []byte
	if conc != "" {
		optDoc, _ = json.Marshal(policy.Options{Concurrency: conc})
	}
	first := w.nextMsg
	for i := range msgs {
		payload, _ := json.Marshal(map[string]int{"n": first + i})
		msgs[i] = store.NewMessage{Version: 1, RoutingKey: routingKey, Key: key, Payload: payload, Options: optDoc}
	}
	out, err := w.st.Produce(ctx, q, store.StreamRef{ID: w.streamID}, msgs, w.now())
	if err != nil { // simulated consumers poll: no wake-ups are sent
		return nil, err
	}
	w.nextMsg += n
	ms := make([]*message, len(out))
	for i, p := range out {
		ms[i] = &message{n: first + i, id: p.ID, key: key, routingKey: routingKey, conc: conc}
	}
	return ms, nil
}

func orParallel(c policy.Concurrency) policy.Concurrency {
	if c == "" {
		return policy.Parallel
	}
	return c
}

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

// handOut records jobs leaving a claimer: keyed ones count as in flight.
func (w *World) handOut(in *instance, jobs []claimer.Job, exc bool) error {
	for _, j := range jobs {
		m := w.byID[j.Delivery.Msg.ID]
		if m == nil {
			return fmt.Errorf("%s was handed message id %d, which the simulator never produced", in.name, j.Delivery.Msg.ID)
		}
		if err := w.checkHandOut(in, j, m); err != nil {
			return err
		}
		if j.Delivery.Concurrency.Keyed() && m.key != "" {
			w.inFlight[m.key]++
		}
		src := "range"
		if exc {
			src = "retry"
		}
		w.tracef("%s %s hands out m%d attempt %d", in.name, src, m.n, j.Delivery.Attempt)
	}
	if exc {
		in.exJobs = append(in.exJobs, jobs...)
	} else {
		in.jobs = append(in.jobs, jobs...)
	}
	return nil
}

func (w *World) finish(j claimer.Job) {
	m := w.byID[j.Delivery.Msg.ID]
	if j.Delivery.Concurrency.Keyed() && m.key != "" {
		w.inFlight[m.key]--
	}
}

// Claim makes one range claim for the instance and applies the key
// acquisitions pending at once.
func (w *World) Claim(ctx context.Context, in *instance) error {
	if err := w.claim(ctx, in); err != nil {
		return err
	}
	for in.cl.Acquiring() {
		if err := w.Acquire(ctx, in); err != nil {
			return err
		}
	}
	return nil
}

// Acquire applies the oldest key acquisition an instance's claims left
// pending, as the serve loop does when the acquisition it ran on another
// connection comes back: the messages queued behind its keys start or park.
func (w *World) Acquire(ctx context.Context, in *instance) error {
	if !in.cl.Acquiring() {
		return nil
	}
	jobs, err := in.cl.Acquire(ctx)
	if err != nil {
		return err
	}
	return w.handOut(in, jobs, false)
}

// Flush runs the instance's range claimer's flush tick: failed commits
// retried, progress recorded, kept keys let go, and the look at whether
// another instance or a keyed retry wants its key gate (decision 0051).
func (w *World) Flush(ctx context.Context, in *instance) error {
	return in.cl.Flush(ctx)
}

// Reconcile runs the instance's range claimer's reconcile tick: what the
// database says it holds without its knowing is let go.
func (w *World) Reconcile(ctx context.Context, in *instance) error {
	return in.cl.Reconcile(ctx)
}

// claim makes one range claim for the instance, leaving the key
// acquisition it needs pending (Acquire applies it).
func (w *World) claim(ctx context.Context, in *instance) error {
	decl, set, err := w.db.BindingsInForce(ctx)
	if err != nil {
		return err
	}
	w.claimDecl, w.claimSet, w.skipErr = decl, set, nil
	reclaimed, quarantined := in.stats.Reclaimed.Load(), in.stats.Quarantined.Load()
	jobs, err := in.cl.Claim(ctx)
	if err != nil {
		return err
	}
	if in.stats.Reclaimed.Load() > reclaimed {
		w.tracef("%s reclaims an expired range", in.name)
	}
	if in.stats.Quarantined.Load() > quarantined {
		w.tracef("%s quarantines the range: its messages become exception rows", in.name)
	}
	if w.skipErr != nil {
		return w.skipErr
	}
	for _, j := range jobs {
		if err := w.checkClaimSet(in, j.Delivery.Msg, j.Delivery.Bindings, true); err != nil {
			return err
		}
	}
	return w.handOut(in, jobs, false)
}

// Retry claims due exception rows for the instance.
func (w *World) Retry(ctx context.Context, in *instance) error {
	jobs, err := in.ex.Claim(ctx)
	if err != nil {
		return err
	}
	return w.handOut(in, jobs, true)
}

// results are the handler outcomes a run step picks from.
var results = []struct {
	weight int
	name   string
	err    error
}{
	{85, "ok", nil},
	{9, "fails", fmt.Errorf("sim: handler fails")},
	{2, "terminal", &policy.TerminalError{Err: fmt.Errorf("sim: terminal")}},
	{4, "delays", &policy.DelayError{D: 500 * time.Millisecond}},
}

func (w *World) pickResult() (string, error) {
	r := w.rng.IntN(100)
	for _, c := range results {
		if r < c.weight {
			return c.name, c.err
		}
		r -= c.weight
	}
	return "ok", nil
}

// RunOne runs the instance's oldest handed-out job with the given result
// (from the PRNG when name is "").
func (w *World) RunOne(ctx context.Context, in *instance, exc bool, name string) error {
	queue := &in.jobs
	if exc {
		queue = &in.exJobs
	}
	if len(*queue) == 0 {
		return nil
	}
	j := (*queue)[0]
	*queue = (*queue)[1:]
	var err error
	if name == "" {
		name, err = w.pickResult()
	} else {
		for _, c := range results {
			if c.name == name {
				err = c.err
			}
		}
	}
	w.nextResult = err
	var o claimer.Outcome
	if exc {
		o = in.ex.Run(ctx, j)
	} else {
		o = in.cl.Run(ctx, j)
	}
	w.nextResult = nil
	w.finish(j)
	m := w.byID[j.Delivery.Msg.ID]
	if o.Err == nil {
		m.succeeded = true
	}
	w.tracef("%s runs m%d: %s", in.name, m.n, name)
	if exc {
		more, oerr := in.ex.Outcome(ctx, o)
		if len(more) > 0 {
			w.Chained += len(more)
			w.tracef("%s retry chain goes on", in.name)
		}
		if herr := w.handOut(in, more, true); herr != nil {
			return herr
		}
		return oerr
	}
	more, oerr := in.cl.Outcome(ctx, o)
	if herr := w.handOut(in, more, false); herr != nil {
		return herr
	}
	return oerr
}

// Beat runs both heartbeats of an instance.
func (w *World) Beat(ctx context.Context, in *instance) error {
	if err := in.beat.Step(ctx); err != nil {
		return err
	}
	if err := in.exBeat.Step(ctx); err != nil {
		return err
	}
	in.lastBeat = w.clock.Now()
	return nil
}

// Crash drops an instance as a killed process would: nothing is handed
// back; its rows lapse after TTL.
func (w *World) Crash(in *instance) {
	for _, j := range append(in.jobs, in.exJobs...) {
		w.finish(j)
	}
	in.jobs, in.exJobs, in.state = nil, nil, gone
	in.frozen, in.frozenExc, in.stalled = nil, nil, false
	w.tracef("%s crashes", in.name)
}

// Stop stops an instance gracefully: its unfinished work is handed back
// and its instance rows are given back.
func (w *World) Stop(ctx context.Context, in *instance) error {
	for _, j := range append(in.jobs, in.exJobs...) {
		w.finish(j)
	}
	in.jobs, in.exJobs = nil, nil
	if in.cl != nil {
		if err := in.cl.HandBack(ctx); err != nil {
			return err
		}
		if err := in.ex.HandBack(ctx); err != nil {
			return err
		}
	}
	for _, id := range []string{in.msgID, in.excID} {
		if err := w.st.DeleteInstance(ctx, id); err != nil {
			return err
		}
	}
	in.state = gone
	w.tracef("%s stops", in.name)
	return nil
}

// Stall freezes an instance for d of mock time: its actors take no step
// while the others go on (a long GC pause, a frozen VM, SIGSTOP). Its
// handlers in flight stay where they are, frozen.
func (w *World) Stall(in *instance, d time.Duration) {
	for _, j := range in.jobs {
		w.finish(j)
	}
	for _, j := range in.exJobs {
		w.finish(j)
	}
	in.frozen, in.frozenExc, in.jobs, in.exJobs = in.jobs, in.exJobs, nil, nil
	in.stalled, in.stalledUntil = true, w.clock.Now().Add(d)
	w.Stalls++
	w.tracef("%s stalls for %s", in.name, d)
}

// resume wakes a stalled instance as the engine does: nothing of it starts
// before a renewal says whether its incarnation is still valid. A valid one
// goes on with its frozen handlers; a lapsed one (its row expired while it
// slept: the fleet may have taken its work) drops every in-memory state and
// registers again under new ids, binding check included, then refreshes
// its config. IgnoreLapse (a broken variant) goes on regardless.
func (w *World) resume(ctx context.Context, in *instance) error {
	in.stalled = false
	thaw := func() {
		for _, j := range append(in.frozen, in.frozenExc...) {
			if m := w.byID[j.Delivery.Msg.ID]; j.Delivery.Concurrency.Keyed() && m.key != "" {
				w.inFlight[m.key]++
			}
		}
		in.jobs, in.exJobs = append(in.frozen, in.jobs...), append(in.frozenExc, in.exJobs...)
		in.frozen, in.frozenExc = nil, nil
	}
	if in.state != consuming || w.opts.IgnoreLapse {
		w.tracef("%s resumes", in.name)
		thaw()
		return nil
	}
	if err := w.Beat(ctx, in); err != nil {
		return err
	}
	if !in.beat.Lost() && !in.exBeat.Lost() {
		w.tracef("%s resumes", in.name)
		thaw()
		return nil
	}
	// The frozen handlers are abandoned: their outcomes would settle
	// nothing (the token fence), and the tree that ran them is gone.
	in.frozen, in.frozenExc = nil, nil
	in.incarnation++
	w.Lapses++
	in.msgID, in.excID = engine.NewID(), engine.NewID()
	in.reg.SetInstances([]store.InstanceInsert{
		{ID: in.msgID, WorkerConfigID: w.workers[store.WorkerMessageConsumer], TTL: w.opts.TTL},
		{ID: in.excID, WorkerConfigID: w.workers[store.WorkerExceptionConsumer], TTL: w.opts.TTL},
	})
	in.cl, in.ex, in.beat, in.exBeat, in.state = nil, nil, nil, nil, waiting
	w.tracef("%s resumes lapsed: registers again as incarnation %d", in.name, in.incarnation+1)
	if _, err := in.ref.Step(ctx); err != nil {
		return err
	}
	in.lastRefresh = w.clock.Now()
	return w.attempt(ctx, in)
}

// Advance moves the clock by d and runs what falls due: heartbeats,
// refreshes, and the binding attempts of waiting instances. A beat is
// skipped with probability skip as long as the instance stays well inside
// its TTL (a slow beat, not a partition). A stalled instance takes no step
// until its stall is over; then it resumes.
func (w *World) Advance(ctx context.Context, d time.Duration, skip float64) error {
	w.clock.Add(d)
	now := w.clock.Now()
	for _, in := range w.live() {
		if in.stalled {
			if now.Before(in.stalledUntil) {
				continue
			}
			if err := w.resume(ctx, in); err != nil {
				return err
			}
			// Then whatever fell due while it slept (its refresh first of all).
		}
		if in.state == waiting {
			if now.Sub(in.lastTry) >= w.opts.BindingRetryInterval {
				if err := w.attempt(ctx, in); err != nil {
					return err
				}
			}
			continue
		}
		since := now.Sub(in.lastBeat)
		if since >= w.opts.TTL/3 && (since >= w.opts.TTL/2 || w.rng.Float64() >= skip) {
			if err := w.Beat(ctx, in); err != nil {
				return err
			}
		}
		if !w.opts.SkipRefresh && now.Sub(in.lastRefresh) >= w.opts.RefreshInterval {
			if _, err := in.ref.Step(ctx); err != nil {
				return err
			}
			in.lastRefresh = now
		}
	}
	return nil
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
