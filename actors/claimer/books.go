package claimer

import (
	"fmt"
	"slices"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// books is the range claimer's state: its ranges and its keys, which must
// agree (a key's queue names messages of held ranges, a range names the
// keys it uses). Every change to either goes through the methods here and
// in rangebook.go and keybook.go, which do no I/O: the actor makes the
// store calls and hands their results in. check says what agreeing means;
// tests call it after every step.
type books struct {
	ranges rangeBook
	keys   keyBook
	// The settings the books act on.
	keyBusyDelay time.Duration
	stats        *Stats
	// hooks are the session's test hooks (nil in production): told of the
	// messages a range settles without delivery because the binding set in
	// force does not route them; broken is their broken switches.
	hooks  *hooks.Hooks
	broken *hooks.Broken
}

func (b *books) reset() {
	b.ranges.reset()
	b.keys.reset()
}

// holds: anything at all is held (ranges, keys, the gate).
func (b *books) holds() bool { return b.ranges.len() > 0 || b.keys.len() > 0 || b.keys.gate != "" }

// admitted is what taking a range in produced: the jobs that start, the
// key acquisition it needs (nil: none), and whether the range is complete
// already (every message settled without running: to commit now).
type admitted struct {
	jobs     []Job
	acq      *acquiring
	complete bool
}

// keyed is a range's messages of one key, and whether any is ordered. one
// is idx's first backing: with many keys, most have one message a range.
type keyed struct {
	idx     []int
	one     [1]int
	ordered bool
}

// admit takes a claimed range in: it lets go of an earlier incarnation of
// the range (dropStale), settles the messages not routed to the group,
// pins each other message's policy (resolve), starts the unkeyed ones,
// and places the keyed ones behind their keys: held under the key gate,
// shared with the instance's other ranges, parked as busy, or queued
// behind a new pending lease that the returned acquisition asks for.
// workerConfigID is Config.WorkerConfigID (0: the gate is never asked for).
func (b *books) admit(r store.Range, resolve func(*store.Message) policy.Effective, now time.Time, workerConfigID int64) admitted {
	var jobs []Job // other ranges' messages a dropped incarnation was holding up first
	if old := b.ranges.get(r.ID); old != nil {
		jobs = b.dropStale(old)
	}
	n := len(r.Messages)
	in := newInflight(r)
	b.ranges.add(in)
	if n == 0 { // a reclaimed lease over positions that no longer exist
		return admitted{jobs: jobs, complete: true}
	}

	// The keyed messages' indexes, in log order; whether any is ordered.
	var keyedIdx []int
	anyOrdered := false
	for i := range r.Messages {
		m := &r.Messages[i]
		if !m.Matched && !b.broken.DeliversUnmatched() { // not routed to this group: settled without delivery
			b.hooks.Skip(m, r.Bindings)
			b.ranges.settle(in, i, nil)
			continue
		}
		b.stats.Claimed.Add(1)
		in.eff[i] = resolve(m)
		if !in.eff[i].Concurrency.Keyed() || m.Key == "" || b.broken.SkipsKeyLeases() {
			if jobs == nil {
				jobs = make([]Job, 0, n)
			}
			in.state[i] = running
			jobs = append(jobs, in.job(i))
			continue
		}
		if keyedIdx == nil {
			keyedIdx = make([]int, 0, n-i)
		}
		keyedIdx = append(keyedIdx, i)
		anyOrdered = anyOrdered || in.eff[i].Concurrency == policy.Ordered
	}
	if b.keys.gate != "" && !anyOrdered {
		return admitted{jobs: b.admitGated(in, jobs, keyedIdx, now), complete: in.pending == 0}
	}

	// Keyed messages, by key in order of first appearance. The keyed
	// entries share one array (keyBuf), sized for the keyed messages: it
	// never grows, so pointers into it stay valid.
	var byKey map[string]*keyed
	var keyOrder []string
	var keyBuf []keyed
	for _, i := range keyedIdx {
		m := &r.Messages[i]
		k := byKey[m.Key]
		if k == nil {
			if keyBuf == nil {
				keyBuf = make([]keyed, 0, len(keyedIdx))
				byKey = make(map[string]*keyed, min(len(keyedIdx), 64))
			}
			keyBuf = append(keyBuf, keyed{})
			k = &keyBuf[len(keyBuf)-1]
			k.idx = k.one[:0]
			byKey[m.Key] = k
			keyOrder = append(keyOrder, m.Key)
		}
		k.idx = append(k.idx, i)
		k.ordered = k.ordered || in.eff[i].Concurrency == policy.Ordered
	}
	var want []store.KeyClaim
	var wanted []string
	exclusive := false
	for _, key := range keyOrder {
		// A key this instance holds (or is acquiring) is shared below, or
		// parked as busy when either side is ordered (an ordered key's
		// order is decided by the database, never by a queue in one
		// process). An exclusive key is held at once under the key gate.
		// The others are acquired.
		if b.keys.get(key) == nil {
			k := byKey[key]
			if b.keys.gate != "" && !k.ordered {
				b.keys.put(key, newKeyState(keyState{token: r.Token, since: now, gated: true}))
				continue
			}
			want = append(want, store.KeyClaim{Key: key, Ordered: k.ordered, Position: r.Messages[k.idx[0]].Position})
			wanted = append(wanted, key)
			exclusive = exclusive || !k.ordered
		}
	}
	isWanted := func(key string) bool { return slices.Contains(wanted, key) }
	if len(wanted) > 8 {
		set := make(map[string]bool, len(wanted))
		for _, key := range wanted {
			set[key] = true
		}
		isWanted = func(key string) bool { return set[key] }
	}
	for _, key := range keyOrder {
		jobs = b.admitKey(jobs, in, key, byKey[key], isWanted(key), now)
	}
	if len(want) == 0 {
		return admitted{jobs: jobs, complete: in.pending == 0}
	}
	// The wanted keys' messages wait, queued behind the key's pending
	// lease, for the acquisition.
	p := &acquiring{token: r.Token, keys: wanted, req: store.AcquireKeys{RangeID: r.ID, Want: want, Token: r.Token}}
	if exclusive && !b.broken.SkipsKeyLeases() && b.keys.askGate(now, workerConfigID) {
		p.req.Gate, p.req.WorkerConfigID, b.keys.gateAsked = store.NewID(), workerConfigID, true
	}
	b.keys.acqs = append(b.keys.acqs, p)
	return admitted{jobs: jobs, acq: p}
}

// admitGated places a range's keyed messages while the claimer holds the
// group's key gate and none of them is ordered: every key is held at once
// (decision 0051), so nothing is acquired and each message is placed as it
// comes, in log order, with one lookup of its key. It places them as
// admit's general path would: a key new to the claimer is held under
// the gate; a key it holds for exclusive messages is shared (queued behind
// its earlier messages, a kept one back in use); a key it holds for an
// ordered message parks the message, as busy.
//
// The general path groups a range's messages by key first, and at a key
// gate's usual load (a range of a thousand messages of as many keys) its
// maps and per-key passes were the range claimer's largest cost beyond a
// parallel range's.
func (b *books) admitGated(in *inflight, jobs []Job, keyedIdx []int, now time.Time) []Job {
	r := &in.r
	for _, i := range keyedIdx {
		key := r.Messages[i].Key
		ks := b.keys.get(key)
		switch {
		case ks == nil:
			ks = newKeyState(keyState{token: r.Token, since: now, gated: true})
			b.keys.put(key, ks)
		case ks.ordered: // held for an ordered message: never shared
			b.park(in, i, b.keyBusyDelay, keyBusyReason)
			continue
		default:
			b.keys.reuse(ks) // a kept one is in use again
		}
		// The range joins the key once: its first message of the key
		// appended it last (nothing else runs during admit).
		if n := len(ks.ranges); n == 0 || ks.ranges[n-1] != r.ID {
			ks.ranges = append(ks.ranges, r.ID)
			in.keys = append(in.keys, key)
		}
		idle := len(ks.queue) == 0 && !ks.pending
		ks.queue = append(ks.queue, ref{rangeID: r.ID, token: r.Token, index: i})
		if idle {
			if jobs == nil {
				jobs = make([]Job, 0, len(keyedIdx))
			}
			jobs = append(jobs, b.start(ks.queue[0]))
		}
	}
	return jobs
}

// admitKey places a range's messages of one key: queued behind this
// instance's lease of it, or behind a new pending lease (wanted: the
// acquisition decides), or parked when the key is held for an ordered
// message on one side (an ordered lease is never shared). It returns jobs
// with the job that starts, if any, appended.
func (b *books) admitKey(jobs []Job, in *inflight, key string, k *keyed, wanted bool, now time.Time) []Job {
	r := &in.r
	ks := b.keys.get(key)
	switch {
	case wanted:
		ks = newKeyState(keyState{token: r.Token, ordered: k.ordered, since: now, pending: true})
		b.keys.put(key, ks)
	case !ks.ordered && !k.ordered: // shared: queued behind this instance's earlier messages
		b.keys.reuse(ks) // a kept one is in use again
	case !ks.idleAt.IsZero():
		// A kept exclusive key that an ordered message wants: let it go
		// with this range, and the message waits as for a busy key.
		b.keys.drop(key)
		in.release = append(in.release, store.KeyLease{Key: key, Token: ks.token})
		for _, i := range k.idx {
			b.park(in, i, b.keyBusyDelay, keyBusyReason)
		}
		return jobs
	default: // held (or being acquired) for an ordered message, or wanted by one
		for _, i := range k.idx {
			b.park(in, i, b.keyBusyDelay, keyBusyReason)
		}
		return jobs
	}
	if !slices.Contains(ks.ranges, r.ID) {
		ks.ranges = append(ks.ranges, r.ID)
	}
	in.keys = append(in.keys, key)
	idle := len(ks.queue) == 0 && !ks.pending
	for _, i := range k.idx {
		ks.queue = append(ks.queue, ref{rangeID: r.ID, token: r.Token, index: i})
	}
	if idle {
		return append(jobs, b.start(ks.queue[0]))
	}
	return jobs
}

// start marks a queued message running and returns its job.
func (b *books) start(rf ref) Job {
	in := b.ranges.of(rf)
	in.state[rf.index] = running
	return in.job(rf.index)
}

func (in *inflight) job(i int) Job {
	e := in.eff[i]
	return Job{Ref: ref{rangeID: in.r.ID, token: in.r.Token, index: i}, Delivery: Delivery{
		Msg: &in.r.Messages[i], Attempt: 1, Concurrency: e.Concurrency, Timeout: e.Timeout, Bindings: in.r.Bindings}}
}

// park parks message i as a pending exception row without spending a
// retry.
func (b *books) park(in *inflight, i int, after time.Duration, why string) {
	m := &in.r.Messages[i]
	b.ranges.settle(in, i, &store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: string(in.eff[i].Concurrency),
		Status: policy.StatusPending, Error: why, After: after})
	in.markExc(m.Key)
	b.stats.Deferred.Add(1)
}

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

