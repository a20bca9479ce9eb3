package claimer

import (
	"context"
	"errors"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
)

// How each claimer decides and writes a transactional attempt's result
// (txSettler, tx.go). decide runs on a tx worker: it reads only the job,
// the group config snapshot and the clock's database time, never the
// actor's state.

// atWriteOf is atWrite without the actor's memo of parsed options, for a
// tx worker.
func atWriteOf(claimed policy.Effective, m *store.Message, group policy.Group) policy.Effective {
	opts, _ := policy.Parse(m.Options)
	e := policy.Resolve(opts, group)
	e.Concurrency, e.Timeout = claimed.Concurrency, claimed.Timeout
	return e
}

// decide is the range claimer's Outcome decision, for a tx worker.
func (a *Actor) decide(j Job, err error) decided {
	group := a.cfg.Group()
	return rangeDecision(atWriteOf(j.eff, j.Delivery.Msg, group), j.Delivery.Msg, group, err)
}

// write records a batch of one range as settled, with its exception and
// delivery-log rows, fenced by the range's token.
func (a *Actor) write(ctx context.Context, tx pgx.Tx, batch []Job, results []decided) (bool, error) {
	p := store.Progress{RangeID: batch[0].Ref.rangeID, Token: batch[0].Ref.token}
	for i, j := range batch {
		p.Settled = append(p.Settled, j.Delivery.Msg.ID)
		if w := results[i].write; w != nil && !a.cfg.Hooks.Breaks().DropsFailures() {
			p.Exceptions = append(p.Exceptions, *w)
		}
		if l := results[i].log; l != nil {
			p.Deliveries = append(p.Deliveries, *l)
		}
	}
	advanced, err := a.cfg.Store.Group(a.cfg.StreamID, a.cfg.GroupID).InTx(tx).RecordProgress(ctx, []store.Progress{p}, a.cfg.DBNow())
	return advanced[p.RangeID], err
}

// letGo lets go of a range a transaction of it committed nothing the actor
// knows of (its lease was gone, or its commit failed or lost its reply):
// the range leaves the books, and its lease is released so that whoever
// holds it next delivers what the database says is unsettled. A release
// that fails leaves the lease to Reconcile (the range is no longer known).
func (a *Actor) letGo(ctx context.Context, rf ref) ([]Job, error) {
	in := a.b.ranges.of(rf)
	if in == nil {
		return nil, nil // let go already
	}
	jobs, keys := a.b.letGo(in)
	a.leasing(a.cfg.Holdings) // the next reconcile looks, should the release fail
	err := a.db.ReleaseRange(ctx, store.Release{RangeID: in.r.ID, Token: in.r.Token, Keys: keys, Now: a.cfg.DBNow()})
	if errors.Is(err, store.ErrLeaseLost) {
		err = nil
	}
	a.released = a.released || err == nil
	return jobs, err
}

// decide is the exception claimer's decision, for a tx worker: the row's
// settlement under its token (the job's Ref carries the row and token).
func (a *ExceptionActor) decide(j Job, err error) decided {
	group := a.cfg.Group()
	m := j.Delivery.Msg
	attempts := j.Delivery.Attempt - 1
	next := policy.Decide(atWriteOf(j.eff, m, group), group.InitialBackoffOrDefault(), attempts, j.Delivery.Delays, err)
	s := store.Settlement{Position: m.Position, Token: j.Ref.token, Delete: next.Delete, Status: next.Status, Attempts: next.Attempts,
		Delays: next.Delays, After: next.After, Error: errText(err), Attempt: attempts + 1}
	if outcome := policy.OutcomeOf(next, err, attempts); group.Logs(outcome) {
		s.Outcome = outcome
	}
	return decided{next: next, settle: &s}
}

// write settles an exception row's attempt, fenced by its token.
func (a *ExceptionActor) write(ctx context.Context, tx pgx.Tx, batch []Job, results []decided) (bool, error) {
	g := a.cfg.Store.Group(a.cfg.StreamID, a.cfg.GroupID).InTx(tx)
	for i := range batch {
		s := *results[i].settle
		s.Now = a.cfg.DBNow()
		if _, err := g.SettleException(ctx, s); err != nil {
			if errors.Is(err, store.ErrLeaseLost) {
				return false, nil
			}
			return false, err
		}
	}
	return true, nil
}
