package claimer

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// ExceptionConfig is the exception claimer's config. Its InstanceID is its
// own worker_instance (exception_consumer), renewed by its own heartbeat.
type ExceptionConfig struct {
	Common
	// Chain is how many rows of an ordered or exclusive key a claim leases
	// behind the key's head, to run one after the other under its lease
	// without a claim between them (default DefaultChain; negative: none).
	Chain int
	// Prefetch is how many due rows of no key lease a claim leases beyond
	// the free handler slots, queued for the slots to run in turn (0:
	// none; the engine passes ConsumeOptions.BatchLimit). A claim costs
	// about as much for one row as for a thousand: with a slot's worth a
	// claim, 10% of a burn-down failing once ran at a few hundred retries
	// a second. A prefetched row is 'queued' in the table, so that its
	// lease lapsing spends no attempt; it comes back as a takeover, which
	// starts in a slot of its own, 'running' (decision 0036).
	Prefetch int
	// Wake, if set, receives a value when the group's exception rows fell
	// due by an operator's action (a redrive): the claimer claims at once
	// instead of at its next poll, quiet or not.
	Wake <-chan struct{}
}

// DefaultChain is ExceptionConfig.Chain's default.
const DefaultChain = 20

type excRun struct {
	run store.ExceptionRun
	eff policy.Effective
	// unwritten is a settlement whose write failed; Flush retries it.
	unwritten *store.Settlement
	// queued are the next rows of the run's key, leased in the same claim,
	// in log order: each starts when the one before settles (an ordered
	// key's only when it resolved), handed the key lease.
	queued []store.ExceptionRun
	// keyHeld: the run holds its key's lease (acquired, or handed over by
	// the row before it), which its settlement can hand on.
	keyHeld bool
}

// ExceptionActor retries a group's exception rows: it leases due rows with
// FOR UPDATE SKIP LOCKED under a token, runs each under the message's policy
// resolved against the group config of that moment (a message mid-retry
// follows a redeclared curve from its next attempt), and writes the result
// under the token: deleted on success, rescheduled on the curve, or dead.
//
// An ordered key's rows come as a chain: the head runs, and when it
// resolves (succeeds or dies) its settlement starts the next row and hands
// it the key lease in the same statement. When it is rescheduled instead,
// the rest of the chain goes back to pending, spending nothing.
type ExceptionActor struct {
	cfg     ExceptionConfig
	db      store.Group
	runner  *runner
	running map[store.Position]*excRun
	outage  *outage.Reporter
	// answered counts the store calls the database answered (the outage
	// reporter's Reached).
	answered atomic.Uint64
	// draining_: a drain is under way, so no chain starts its next row.
	draining_ bool
	// pending are rows whose settlement apply queued for writePending.
	pending []*excRun
	// adopted are the rows an earlier session of the consumer left
	// (Leftovers), still to be written.
	adopted []*excRun
	// idle paces the serve loop's claims (the step functions ignore it): a
	// claim that left slots free took every row then due, so that many of
	// the next poll ticks do not claim (sweepTicks-1: none unless
	// ClaimPollRate is below MinSweep). An outcome that frees a slot claims
	// at once. A row that falls due meanwhile (its backoff ends, or another
	// instance parks it) waits up to MinSweep for its next attempt.
	idle int
	// begunAt is when the serve loop's begin ran: takeovers wait
	// TakeoverGrace after it (zero for the step functions' callers).
	begunAt time.Time
	// empty: the last claim leased nothing, so the next one first asks
	// whether anything is due (store.ExceptionsDue), which costs a fraction
	// of the claim's planning.
	empty bool
	// noneDue: the last probe found nothing due; dueAt is when its
	// earliest pending row falls due (zero: none) (quiet).
	noneDue bool
	dueAt   time.Time
	leaseBook
	parsedOptions
}

// NewExceptionActor returns an exception claimer.
func NewExceptionActor(cfg ExceptionConfig) *ExceptionActor {
	if cfg.Chain == 0 {
		cfg.Chain = DefaultChain
	}
	if cfg.Chain < 0 || cfg.TxHandler != nil { // a transactional row settles alone (tx.go)
		cfg.Chain = 0
	}
	cfg.Prefetch = max(cfg.Prefetch, 0)
	a := &ExceptionActor{cfg: cfg, running: map[store.Position]*excRun{}, runner: cfg.newRunner()}
	a.db = cfg.Store.Group(cfg.StreamID, cfg.GroupID).InLane(true).Counting(&a.answered)
	a.outage = cfg.reporter("exception claimer store call", &a.answered)
	if a.runner.tx != nil {
		a.runner.tx.settler = a
	}
	return a
}

