package claimer

import (
	"fmt"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

type msgState uint8

const (
	waiting msgState = iota // queued behind its key in this range
	running
	done
)

// Ref names the work a job belongs to, for the actor that dispatched it.
// The range claimer's names one message of one incarnation of a range: a
// range this instance reclaims after its own lease lapsed comes back under a
// new token, possibly with its low bound moved (a hand-back elsewhere
// dropped a settled prefix), so an index means nothing without the token it
// was dispatched under. The exception claimer's names the row's message.
type Ref struct {
	rangeID int64
	token   string
	index   int
	row     store.Position // the exception claimer's
}

// ref is the range claimer's kind of Ref.
type ref = Ref

// inflight is one range the range claimer holds: its messages, each one's
// policy (pinned at claim) and state, and what its settlement writes.
type inflight struct {
	r       store.Range
	eff     []policy.Effective
	state   []msgState
	writes  []*store.ExceptionWrite // nil: success (or not done)
	log     []store.DeliveryWrite   // delivery-log rows, per the group's mode
	pending int                     // messages without an outcome
	keys    []string                // held keys this range uses (acquired or shared)
	release []store.KeyLease        // keys its settlement releases, once computed
	excKeys map[string]bool         // keys of its messages given exception rows: never kept
	left    bool                    // its keys were detached (release computed)
	// uncertain: a commit attempt failed without saying whether it applied
	// (a reply lost to a cut connection, say), so a later attempt that
	// finds the range gone has found that earlier attempt's work.
	uncertain bool
	// recorded is how many of the range's first messages the database
	// already counts as settled (RecordProgress moved its low bound past
	// them and wrote their rows): a reclaimer starts after them.
	recorded int
	// rec marks the messages whose outcome RecordProgress wrote (the
	// recorded prefix, and beyond it the range's settled set): a reclaimer
	// skips them.
	rec []bool
	// adopted: an earlier session of the consumer left it (Leftovers); it
	// is only recorded and released, and counts in no queue.
	adopted bool
	// handlerLeft: a handler of the range was abandoned and may still read
	// its message, so the range's slabs are not recycled.
	handlerLeft bool
}

// newInflight is a claimed range with every message waiting.
func newInflight(r store.Range) *inflight {
	n := len(r.Messages)
	return &inflight{r: r, eff: make([]policy.Effective, n), state: make([]msgState, n),
		writes: make([]*store.ExceptionWrite, n), rec: make([]bool, n), pending: n}
}

// markExc records that the range gives a message of key an exception row.
func (in *inflight) markExc(key string) {
	if key == "" {
		return
	}
	if in.excKeys == nil {
		in.excKeys = map[string]bool{}
	}
	in.excKeys[key] = true
}

// doneUnrecorded lists the ids of the range's messages with an outcome not
// yet written.
func (in *inflight) doneUnrecorded() []int64 {
	var ids []int64
	for i, st := range in.state {
		if st == done && !in.rec[i] {
			ids = append(ids, in.r.Messages[i].ID)
		}
	}
	return ids
}

// settledPrefix returns how many of the range's first messages have an
// outcome.
func (in *inflight) settledPrefix() int {
	n := 0
	for n < len(in.state) && in.state[n] == done {
		n++
	}
	return n
}

// rangeBook is the range claimer's book of the ranges it holds: each range
// by id, their claim order, how many of their messages are claimed and not
// settled, and the complete ranges whose commit must be retried. Its
// methods keep these in agreement (check says how); nothing else changes
// them.
type rangeBook struct {
	m     map[int64]*inflight
	order []int64 // range ids in claim order, for hand-back and progress
	// queued counts the messages without an outcome of the ranges the
	// actor claimed (adopted ones count in no queue).
	queued int
	// toCommit are the complete ranges (id, token), each once: the actor
	// commits a range as it completes, and again at each flush while the
	// commit fails.
	toCommit []ref
	// keepDue breaks forget on purpose (hooks.Broken.ForgetKeepsCommitDue).
	keepDue bool
}

func (b *rangeBook) reset() {
	b.m, b.order, b.queued, b.toCommit = map[int64]*inflight{}, nil, 0, nil
}

func (b *rangeBook) len() int { return len(b.m) }

// get returns the range held under id, or nil.
func (b *rangeBook) get(id int64) *inflight { return b.m[id] }

// of returns the range incarnation rf was dispatched under, or nil when the
// range is gone or held under another token now.
func (b *rangeBook) of(rf ref) *inflight {
	if in := b.m[rf.rangeID]; in != nil && in.r.Token == rf.token {
		return in
	}
	return nil
}

// add takes a range in, last in claim order. Its messages without an
// outcome count as queued unless it was adopted. Callers first let go of
// an earlier incarnation of the range (books.dropStale), which holds keys;
// one still here is forgotten.
func (b *rangeBook) add(in *inflight) {
	b.forget(in.r.ID)
	b.m[in.r.ID] = in
	b.order = append(b.order, in.r.ID)
	if !in.adopted {
		b.queued += in.pending
	}
	if in.pending == 0 {
		b.commitDue(in)
	}
}

// forget lets a range go (committed, released, lost or dropped): it leaves
// the order and the commits to retry, and its messages without an outcome
// leave the queue.
func (b *rangeBook) forget(id int64) {
	in := b.m[id]
	if in == nil {
		return
	}
	delete(b.m, id)
	for i, rid := range b.order {
		if rid == id {
			b.order = append(b.order[:i], b.order[i+1:]...)
			break
		}
	}
	if len(b.toCommit) > 0 && !b.keepDue {
		kept := b.toCommit[:0]
		for _, c := range b.toCommit {
			if c.rangeID != id {
				kept = append(kept, c)
			}
		}
		b.toCommit = kept
	}
	if !in.adopted {
		b.queued -= in.pending
	}
}

// ids returns the ranges' ids in claim order, a copy: the caller may
// forget ranges while it walks them.
func (b *rangeBook) ids() []int64 { return append([]int64(nil), b.order...) }

// settle gives message i of in its outcome: w is its exception row (nil: a
// success, or settled without delivery).
func (b *rangeBook) settle(in *inflight, i int, w *store.ExceptionWrite) {
	in.state[i], in.writes[i] = done, w
	in.pending--
	if !in.adopted {
		b.queued--
	}
	if in.pending == 0 {
		b.commitDue(in)
	}
}

// commitDue names a complete range to commit.
func (b *rangeBook) commitDue(in *inflight) {
	for _, c := range b.toCommit {
		if c.rangeID == in.r.ID {
			return
		}
	}
	b.toCommit = append(b.toCommit, ref{rangeID: in.r.ID, token: in.r.Token})
}

// takeCommits returns the commits due and empties the list: the caller
// names again (commitDue) those that fail.
func (b *rangeBook) takeCommits() []ref {
	c := b.toCommit
	b.toCommit = nil
	return c
}

// check reports the first way the book disagrees with itself.
func (b *rangeBook) check() error {
	if len(b.order) != len(b.m) {
		return fmt.Errorf("ranges: %d in the order, %d in the book", len(b.order), len(b.m))
	}
	seen := make(map[int64]bool, len(b.order))
	queued := 0
	for _, id := range b.order {
		in := b.m[id]
		switch {
		case in == nil:
			return fmt.Errorf("ranges: range %d is in the order but not in the book", id)
		case seen[id]:
			return fmt.Errorf("ranges: range %d is in the order twice", id)
		case in.r.ID != id:
			return fmt.Errorf("ranges: range %d is held under id %d", in.r.ID, id)
		}
		seen[id] = true
		if err := in.check(); err != nil {
			return fmt.Errorf("ranges: range %d: %w", id, err)
		}
		if !in.adopted {
			queued += in.pending
		}
	}
	if queued != b.queued {
		return fmt.Errorf("ranges: %d messages queued, the ranges have %d without an outcome", b.queued, queued)
	}
	retry := make(map[int64]bool, len(b.toCommit))
	for _, c := range b.toCommit {
		in := b.m[c.rangeID]
		switch {
		case in == nil || in.r.Token != c.token:
			return fmt.Errorf("ranges: a commit due names range %d, not held under its token", c.rangeID)
		case in.pending != 0:
			return fmt.Errorf("ranges: a commit due names range %d, which has %d messages without an outcome", c.rangeID, in.pending)
		case retry[c.rangeID]:
			return fmt.Errorf("ranges: range %d is to be committed twice", c.rangeID)
		}
		retry[c.rangeID] = true
	}
	for _, id := range b.order {
		if b.m[id].pending == 0 && !retry[id] {
			return fmt.Errorf("ranges: range %d is complete and not to be committed", id)
		}
	}
	return nil
}

// check reports the first way the range disagrees with itself.
func (in *inflight) check() error {
	n := len(in.r.Messages)
	if len(in.eff) != n || len(in.state) != n || len(in.writes) != n || len(in.rec) != n {
		return fmt.Errorf("%d messages, but %d policies, %d states, %d writes, %d recorded marks",
			n, len(in.eff), len(in.state), len(in.writes), len(in.rec))
	}
	pending := 0
	for i, st := range in.state {
		if st != done {
			pending++
			if in.writes[i] != nil {
				return fmt.Errorf("message %d has an exception row and no outcome", i)
			}
			if in.rec[i] {
				return fmt.Errorf("message %d is recorded and has no outcome", i)
			}
		}
		if i < in.recorded && !in.rec[i] {
			return fmt.Errorf("message %d is in the recorded prefix (%d) but not recorded", i, in.recorded)
		}
	}
	if pending != in.pending {
		return fmt.Errorf("%d messages without an outcome, counted %d", pending, in.pending)
	}
	if in.recorded > n {
		return fmt.Errorf("recorded prefix %d past its %d messages", in.recorded, n)
	}
	return nil
}