// outcome gives a running message its outcome (w: its exception row, nil
// on success) and starts the next message of its key, if any; holdBack:
// an ordered message that failed holds its key's later messages back (they
// park). It reports whether the range is complete. rf must name a running
// message of a held range (running).
func (b *books) outcome(rf ref, w *store.ExceptionWrite, holdBack bool) (jobs []Job, complete bool) {
	in := b.ranges.of(rf)
	m := &in.r.Messages[rf.index]
	b.ranges.settle(in, rf.index, w)
	if w != nil {
		in.markExc(m.Key)
	}
	if ks := b.keys.get(m.Key); ks != nil && m.Key != "" && len(ks.queue) > 0 && ks.queue[0] == rf {
		ks.queue = ks.queue[1:]
		if holdBack {
			// A later message of an ordered key waits for this one. An
			// ordered lease is never shared, so they are all this range's.
			for _, q := range ks.queue {
				b.park(b.ranges.of(q), q.index, 0, orderedWaitReason)
			}
			ks.queue = nil
		} else if len(ks.queue) > 0 {
			jobs = append(jobs, b.start(ks.queue[0]))
		}
	}
	return jobs, in.pending == 0
}

// running reports whether rf names a running message of a held range: an
// outcome that does not is stale (its range was dropped after a lost lease
// or a hand-back, or reclaimed under a new token).
func (b *books) running(rf ref) bool {
	in := b.ranges.of(rf)
	return in != nil && rf.index >= 0 && rf.index < len(in.state) && in.state[rf.index] == running
}

