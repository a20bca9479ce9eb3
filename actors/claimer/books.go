package claimer

import (
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
	return Job{Ref: ref{rangeID: in.r.ID, token: in.r.Token, index: i}, eff: e, Delivery: Delivery{
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

// recordedAt marks message rf's outcome as written already (a
// transactional handler's settlement committed with it): no commit or
// progress record writes it again.
func (b *books) recordedAt(rf ref) {
	if in := b.ranges.of(rf); in != nil {
		in.writes[rf.index], in.rec[rf.index] = nil, true
	}
}

// running reports whether rf names a running message of a held range: an
// outcome that does not is stale (its range was dropped after a lost lease
// or a hand-back, or reclaimed under a new token).
func (b *books) running(rf ref) bool {
	in := b.ranges.of(rf)
	return in != nil && rf.index >= 0 && rf.index < len(in.state) && in.state[rf.index] == running
}