// Running returns how many rows are leased and started, not settled.
func (a *ExceptionActor) Running() int { return len(a.running) }

// Run executes one job synchronously (the step tests drive).
func (a *ExceptionActor) Run(ctx context.Context, j Job) Outcome { return a.runner.Run(ctx, j) }

// Claim leases due rows up to the free worker slots, and up to Prefetch
// more of no key lease, and returns their jobs; rows whose lease expired are
// taken over only outside TakeoverGrace. With every slot busy it claims only
// once the prefetched rows waiting are down to half of Prefetch.
func (a *ExceptionActor) Claim(ctx context.Context) ([]Job, error) {
	free, prefetch := a.room()
	if free+prefetch <= 0 || !a.cfg.Liveness.Valid() {
		return nil, nil
	}
	if err := a.cfg.Hooks.At(hooks.ExceptionsClaim); err != nil {
		return nil, err
	}
	hold := a.cfg.takeoversHeld(a.begunAt)
	a.noneDue = false
	if a.cfg.Nudge.take() {
		a.empty = true // the range claimer wrote rows: the probe says when they are due
	}
	if a.empty {
		due, wait, err := a.db.ExceptionsDue(ctx, a.cfg.DBNow(), hold)
		if err != nil || !due {
			if err == nil {
				a.noneDue, a.dueAt = true, time.Time{}
				if wait >= 0 {
					a.dueAt = a.cfg.Clock.Now().Add(wait)
				}
			}
			return nil, err
		}
	}
	a.leasing(a.cfg.Holdings)
	rows, err := a.db.ClaimExceptions(ctx, store.ClaimExceptions{Owner: a.cfg.InstanceID, Limit: free, Prefetch: prefetch, Chain: a.cfg.Chain,
		Lease: a.cfg.Lease, Now: a.cfg.DBNow(), HoldTakeovers: hold})
	if err != nil {
		return nil, err
	}
	a.empty = len(rows) == 0
	var heads []*excRun
	var orphans []store.ExceptionRun
	chains := map[string]*excRun{}
	for _, row := range rows {
		if row.Queued {
			if h := chains[row.Key]; h != nil {
				h.queued = append(h.queued, row)
			} else {
				orphans = append(orphans, row) // cannot happen: the SQL queues rows behind a head only
			}
			continue
		}
		r := &excRun{run: row}
		heads = append(heads, r)
		if row.Key != "" {
			chains[row.Key] = r
		}
	}
	var jobs []Job
	errs := []error{a.giveBack(ctx, orphans)}
	for _, r := range heads {
		more, err := a.startRow(ctx, r, false)
		jobs, errs = append(jobs, more...), append(errs, err)
	}
	return jobs, errors.Join(errs...)
}

// room returns how many rows a claim now starts (free handler slots) and
// prefetches. Every row leased and not settled is in a.running, started or
// waiting for a slot in the pool's queue.
func (a *ExceptionActor) room() (free, prefetch int) {
	free = max(a.cfg.Concurrency-len(a.running), 0)
	waiting := max(len(a.running)-a.cfg.Concurrency, 0) // prefetched, not yet started
	if a.cfg.Prefetch == 0 || (free == 0 && waiting > a.cfg.Prefetch/2) {
		return free, 0
	}
	return free, a.cfg.Prefetch - waiting
}

// startRow starts a leased row: dead at once if its holders died on it too
// often, back to pending if its key is busy, else a job. A chain's next row
// starts with the key lease handed over (haveKey).
func (a *ExceptionActor) startRow(ctx context.Context, r *excRun, haveKey bool) ([]Job, error) {
	m := &r.run.Message
	r.eff = a.resolve(m, a.cfg.Group())
	r.eff.Concurrency = policy.Concurrency(r.run.Concurrency) // pinned at first claim
	if r.run.Expired && r.run.Attempts > r.eff.MaxRetries {
		// Its holder died on it too often: a message that kills its
		// process ends here.
		a.cfg.Stats.Dead.Add(1)
		return a.settle(ctx, r, store.Settlement{Status: policy.StatusDead, Attempts: r.run.Attempts,
			Delays: r.run.Delays, Error: "lease expired on its last attempt: the instance running it died or stopped renewing"})
	}
	r.keyHeld = haveKey
	if !haveKey && r.eff.Concurrency.Keyed() && m.Key != "" {
		a.leasing(a.cfg.Holdings)
		held, _, err := a.db.AcquireKeys(ctx, store.AcquireKeys{Want: []store.KeyClaim{{Key: m.Key, Position: m.Position}},
			Token: r.run.Token, Owner: a.cfg.InstanceID, TTL: a.cfg.Lease, Now: a.cfg.DBNow()})
		if err != nil || !held[m.Key] {
			a.cfg.Stats.Deferred.Add(1)
			jobs, serr := a.settle(ctx, r, store.Settlement{Status: policy.StatusPending, Attempts: r.run.Attempts,
				Delays: r.run.Delays, Error: keyBusyReason, After: a.cfg.KeyBusyDelay})
			return jobs, errors.Join(err, serr)
		}
		r.keyHeld = true
	}
	a.running[m.Position] = r
	a.cfg.Stats.Retried.Add(1)
	return []Job{{Ref: Ref{row: m.Position, token: r.run.Token}, eff: r.eff, Delivery: Delivery{Msg: m, Attempt: r.run.Attempts + 1,
		Delays: r.run.Delays, Concurrency: r.eff.Concurrency, Timeout: r.eff.Timeout}}}, nil
}

