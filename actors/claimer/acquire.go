package claimer

import (
	"context"
	"errors"
	"fmt"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/store"
)

// maxAcquires bounds the key acquisitions the serve loop runs at once,
// each on a connection of the pool. They lease disjoint keys (a key being
// acquired is pending in the key book, so no later claim wants it), but one
// at a time applies them in claim order, as the simulator does, and two
// measured no better on two cores (decision 0050).
const maxAcquires = 1

// Acquiring reports that claims left key acquisitions pending
// (DeferAcquire), which Acquire applies in claim order.
func (a *Actor) Acquiring() bool { return len(a.b.keys.acqs) > 0 }

// DeferAcquire makes a claim that must acquire key leases leave the
// acquisition pending (Acquiring) instead of running it: the serve loop
// runs it on another connection while claims, outcomes, commits and
// flushes go on, and the simulator interleaves other steps with it.
func (a *Actor) DeferAcquire(on bool) { a.deferAcquire = on }

// Acquire runs the oldest pending key acquisition (if any) and applies it.
func (a *Actor) Acquire(ctx context.Context) ([]Job, error) {
	if len(a.b.keys.acqs) == 0 {
		return nil, nil
	}
	p := a.b.keys.acqs[0]
	if a.b.underGate(p) {
		return a.acquired(ctx, Acquired{of: p})
	}
	held, blocked, err := a.db.AcquireKeys(ctx, p.req)
	return a.acquired(ctx, Acquired{Held: held, Blocked: blocked, Err: err, of: p})
}

// acquisition returns the oldest pending acquisition's store call that
// has not started, to run off the serve loop on a connection of the pool
// (the loop's lane is busy with claims and commits); nil if there is none.
func (a *Actor) acquisition() func(context.Context) Acquired {
	for _, p := range a.b.keys.acqs {
		if p.started {
			continue
		}
		p.started = true
		if a.b.underGate(p) {
			return func(context.Context) Acquired { return Acquired{of: p} }
		}
		db, req := a.cfg.Store.Group(a.cfg.StreamID, a.cfg.GroupID).Counting(&a.answered), p.req
		return func(ctx context.Context) Acquired {
			held, blocked, err := db.AcquireKeys(ctx, req)
			return Acquired{Held: held, Blocked: blocked, Err: err, of: p}
		}
	}
	return nil
}

// acquiringAtOnce: how many acquisitions serve runs at once.
func (a *Actor) acquiringAtOnce() int { return maxAcquires }

// acquired applies an acquisition's result (books.applyAcquired), then lets
// go of what it took that no range wants (a gate granted to an acquisition
// a hand-back dropped; key leases whose ranges went) and commits the ranges
// its parked messages completed.
func (a *Actor) acquired(ctx context.Context, res Acquired) ([]Job, error) {
	a.cfg.Hooks.Point(hooks.ClaimerAcquire)
	ap := a.b.applyAcquired(res, a.cfg.Clock.Now())
	var errs []error
	if res.Err != nil {
		errs = append(errs, res.Err)
	}
	if ap.freeGate != "" {
		if _, _, err := a.db.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: ap.freeGate, Owner: a.cfg.InstanceID, Now: a.cfg.DBNow()}); err != nil {
			errs = append(errs, err)
		}
	}
	if len(ap.gone) > 0 {
		if _, err := a.db.ReleaseKeys(ctx, ap.gone); err != nil {
			errs = append(errs, err) // Reconcile lets them go
		}
	}
	for _, id := range ap.complete {
		if err := a.settle(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return ap.jobs, errors.Join(errs...)
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
	if a.b.keys.gate == "" {
		return nil
	}
	a.leasing(a.cfg.Holdings) // the keys' rows
	_, missing, err := a.db.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: a.b.keys.gate, Owner: a.cfg.InstanceID,
		Keys: a.b.keys.gatedLeases(), TTL: a.cfg.Lease, Now: a.cfg.DBNow()})
	if err != nil {
		return err
	}
	// Freed now, or by an earlier attempt whose reply was lost (its rows
	// were written then), or lost with the incarnation (which starts
	// nothing more): either way the keys are rows or nothing from here.
	a.b.keys.gateGivenUp(wanted, a.cfg.Clock.Now())
	if wanted {
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
	k := &a.b.keys
	if k.gate == "" {
		return nil
	}
	now := a.cfg.Clock.Now()
	if !k.gateChecked.IsZero() && now.Sub(k.gateChecked) < k.hold {
		return nil
	}
	wanted, err := a.db.KeyGateWanted(ctx, a.cfg.InstanceID, a.cfg.WorkerConfigID, a.cfg.DBNow())
	if err != nil {
		return err
	}
	k.gateChecked = now
	if !wanted {
		return nil
	}
	return a.giveUpGate(ctx, true)
}
