package claimer

import (
	"fmt"
	"slices"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// keyState is a key lease this instance holds. Its queue spans the
// instance's ranges: an exclusive key held for one range admits the next
// range's messages of that key behind the running one instead of parking
// them, so a hot key costs no exception round trips. The lease row keeps the
// token of the range that acquired it and is released by the settlement of
// the last range that uses it.
type keyState struct {
	token   string
	ordered bool    // acquired for ordered messages: never shared
	queue   []ref   // messages of the key, in claim order; [0] runs
	ranges  []int64 // ranges using the lease, each once (a few: those in flight)
	// idleAt is when the last range using the lease settled, if the
	// claimer kept it (zero: in use).
	idleAt time.Time
	// since is when the lease was acquired: a key is not kept past
	// MaxKeyKeep times KeyHold from it, so that an exception row of the
	// key elsewhere finds it free between this instance's ranges.
	since time.Time
	// pending: its acquisition has not been applied (acquiring); nothing
	// of the key runs until it has.
	pending bool
	// gated: held under the group's key gate, with no lease row of its own
	// (decision 0051); token is then the range's that brought it, the
	// token its row gets if the gate is given up while it is held.
	gated bool
	// queue1 and ranges1 are the first backing of queue and ranges: most
	// keys have one message and one range in flight, so a key costs one
	// allocation instead of three (newKeyState).
	queue1  [1]ref
	ranges1 [1]int64
}

// newKeyState is a key's state with its queue and ranges backed by the
// state's own arrays.
func newKeyState(ks keyState) *keyState {
	p := &ks
	p.queue, p.ranges = p.queue1[:0], p.ranges1[:0]
	return p
}

// keyBusyReason is the last error a keyed message parked behind a busy key
// carries: a key held by another instance, or by this one for an ordered
// message (never shared). Operators read it in the exception states.
const keyBusyReason = "waiting: its key is busy in another instance"

// orderedWaitReason is the last error of an ordered key's message parked
// behind an earlier unresolved message of its key.
const orderedWaitReason = "waiting behind an earlier unresolved message of its ordered key"

// DefaultKeyHold is Common.KeyHold's default: a burn-down's ranges bring a
// key back within a few of its ranges, tens to hundreds of milliseconds
// apart, and another instance that wants a kept key waits at most this
// long beyond its KeyBusyDelay.
const DefaultKeyHold = 500 * time.Millisecond

// MaxKeyKeep bounds how long, in KeyHolds from its acquisition, a key is
// kept from range to range: a key in every range of a long burn-down is
// let go at least this often, so another instance's exception row of the
// key (a retry) waits at most about this long plus its KeyBusyDelay.
const MaxKeyKeep = 10

// MaxKeptKeys bounds the key leases the range claimer keeps with no range
// using them; past it, the longest kept are released.
const MaxKeptKeys = 16384

// KeyGateRetry is how long, in KeyHolds, the range claimer waits after
// its key gate was refused or given up before it asks again (decision
// 0051): a group with other sessions refuses it, and a fleet's instances
// would otherwise ask at every claim.
const KeyGateRetry = MaxKeyKeep

// keptKey is an entry of the claimer's queue of kept keys, valid while the
// key's state still has this idleAt.
type keptKey struct {
	key string
	at  time.Time
}

// acquiring is a range's key acquisition not applied yet. Its keys are in
// the claimer's key book, pending: their messages (the range's, and later
// ranges' that share them) are queued and none runs until it is applied.
type acquiring struct {
	token   string   // the range's: the lease rows' token
	keys    []string // the wanted keys, in order of first appearance
	req     store.AcquireKeys
	started bool // the serve loop runs it
	// gate: the key gate under which its exclusive keys were taken out of
	// the statement when it started (underGate); they are held if the
	// claimer still holds that gate when the result is applied.
	gate string
}

// keyBook is the range claimer's book of the keys it holds: each key's
// lease and queue, the keys kept with no range using them (decision 0045),
// the group's key gate (decision 0051) and the key acquisitions not yet
// applied. Its methods keep these in agreement (check says how).
type keyBook struct {
	m map[string]*keyState // key leases held, across ranges
	// kept queues the keys held with no range using them, oldest first;
	// nkept counts its valid entries.
	kept  []keptKey
	nkept int
	// contended is when a key this claimer wanted was last busy in
	// another instance: it keeps no key for hold after.
	contended time.Time
	// gate is the token of the group's key gate while this claimer holds
	// it, "" otherwise: its exclusive keys are then held without a row
	// each. gateAsked: a pending acquisition asks for it. gateRefused:
	// when it was last refused or given up (it is not asked for again for
	// KeyGateRetry). gateChecked: the last look at whether another
	// instance or a keyed retry wants the keys.
	gate                     string
	gateAsked                bool
	gateRefused, gateChecked time.Time
	// acqs are the key acquisitions claims left pending, oldest first.
	acqs []*acquiring
	// hold is Common.KeyHold with its default: how long a key is kept
	// (not positive: never).
	hold time.Duration
}

// reset forgets every key: a restarted actor's earlier run let them go
// (begin). When the gate was last refused is kept.
func (k *keyBook) reset() {
	k.m, k.kept, k.nkept, k.contended = map[string]*keyState{}, nil, 0, time.Time{}
	k.gate, k.gateAsked, k.acqs = "", false, nil
}

func (k *keyBook) len() int { return len(k.m) }

func (k *keyBook) get(key string) *keyState { return k.m[key] }

// put holds a key under ks.
func (k *keyBook) put(key string, ks *keyState) { k.m[key] = ks }

// drop forgets a key (its lease released, or never taken).
func (k *keyBook) drop(key string) {
	if ks := k.m[key]; ks != nil && !ks.idleAt.IsZero() {
		k.nkept--
	}
	delete(k.m, key)
}

// reuse puts a kept key back in use.
func (k *keyBook) reuse(ks *keyState) {
	if !ks.idleAt.IsZero() {
		ks.idleAt = time.Time{}
		k.nkept--
	}
}

// keep keeps a key no range uses any more, from now.
func (k *keyBook) keep(key string, ks *keyState, now time.Time) {
	ks.idleAt = now
	k.kept = append(k.kept, keptKey{key: key, at: now})
	k.nkept++
}

// keeping: the claimer keeps keys now (hold positive, and no key it wanted
// was busy elsewhere within it).
func (k *keyBook) keeping(now time.Time) bool {
	return k.hold > 0 && (k.contended.IsZero() || now.Sub(k.contended) >= k.hold)
}

// keepable: a key the last range using it let go of may be kept.
func (k *keyBook) keepable(ks *keyState, now time.Time) bool {
	return !ks.ordered && !ks.pending && k.nkept < MaxKeptKeys && now.Sub(ks.since) < MaxKeyKeep*k.hold
}

// dueKept takes out of the book the kept keys idle for hold, or all of
// them, and returns their leases for release.
func (k *keyBook) dueKept(now time.Time, all bool) []store.KeyLease {
	var out []store.KeyLease
	n := 0
	for ; n < len(k.kept); n++ {
		e := k.kept[n]
		ks := k.m[e.key]
		if ks == nil || !ks.idleAt.Equal(e.at) {
			continue // in use again, or let go since
		}
		if !all && now.Sub(e.at) < k.hold {
			break
		}
		out = append(out, store.KeyLease{Key: e.key, Token: ks.token})
		k.drop(e.key)
	}
	k.kept = k.kept[n:]
	if len(k.kept) > 2*MaxKeptKeys { // mostly entries of keys in use again
		live := k.kept[:0]
		for _, e := range k.kept {
			if ks := k.m[e.key]; ks != nil && ks.idleAt.Equal(e.at) {
				live = append(live, e)
			}
		}
		k.kept = live
	}
	if len(k.kept) == 0 {
		k.kept = nil
	}
	return out
}

// askGate: a claim that must acquire exclusive keys asks for the group's
// key gate too. Only while the claimer keeps keys (the gate is keeping
// every key), knows its worker row, does not hold or ask for the gate
// already, and was not refused or gave it up within KeyGateRetry.
func (k *keyBook) askGate(now time.Time, workerConfigID int64) bool {
	if workerConfigID == 0 || k.gate != "" || k.gateAsked {
		return false
	}
	return k.keeping(now) && (k.gateRefused.IsZero() || now.Sub(k.gateRefused) >= KeyGateRetry*k.hold)
}

// gatedLeases are the rows the gated keys get when the gate is given up:
// each under the token of the range that brought it.
func (k *keyBook) gatedLeases() []store.KeyLease {
	var keys []store.KeyLease
	for key, ks := range k.m {
		if ks.gated {
			keys = append(keys, store.KeyLease{Key: key, Token: ks.token})
		}
	}
	return keys
}

// gateGivenUp: the gate is free (or lost with the incarnation, which starts
// nothing more): the keys are rows or nothing from here. wanted: given up
// because others want the keys, so it is not asked for again for
// KeyGateRetry.
func (k *keyBook) gateGivenUp(wanted bool, now time.Time) {
	for _, ks := range k.m {
		ks.gated = false
	}
	k.gate = ""
	if wanted {
		k.gateRefused = now
	}
}

// leases lists the key leases with a row of their own and the gate, for a
// reconcile: anything else the instance holds it does not know of. A gate
// being asked for may be granted meanwhile: known, as pending keys are.
func (k *keyBook) leases() []store.KeyLease {
	keys := make([]store.KeyLease, 0, len(k.m))
	for key, ks := range k.m {
		if !ks.gated {
			keys = append(keys, store.KeyLease{Key: key, Token: ks.token})
		}
	}
	if k.gate != "" {
		keys = append(keys, store.KeyLease{Key: store.KeyGateKey, Token: k.gate})
	}
	for _, p := range k.acqs {
		if p.req.Gate != "" {
			keys = append(keys, store.KeyLease{Key: store.KeyGateKey, Token: p.req.Gate})
		}
	}
	return keys
}

// pruneAcquisitions drops the acquisitions none of whose keys is still
// pending under its token (their ranges went: a hand-back). One a range
// still held waits for (its release failed) stays.
func (k *keyBook) pruneAcquisitions() {
	k.acqs = slices.DeleteFunc(k.acqs, func(p *acquiring) bool {
		for _, key := range p.keys {
			if ks := k.m[key]; ks != nil && ks.pending && ks.token == p.token {
				return false
			}
		}
		return true
	})
	k.gateAsked = slices.ContainsFunc(k.acqs, func(p *acquiring) bool { return p.req.Gate != "" })
	if len(k.acqs) == 0 {
		k.acqs = nil
	}
}

// check reports the first way the key book disagrees with itself.
func (k *keyBook) check() error {
	kept := 0
	for key, ks := range k.m {
		if !ks.idleAt.IsZero() {
			kept++
			if len(ks.ranges) > 0 || len(ks.queue) > 0 || ks.pending {
				return fmt.Errorf("keys: key %q is kept and in use (%d ranges, %d queued, pending %t)", key, len(ks.ranges), len(ks.queue), ks.pending)
			}
		} else if len(ks.ranges) == 0 {
			return fmt.Errorf("keys: key %q is held, not kept, and no range uses it", key)
		}
		if ks.gated && (k.gate == "" || ks.ordered || ks.pending) {
			return fmt.Errorf("keys: key %q is gated (gate %q, ordered %t, pending %t)", key, k.gate, ks.ordered, ks.pending)
		}
		if ks.pending && !slices.ContainsFunc(k.acqs, func(p *acquiring) bool { return p.token == ks.token && slices.Contains(p.keys, key) }) {
			return fmt.Errorf("keys: key %q is pending and no acquisition under its token wants it", key)
		}
	}
	if kept != k.nkept {
		return fmt.Errorf("keys: %d kept, counted %d", kept, k.nkept)
	}
	asked := slices.ContainsFunc(k.acqs, func(p *acquiring) bool { return p.req.Gate != "" })
	if asked != k.gateAsked {
		return fmt.Errorf("keys: the gate is asked for %t, but an acquisition asking for it is pending %t", k.gateAsked, asked)
	}
	return nil
}