// settle writes a row's settlement. A row holding its key hands it to the
// next row of its chain, which begins: an exclusive key's whatever the
// result, an ordered key's only when the row resolved (deleted or dead: a
// later message of an ordered key waits for a retried one). Otherwise the
// chain goes back to pending. A failed write is kept for Flush.
func (a *ExceptionActor) settle(ctx context.Context, r *excRun, s store.Settlement) ([]Job, error) {
	s.Next = nil
	resolved := s.Delete || s.Status == policy.StatusDead
	if r.keyHeld && len(r.queued) > 0 && !a.draining_ && (resolved || r.eff.Concurrency != policy.Ordered) {
		s.Next = &r.queued[0]
	}
	s.Position, s.Token, s.Now = r.run.Position, r.run.Token, a.cfg.DBNow()
	started, err := a.db.SettleException(ctx, s)
	switch {
	case err == nil:
		a.cfg.Hooks.TraceOne(hooks.TraceRecorded, r.run.Message.ID)
	case errors.Is(err, store.ErrLeaseLost):
		a.cfg.Hooks.TraceOne(hooks.TraceLost, r.run.Message.ID)
	}
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		a.cfg.Stats.LeasesLost.Add(1)
		delete(a.running, r.run.Position)
		return nil, a.giveBack(ctx, r.queued)
	case err != nil:
		r.unwritten = &s // kept, and written again by Flush
		a.running[r.run.Position] = r
		return nil, err
	}
	delete(a.running, r.run.Position)
	if s.Next == nil || !started {
		return nil, a.giveBack(ctx, r.queued)
	}
	return a.startRow(ctx, &excRun{run: r.queued[0], queued: r.queued[1:]}, true)
}

// giveBack returns queued rows to pending. Should the write fail, Reconcile
// finds them: they are no longer among this actor's tokens.
func (a *ExceptionActor) giveBack(ctx context.Context, runs []store.ExceptionRun) error {
	if len(runs) == 0 {
		return nil
	}
	return a.db.ReturnRuns(ctx, runs, a.cfg.DBNow())
}

// Outcome writes one attempt's result under the row's lease token and
// returns the job of the chain's next row, if it starts.
func (a *ExceptionActor) Outcome(ctx context.Context, o Outcome) ([]Job, error) {
	jobs, err := a.apply(ctx, o)
	return jobs, errors.Join(err, a.writePending(ctx))
}

// Outcomes applies several attempts' results as the serve loop does with
// the outcomes waiting at once: the settlements of unkeyed rows are
// written together, in one statement (writePending), the others each at
// once.
func (a *ExceptionActor) Outcomes(ctx context.Context, os []Outcome) ([]Job, error) {
	var jobs []Job
	var errs []error
	for _, o := range os {
		more, err := a.apply(ctx, o)
		jobs, errs = append(jobs, more...), append(errs, err)
	}
	return jobs, errors.Join(append(errs, a.writePending(ctx))...)
}

// batchable: the row's settlement may wait for writePending, which writes
// several in one statement. A keyed row's settlement (exclusive or
// ordered) also moves or frees its key lease (and may start its chain's
// next row), so it is written alone, at once.
func (r *excRun) batchable() bool {
	return (r.run.Key == "" || r.run.Concurrency == string(policy.Parallel)) && len(r.queued) == 0
}

