package claimer

import (
	"slices"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// The books' side of ranges leaving: dropped, released, committed, or
// recorded in part (settle.go makes the calls).

// dropStale forgets an earlier incarnation of a range this instance has just
// reclaimed (its own lease had lapsed): its jobs' outcomes, its queued key
// refs and its pending commit belong to a lease that is gone, and applied to
// the new incarnation they would settle messages that never ran. Key leases
// it alone used are left to Reconcile, which releases leases under tokens
// the claimer no longer knows. It returns the jobs of other ranges' messages
// that the old incarnation's running ones held up.
func (b *books) dropStale(old *inflight) []Job {
	jobs, _ := b.letGo(old)
	return jobs
}

// letGo takes a range out of the books while some of its messages may
// still run (a stale incarnation, a transaction that committed nothing
// known): its keys' queues forget its messages, the next message of a key
// whose running one was the range's (another range's) starts, and the
// leases no other range uses are returned for release.
func (b *books) letGo(old *inflight) (jobs []Job, release []store.KeyLease) {
	var heads []string // keys whose running message was the range's
	for _, key := range old.keys {
		if ks := b.keys.get(key); ks != nil && len(ks.queue) > 0 && ks.queue[0].rangeID == old.r.ID && ks.queue[0].token == old.r.Token {
			heads = append(heads, key)
		}
	}
	release = b.leaveKeys(old, false, time.Time{})
	b.ranges.forget(old.r.ID)
	for _, key := range heads { // the next message of the key, another range's, starts
		if ks := b.keys.get(key); ks != nil && len(ks.queue) > 0 && !ks.pending {
			jobs = append(jobs, b.start(ks.queue[0]))
		}
	}
	return jobs, release
}

// releaseKeys detaches a leaving range from the keys it used and returns the
// leases no other range of this instance uses. They are dropped from the
// book before the statement runs: if it fails, nothing more is queued
// behind a lease whose release may already have committed, and the retry
// releases the same rows by the same tokens.
func (b *books) releaseKeys(in *inflight) []store.KeyLease {
	return b.leaveKeys(in, false, time.Time{})
}

// settleKeys is releaseKeys for a range being committed: an exclusive key
// it was the last to use is kept instead (decision 0045) while no key this
// claimer wanted was busy elsewhere within KeyHold, the range gave none of
// the key's messages an exception row (its retry would wait for the key),
// the lease is younger than MaxKeyKeep KeyHolds and fewer than MaxKeptKeys
// are kept. Kept keys idle for KeyHold, or all of them once a key was busy,
// go with this range's release; the rest go on the flush tick, at a
// hand-back, or when a claim finds nothing with no range in flight.
func (b *books) settleKeys(in *inflight, now time.Time) []store.KeyLease {
	if in.left { // computed by an earlier attempt of this commit
		return in.release
	}
	return b.leaveKeys(in, true, now)
}

func (b *books) leaveKeys(in *inflight, settling bool, now time.Time) []store.KeyLease {
	in.left = true
	keep := settling && b.keys.keeping(now)
	for _, key := range in.keys {
		ks := b.keys.get(key)
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
		if len(ks.ranges) > 0 {
			continue
		}
		switch {
		case ks.gated: // no row: nothing to keep or release
			b.keys.drop(key)
		case keep && !in.excKeys[key] && b.keys.keepable(ks, now):
			b.keys.keep(key, ks, now)
		default:
			in.release = append(in.release, store.KeyLease{Key: key, Token: ks.token})
			b.keys.drop(key)
		}
	}
	in.keys = nil
	if settling {
		in.release = append(in.release, b.keys.dueKept(now, !keep)...)
	}
	return in.release
}

// commitPlan is a complete range's commit: its exception rows (but those a
// progress record wrote), its delivery-log rows, and the key leases its
// settlement releases.
func (b *books) commitPlan(in *inflight, now time.Time) store.RangeCommit {
	var writes []store.ExceptionWrite
	for _, w := range in.writes {
		if w != nil && !b.broken.DropsFailures() {
			writes = append(writes, *w)
		}
	}
	return store.RangeCommit{RangeID: in.r.ID, Token: in.r.Token, Exceptions: writes, Deliveries: in.log, Keys: b.settleKeys(in, now)}
}

// progressPlan is one progress record: for every range still in flight
// that settled something since its last record, what to write (see
// Actor.RecordProgress). upto is each range's settled prefix, fresh the
// messages each record writes.
type progressPlan struct {
	ps    []store.Progress
	upto  []int
	fresh [][]int
}

func (b *books) progress() progressPlan {
	var p progressPlan
	for _, id := range b.ranges.order {
		in := b.ranges.get(id)
		if in.pending == 0 {
			continue // complete: its commit writes it
		}
		n := in.settledPrefix()
		pr := store.Progress{RangeID: id, Token: in.r.Token}
		if n > in.recorded {
			pr.Lo = in.r.Messages[n-1].Position
		}
		var idx []int
		for i := in.recorded; i < len(in.state); i++ {
			if in.state[i] != done || in.rec[i] {
				continue
			}
			idx = append(idx, i)
			if i >= n {
				pr.Settled = append(pr.Settled, in.r.Messages[i].ID)
			}
			if w := in.writes[i]; w != nil && !b.broken.DropsFailures() {
				pr.Exceptions = append(pr.Exceptions, *w)
			}
		}
		if len(idx) == 0 && n <= in.recorded {
			continue
		}
		pr.Deliveries = in.log // every row in it is a settled message's, not yet written
		p.ps, p.upto, p.fresh = append(p.ps, pr), append(p.upto, n), append(p.fresh, idx)
	}
	return p
}

// recorded applies a progress record's result: the ranges it advanced
// (their lease still theirs) have their fresh messages marked written.
// It returns, per range of the plan, whether it was recorded.
func (b *books) recorded(p progressPlan, advanced map[int64]bool) []bool {
	ok := make([]bool, len(p.ps))
	for i, pr := range p.ps {
		in := b.ranges.get(pr.RangeID)
		if !advanced[pr.RangeID] || in == nil || in.r.Token != pr.Token {
			continue // lease lost: the commit finds out and says so
		}
		for _, j := range p.fresh[i] {
			in.writes[j] = nil // written: the commit must not write it again
			in.rec[j] = true
		}
		in.log = nil
		in.recorded = max(in.recorded, p.upto[i])
		ok[i] = true
	}
	return ok
}
