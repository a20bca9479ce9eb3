package claimer

import (
	"slices"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// The books' side of key acquisitions (Actor.acquired makes the calls).

// Acquired is a key acquisition's result (store.Group.AcquireKeys).
type Acquired struct {
	Held, Blocked map[string]bool
	Err           error
	of            *acquiring // nil: the oldest pending
}

// applied is what applying an acquisition's result produced: jobs that
// start, leases the statement took that no range wants (to release), a
// gate granted to an acquisition dropped meanwhile (to free), and the
// ranges its parked messages completed (to commit).
type applied struct {
	jobs     []Job
	gone     []store.KeyLease
	freeGate string
	complete []int64
}

// applyAcquired applies an acquisition's result (the oldest pending one's
// when res does not say which): a key held starts its first queued
// message; a key busy elsewhere, blocked behind an earlier message of its
// ordered key, or whose acquisition failed parks every message queued
// behind it (as an exception row, which spends no retry). What the
// statement took for keys no range wants any more (their ranges went
// meanwhile), or may have taken before it failed, is let go of.
func (b *books) applyAcquired(res Acquired, now time.Time) applied {
	var out applied
	p := res.of
	if p == nil && len(b.keys.acqs) > 0 {
		p = b.keys.acqs[0]
	}
	if p == nil {
		return out
	}
	// An acquisition dropped meanwhile (a hand-back) places nothing: what
	// it took is let go of, as for keys whose ranges went.
	i := slices.Index(b.keys.acqs, p)
	if i >= 0 {
		b.keys.acqs = slices.Delete(b.keys.acqs, i, i+1)
	}
	gated := false
	if p.req.Gate != "" && i >= 0 {
		b.keys.gateAsked = false
		switch {
		case res.Held[store.KeyGateKey]:
			b.keys.gate, b.keys.gateChecked, gated = p.req.Gate, now, true
			b.stats.KeyGates.Add(1)
		case res.Err == nil:
			b.keys.gateRefused = now
		}
	}
	if res.Held[store.KeyGateKey] && i < 0 {
		// Granted to an acquisition dropped meanwhile (a hand-back): freed
		// at once. One granted by an attempt whose reply was lost is the
		// instance's without its knowing: Reconcile frees it.
		out.freeGate = p.req.Gate
	}
	touched := map[int64]bool{}
	for _, key := range p.keys {
		ks := b.keys.get(key)
		if i < 0 || ks == nil || !ks.pending || ks.token != p.token {
			if res.Held[key] || i >= 0 && res.Err != nil {
				out.gone = append(out.gone, store.KeyLease{Key: key, Token: p.token})
			}
			continue
		}
		ks.pending = false
		ks.gated = (gated || p.gate != "" && p.gate == b.keys.gate) && !ks.ordered
		switch {
		case p.gate != "" && !ks.ordered: // taken out of the statement for the gate (underGate)
			if !ks.gated { // given up meanwhile, before the key had a row
				b.dropKey(key, ks, b.keyBusyDelay, keyBusyReason, touched)
			} else if len(ks.queue) > 0 {
				out.jobs = append(out.jobs, b.start(ks.queue[0]))
			}
		case res.Err != nil:
			out.gone = append(out.gone, store.KeyLease{Key: key, Token: p.token})
			b.dropKey(key, ks, b.keyBusyDelay, "waiting: its key could not be leased", touched)
		case res.Blocked[key]: // the statement gave it back
			b.dropKey(key, ks, 0, orderedWaitReason, touched)
		case !res.Held[key]:
			b.keys.contended = now
			b.dropKey(key, ks, b.keyBusyDelay, keyBusyReason, touched)
		case len(ks.queue) > 0:
			out.jobs = append(out.jobs, b.start(ks.queue[0]))
		}
	}
	if len(touched) > 0 {
		for _, id := range b.ranges.order {
			if in := b.ranges.get(id); touched[id] && in.pending == 0 {
				out.complete = append(out.complete, id)
			}
		}
	}
	return out
}

// dropKey forgets a pending key whose lease was not taken: every message
// queued behind it parks, and the ranges it touched are marked.
func (b *books) dropKey(key string, ks *keyState, after time.Duration, why string, touched map[int64]bool) {
	b.keys.drop(key)
	for _, q := range ks.queue {
		if in := b.ranges.of(q); in != nil {
			b.park(in, q.index, after, why)
			touched[q.rangeID] = true
		}
	}
	for _, id := range ks.ranges {
		if in := b.ranges.get(id); in != nil {
			in.keys = slices.DeleteFunc(in.keys, func(k string) bool { return k == key })
		}
	}
}

// underGate takes out of an acquisition that starts now the exclusive
// keys the claimer holds under its key gate (decision 0051): a range
// claimed while the gate was being asked for wants them. It reports
// whether nothing is left for the statement.
func (b *books) underGate(p *acquiring) bool {
	if b.keys.gate == "" || p.req.Gate != "" {
		return false
	}
	var rest []store.KeyClaim
	for _, k := range p.req.Want {
		if k.Ordered {
			rest = append(rest, k)
		}
	}
	if len(rest) < len(p.req.Want) {
		p.gate, p.req.Want = b.keys.gate, rest
	}
	return len(rest) == 0
}