// apply decides one attempt's result. A batchable row's settlement is kept
// as unwritten and queued for writePending (the serve loop calls it once
// the outcomes already waiting are in); any other is written now.
func (a *ExceptionActor) apply(ctx context.Context, o Outcome) ([]Job, error) {
	a.cfg.Hooks.Point(hooks.ExceptionsOutcome)
	pos := o.Ref.row
	r, ok := a.running[pos]
	if !ok || o.Canceled {
		a.cfg.Hooks.TraceOne(hooks.TraceDropped, o.msgID)
		return nil, nil
	}
	a.cfg.Hooks.TraceOne(hooks.TraceApplied, r.run.Message.ID)
	switch {
	case o.tx.lost:
		// Its transaction committed nothing known: the row goes back to
		// pending under its token, no attempt spent; a commit that did
		// apply left no row under the token (the write finds it gone).
		return a.settle(ctx, r, store.Settlement{Status: policy.StatusPending, Attempts: r.run.Attempts, Delays: r.run.Delays,
			Error: "handed back: " + errText(o.Err)})
	case o.tx.recorded: // settled in the handler's transaction
		a.cfg.Stats.count(o.tx.next, o.Err, r.run.Attempts)
		a.cfg.observeAttempt(o, o.tx.next, r.run.Attempts, r.run.Message.ProducedAt)
		a.cfg.Hooks.TraceOne(hooks.TraceRecorded, r.run.Message.ID)
		delete(a.running, pos)
		return nil, a.giveBack(ctx, r.queued)
	}
	group := a.cfg.Group()
	next := policy.Decide(a.atWrite(r.eff, &r.run.Message, group), group.InitialBackoffOrDefault(), r.run.Attempts, r.run.Delays, o.Err)
	a.cfg.Stats.count(next, o.Err, r.run.Attempts)
	a.cfg.observeAttempt(o, next, r.run.Attempts, r.run.Message.ProducedAt)
	s := store.Settlement{Delete: next.Delete, Status: next.Status, Attempts: next.Attempts, Delays: next.Delays,
		After: next.After, Error: errText(o.Err), Attempt: r.run.Attempts + 1}
	if outcome := policy.OutcomeOf(next, o.Err, r.run.Attempts); group.Logs(outcome) {
		s.Outcome = outcome
	}
	if r.batchable() {
		r.unwritten = &s
		a.pending = append(a.pending, r)
		return nil, nil
	}
	return a.settle(ctx, r, s)
}

// writePending writes the settlements apply queued, and any other
// batchable row's that an earlier write failed to write, in one statement
// and one commit (store.SettleExceptions). On failure they stay unwritten:
// Flush tries again, a hand-back writes them, a lapse leaves them.
func (a *ExceptionActor) writePending(ctx context.Context) error {
	queued := a.pending
	a.pending = nil
	seen := make(map[*excRun]bool, len(queued))
	var batch []*excRun
	for _, r := range queued {
		if !seen[r] && r.unwritten != nil && a.running[r.run.Position] == r {
			seen[r] = true
			batch = append(batch, r)
		}
	}
	if len(batch) == 0 {
		return nil
	}
	slices.SortFunc(batch, func(x, y *excRun) int { return positionOrder(x.run.Position, y.run.Position) }) // lock order: locks.go
	ss := make([]store.Settlement, len(batch))
	now := a.cfg.DBNow()
	for i, r := range batch {
		ss[i] = *r.unwritten
		ss[i].Next = nil
		ss[i].Position, ss[i].Token, ss[i].Now = r.run.Position, r.run.Token, now
	}
	lost, err := a.db.SettleExceptions(ctx, ss)
	if err != nil {
		return err
	}
	for i, r := range batch {
		r.unwritten = nil
		delete(a.running, r.run.Position)
		if lost[i] {
			a.cfg.Stats.LeasesLost.Add(1)
			a.cfg.Hooks.TraceOne(hooks.TraceLost, r.run.Message.ID)
		} else {
			a.cfg.Hooks.TraceOne(hooks.TraceRecorded, r.run.Message.ID)
		}
	}
	return nil
}

// Flush writes settlements that failed earlier (a database restart, say)
// and returns the jobs of chains they start.
func (a *ExceptionActor) Flush(ctx context.Context) ([]Job, error) {
	if err := a.cfg.Hooks.At(hooks.ExceptionsFlush); err != nil {
		return nil, err
	}
	for _, r := range a.running {
		if r.unwritten != nil && r.batchable() {
			a.pending = append(a.pending, r)
		}
	}
	if err := a.writePending(ctx); err != nil {
		return nil, err
	}
	var jobs []Job
	for _, r := range a.running {
		if r.unwritten == nil {
			continue
		}
		more, err := a.settle(ctx, r, *r.unwritten)
		if err != nil {
			return jobs, err
		}
		jobs = append(jobs, more...)
	}
	return jobs, nil
}
