package claimer

import (
	"context"
	"errors"
	"sync"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Leftovers carries, from a Consume session whose hand-back could not reach
// the database (it stopped during an outage) to the sessions of the same
// consumer in this process, the ranges it still held: what their handlers
// had settled is recorded, and the rest released, by the first of them to
// reach the database, instead of being delivered again when their leases
// lapse. Every write is token-fenced, so a range another instance has
// reclaimed meanwhile is left alone. A process that exits loses them, as any
// crash loses what it had not recorded. The zero value is ready; a nil
// *Leftovers keeps nothing.
type Leftovers struct {
	mu     sync.Mutex
	ranges []*inflight
	runs   []*excRun // exception rows leased, with their unwritten settlements
}

// MaxLeftoverRanges bounds what Leftovers keeps of ranges (a range is at
// most BatchLimit messages' state), and of exception rows; past it the
// oldest go first: their leases lapse first.
const MaxLeftoverRanges = 1024

// Len returns how many ranges and exception rows wait to be adopted.
func (l *Leftovers) Len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ranges) + len(l.runs)
}

func (l *Leftovers) put(rs []*inflight) { give(l, func() *[]*inflight { return &l.ranges }, rs) }
func (l *Leftovers) take() []*inflight  { return takeAll(l, func() *[]*inflight { return &l.ranges }) }

// give appends more to the list of l that list names, keeping at most
// MaxLeftoverRanges; a nil l keeps nothing.
func give[T any](l *Leftovers, list func() *[]T, more []T) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	held := list()
	*held = keep(*held, more)
}

// takeAll empties the list of l that list names and returns what it held.
func takeAll[T any](l *Leftovers, list func() *[]T) []T {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	held := list()
	out := *held
	*held = nil
	return out
}

// keep appends more to held and drops the oldest past MaxLeftoverRanges.
func keep[T any](held, more []T) []T {
	held = append(held, more...)
	if n := len(held) - MaxLeftoverRanges; n > 0 {
		held = append([]T(nil), held[n:]...)
	}
	return held
}

// leave hands the ranges this actor still holds to the consumer's
// Leftovers: its drain could not hand them back. Their key leases are
// computed now, for whoever adopts them to release.
func (a *Actor) leave() {
	var rs []*inflight
	for _, id := range a.b.ranges.order {
		in := a.b.ranges.get(id)
		a.b.releaseKeys(in)
		rs = append(rs, in)
		if a.cfg.Hooks.Tracing() {
			a.cfg.Hooks.TraceAll(hooks.TraceLeft, in.doneUnrecorded())
		}
	}
	a.cfg.Leftovers.put(rs)
	a.b.reset() // what it held is the Leftovers' now
}

// adopt takes the ranges an earlier session of the consumer left: a
// complete one is committed with the commits to retry, the others have
// their settled messages recorded with this actor's ranges at each flush
// and are then released. A range this instance holds anew (it reclaimed it)
// is not adopted: its own state is newer.
func (a *Actor) adopt() {
	for _, in := range a.cfg.Leftovers.take() {
		if a.b.ranges.get(in.r.ID) != nil {
			continue
		}
		in.adopted = true
		if a.cfg.Hooks.Tracing() {
			a.cfg.Hooks.TraceAll(hooks.TraceAdopted, in.doneUnrecorded())
		}
		a.b.ranges.add(in) // a complete one is due for its commit
	}
}

// flushAdopting takes what earlier sessions left, records it with this
// actor's own ranges (Flush) and releases it. Should a write fail, the
// adopted ranges still held go back to the Leftovers: the session that
// reaches the database first writes them, within the takeover grace other
// instances give after an outage, instead of one that took them and then
// backs off for longer holding them until their leases are taken over.
func (a *Actor) flushAdopting(ctx context.Context) error {
	a.adopt()
	err := a.Flush(ctx)
	if err == nil {
		err = a.releaseAdopted(ctx)
	}
	if err != nil {
		a.unadopt()
	}
	return err
}

// unadopt gives the adopted ranges still held back to the Leftovers.
func (a *Actor) unadopt() {
	var back []*inflight
	for _, id := range a.b.ranges.ids() {
		if in := a.b.ranges.get(id); in.adopted {
			back = append(back, in)
			a.b.ranges.forget(id)
		}
	}
	a.cfg.Leftovers.put(back)
}

// releaseAdopted releases the adopted ranges whose settled messages are
// recorded (the flush before it succeeded): another instance takes the rest
// at once. A range whose lease was lost is forgotten.
func (a *Actor) releaseAdopted(ctx context.Context) error {
	for _, id := range a.b.ranges.ids() {
		in := a.b.ranges.get(id)
		if in == nil || !in.adopted || in.pending == 0 {
			continue
		}
		err := a.db.ReleaseRange(ctx, store.Release{RangeID: id, Token: in.r.Token, Keys: a.b.releaseKeys(in), Now: a.cfg.DBNow()})
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			return err
		}
		a.b.ranges.forget(id)
	}
	return nil
}

func (l *Leftovers) putRuns(rs []*excRun) { give(l, func() *[]*excRun { return &l.runs }, rs) }
func (l *Leftovers) takeRuns() []*excRun  { return takeAll(l, func() *[]*excRun { return &l.runs }) }

// leave hands the exception rows this actor still holds (their results
// written or not) to the consumer's Leftovers: its drain could not hand
// them back.
func (a *ExceptionActor) leave() {
	rs := make([]*excRun, 0, len(a.running))
	for _, r := range a.running {
		rs = append(rs, r)
		if r.unwritten != nil {
			a.cfg.Hooks.TraceOne(hooks.TraceLeft, r.run.Message.ID)
		}
	}
	a.cfg.Leftovers.putRuns(rs)
}

// writeAdopted writes what an earlier session of the consumer left of its
// exception rows, as its hand-back would have (a result not yet written,
// else back to pending without spending a retry), each under the row's
// token; what cannot be written yet waits for the next flush tick.
func (a *ExceptionActor) writeAdopted(ctx context.Context) error {
	took := a.cfg.Leftovers.takeRuns()
	for _, r := range took {
		if r.unwritten != nil {
			a.cfg.Hooks.TraceOne(hooks.TraceAdopted, r.run.Message.ID)
		}
	}
	a.adopted = append(a.adopted, took...)
	n := len(a.adopted)
	if n == 0 {
		return nil
	}
	for len(a.adopted) > 0 {
		if err := a.handBackRun(ctx, a.adopted[0]); err != nil {
			// Back to the Leftovers, for the session that reaches the
			// database first (see flushAdopting).
			a.cfg.Leftovers.putRuns(a.adopted)
			a.adopted = nil
			return err
		}
		a.adopted = a.adopted[1:]
	}
	a.cfg.Logger.Info("wrote the exception rows an earlier session of this consumer could not hand back", "rows", n)
	return nil
}