// dropStale forgets an earlier incarnation of a range this instance has just
// reclaimed (its own lease had lapsed): its jobs' outcomes, its queued key
// refs and its pending commit belong to a lease that is gone, and applied to
// the new incarnation they would settle messages that never ran. Key leases
// it alone used are left to Reconcile, which releases leases under tokens
// the claimer no longer knows. It returns the jobs of other ranges' messages
// that the old incarnation's running ones held up.
func (b *books) dropStale(old *inflight) []Job {
	var heads []string // keys whose running message was the old incarnation's
	for _, key := range old.keys {
		if ks := b.keys.get(key); ks != nil && len(ks.queue) > 0 && ks.queue[0].rangeID == old.r.ID && ks.queue[0].token == old.r.Token {
			heads = append(heads, key)
		}
	}
	b.leaveKeys(old, false, time.Time{})
	b.ranges.forget(old.r.ID)
	var jobs []Job
	for _, key := range heads { // the next message of the key, another range's, starts
		if ks := b.keys.get(key); ks != nil && len(ks.queue) > 0 && !ks.pending {
			jobs = append(jobs, b.start(ks.queue[0]))
		}
	}
	return jobs
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

// check reports the first way the books disagree with themselves or with
// each other.
func (b *books) check() error {
	if err := b.ranges.check(); err != nil {
		return err
	}
	if err := b.keys.check(); err != nil {
		return err
	}
	queuedAt := map[ref]string{} // each queued message and the key it waits behind
	for key, ks := range b.keys.m {
		for j, q := range ks.queue {
			in := b.ranges.of(q)
			switch {
			case in == nil:
				return fmt.Errorf("key %q queues a message of range %d, not held under its token", key, q.rangeID)
			case q.index < 0 || q.index >= len(in.state):
				return fmt.Errorf("key %q queues message %d of range %d, which has %d", key, q.index, q.rangeID, len(in.state))
			case in.r.Messages[q.index].Key != key:
				return fmt.Errorf("key %q queues message %d of range %d, of key %q", key, q.index, q.rangeID, in.r.Messages[q.index].Key)
			case in.state[q.index] == done:
				return fmt.Errorf("key %q queues message %d of range %d, which has an outcome", key, q.index, q.rangeID)
			case !slices.Contains(ks.ranges, q.rangeID):
				return fmt.Errorf("key %q queues a message of range %d, which it does not list", key, q.rangeID)
			case in.state[q.index] == running && (j > 0 || ks.pending):
				return fmt.Errorf("key %q runs message %d of range %d from place %d of its queue (pending %t)", key, q.index, q.rangeID, j, ks.pending)
			case in.state[q.index] == waiting && j == 0 && !ks.pending:
				return fmt.Errorf("key %q is held and its first message (%d of range %d) waits", key, q.index, q.rangeID)
			}
			if other, ok := queuedAt[q]; ok {
				return fmt.Errorf("message %d of range %d is queued behind keys %q and %q", q.index, q.rangeID, other, key)
			}
			queuedAt[q] = key
		}
		for j, id := range ks.ranges {
			in := b.ranges.get(id)
			switch {
			case in == nil:
				return fmt.Errorf("key %q lists range %d, not held", key, id)
			case slices.Contains(ks.ranges[:j], id):
				return fmt.Errorf("key %q lists range %d twice", key, id)
			case !slices.Contains(in.keys, key):
				return fmt.Errorf("key %q lists range %d, which does not list it", key, id)
			}
		}
	}
	for _, id := range b.ranges.order {
		in := b.ranges.get(id)
		for j, key := range in.keys {
			ks := b.keys.get(key)
			switch {
			case ks == nil:
				return fmt.Errorf("range %d lists key %q, not held", id, key)
			case slices.Contains(in.keys[:j], key):
				return fmt.Errorf("range %d lists key %q twice", id, key)
			case !slices.Contains(ks.ranges, id):
				return fmt.Errorf("range %d lists key %q, which does not list it", id, key)
			}
		}
		if in.adopted || in.left || b.broken.SkipsKeyLeases() {
			continue // an earlier session's, or being let go of: its keys were detached
		}
		for i, st := range in.state {
			keyedRun := st == running && in.eff[i].Concurrency.Keyed() && in.r.Messages[i].Key != ""
			rf := ref{rangeID: id, token: in.r.Token, index: i}
			if _, queued := queuedAt[rf]; (st == waiting || keyedRun) && !queued {
				return fmt.Errorf("message %d of range %d (%s) is not queued behind its key %q", i, id, stateName(st), in.r.Messages[i].Key)
			}
		}
	}
	return nil
}

func stateName(s msgState) string {
	switch s {
	case waiting:
		return "waiting"
	case running:
		return "running"
	}
	return "done"
}
