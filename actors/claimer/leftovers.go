package claimer

import (
	"context"
	"errors"
	"sync"

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
}

// MaxLeftoverRanges bounds what Leftovers keeps (a range is at most
// BatchLimit messages' state); past it the oldest go first: their leases
// lapse first.
const MaxLeftoverRanges = 1024

// Len returns how many ranges wait to be adopted.
func (l *Leftovers) Len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ranges)
}

func (l *Leftovers) put(rs []*inflight) {
	if l == nil || len(rs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ranges = append(l.ranges, rs...)
	if n := len(l.ranges) - MaxLeftoverRanges; n > 0 {
		l.ranges = append([]*inflight(nil), l.ranges[n:]...)
	}
}

func (l *Leftovers) take() []*inflight {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	rs := l.ranges
	l.ranges = nil
	return rs
}

// leave hands the ranges this actor still holds to the consumer's
// Leftovers: its drain could not hand them back. Their key leases are
// computed now, for whoever adopts them to release.
func (a *Actor) leave() {
	var rs []*inflight
	for _, id := range a.order {
		in := a.ranges[id]
		a.releaseKeys(in)
		rs = append(rs, in)
	}
	a.cfg.Leftovers.put(rs)
}

// adopt takes the ranges an earlier session of the consumer left: a
// complete one is committed with the commits to retry, the others have
// their settled messages recorded with this actor's ranges at each flush
// and are then released. A range this instance holds anew (it reclaimed it)
// is not adopted: its own state is newer.
func (a *Actor) adopt() {
	for _, in := range a.cfg.Leftovers.take() {
		if a.ranges[in.r.ID] != nil {
			continue
		}
		in.adopted = true
		a.ranges[in.r.ID] = in
		a.order = append(a.order, in.r.ID)
		if in.pending == 0 {
			a.toCommit = append(a.toCommit, ref{rangeID: in.r.ID, token: in.r.Token})
		}
	}
}

// releaseAdopted releases the adopted ranges whose settled messages are
// recorded (the flush before it succeeded): another instance takes the rest
// at once. A range whose lease was lost is forgotten.
func (a *Actor) releaseAdopted(ctx context.Context) error {
	for _, id := range append([]int64(nil), a.order...) {
		in := a.ranges[id]
		if !in.adopted || in.pending == 0 {
			continue
		}
		err := a.db.ReleaseRange(ctx, store.Release{RangeID: id, Token: in.r.Token, Keys: a.releaseKeys(in), Now: a.cfg.DBNow()})
		if err != nil && !errors.Is(err, store.ErrLeaseLost) {
			return err
		}
		a.forget(id)
	}
	return nil
}
