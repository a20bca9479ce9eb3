package claimer

import (
	"sync/atomic"
)

// Quiet claimers (decision 0038).
//
// An idle session used to look for work at every poll tick (ClaimPollRate,
// 1 s): a gate probe, an exceptions-due probe, and every Lease/3 the two
// reconcile statements and two heartbeat statements. A thousand idle
// groups made that most of a server core, nearly all of it planning
// per-stream statement texts. While the client's LISTEN connection is up
// (Common.Listening), a produce wakes its groups' claimers at once, so an
// idle claimer's poll tick finds nothing a wake would not have brought. A
// claimer that is quiet skips its poll ticks:
//
//   - the range claimer when its last sweep's probe found nothing after the
//     head, no lapsed lease and no stall, and it holds nothing and has no
//     commit to retry and no leftovers to adopt;
//   - the exception claimer when its last probe found nothing due, it holds
//     nothing, its range claimer wrote no exception row since (Nudge), and
//     the earliest pending row's due time the probe reported has not come.
//
// What does not notify still comes on time. A wake reaching a quiet range
// claimer claims, and sweeps if that claim finds nothing new (a hand-back
// notifies the stream, so a stopping instance's ranges are taken over at
// once: decision 0041); a listener that comes up, the first time included,
// wakes every session, since notifications may have been missed before it. With the process's
// beats (Common.Alarm, decision 0040), a lapsed peer raises an alarm and the
// claimers sweep for its leases, so a quiet claimer skips its reconcile
// ticks' sweeps too, but for a backstop every QuietSweepEvery ticks;
// without them it sweeps every Lease/3 as before. The reconcile statements
// run only when the claimer made a lease-taking call since the last
// reconcile or holds something (Holdings), and the heartbeat renews leases
// only then: an idle session's beat is one statement.

// Holdings says whether a claimer may hold leases in the database (ranges,
// exception rows, key leases) for its heartbeat: it is set before every
// statement that may take one, and cleared only by a reconcile that found the
// claimer holding nothing. A nil *Holdings always may.
type Holdings struct{ none atomic.Bool }

// May reports whether the heartbeat must renew the claimer's leases.
func (h *Holdings) May() bool { return h == nil || !h.none.Load() }

func (h *Holdings) set() {
	if h != nil {
		h.none.Store(false)
	}
}

func (h *Holdings) clear() {
	if h != nil {
		h.none.Store(true)
	}
}

// leaseBook is what a claimer keeps of the leases it may hold: whether a
// lease-taking statement ran since its last reconcile (touched), which
// tells its Holdings; and the reconcile ticks it skipped while quiet. Both
// claimers embed one.
type leaseBook struct {
	touched    bool
	quietTicks int
}

// leasing is called before every statement that may take a lease, and
// when the actor (re)starts: it knows nothing of what an earlier run held.
func (b *leaseBook) leasing(h *Holdings) {
	b.touched = true
	h.set()
}

// cleared: a begin or reconcile left nothing in the database that the actor
// does not know of; holds says whether it still holds anything itself.
func (b *leaseBook) cleared(h *Holdings, holds bool) {
	if b.touched = false; !holds {
		h.clear()
	}
}

// skipTick: a quiet actor with alarms skips the reconcile tick's sweep but
// every QuietSweepEvery-th (skipQuietTick).
func (b *leaseBook) skipTick(c *Common, quiet bool) bool {
	return skipQuietTick(c, quiet && !b.touched, &b.quietTicks)
}

// Nudge is the range claimer's word to its session's exception claimer that
// it wrote exception rows (failures, deferrals, a quarantine): a quiet
// exception claimer probes at its next poll tick. A nil *Nudge is never set.
type Nudge struct{ set atomic.Bool }

func (n *Nudge) give() {
	if n != nil {
		n.set.Store(true)
	}
}

func (n *Nudge) peek() bool { return n != nil && n.set.Load() }

func (n *Nudge) take() bool { return n != nil && n.set.Swap(false) }

// QuietSweepEvery is every how many reconcile ticks (InstanceTTL/3) a quiet
// claimer with alarms (Common.Alarm) sweeps all the same: a backstop for
// what neither a wake nor an alarm brings (decision 0040). At the default
// TTL, every 5 minutes. A listener that stops hearing notifications is
// found by the hub's own pings within 30 s (engine.ListenerCheck), and a
// peer that dies raises an alarm within InstanceTTL/3 of its lapse; what is
// left for the backstop is rarer (decision 0040, "Costs").
const QuietSweepEvery = 30

// skipQuietTick reports whether a quiet actor skips this reconcile tick,
// counting the ticks it skipped in n.
func skipQuietTick(c *Common, quiet bool, n *int) bool {
	if !quiet || c.Alarm == nil || !c.listening() {
		*n = 0
		return false
	}
	every := QuietSweepEvery
	if n := c.Hooks.Sweeps(); n > 0 {
		every = n
	}
	if *n++; *n < every {
		return true
	}
	*n = 0
	return false
}

// listening reports whether the claimer may be quiet: the client's LISTEN
// connection is up.
func (c *Common) listening() bool { return c.Listening != nil && c.Listening() }
