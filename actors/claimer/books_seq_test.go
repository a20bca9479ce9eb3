package claimer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// A random sequence of what the store and the handlers can tell the range
// claimer, applied to its books the way the actor applies it: claims and
// reclaims of ranges (keyed, unkeyed, unrouted messages), key acquisitions
// held, busy, blocked or failed, their replies in any order and after a
// hand-back, outcomes (stale ones too), commits that succeed, lose their
// lease or fail without saying, progress records, kept keys falling due,
// the key gate granted and given up, hand-backs that half fail, leftovers
// left and adopted, restarts and lapses. After every step the books agree
// (check), no key runs two messages at once, no message starts twice, and
// every message that entered is settled, parked as an exception, handed
// back or still owned; at the end, with the store and the handlers
// cooperating, everything drains.

// seqRand is where a sequence's choices come from: a seeded PRNG, or a
// fuzzer's bytes.
type seqRand interface{ IntN(n int) int }

// byteRand draws from a fuzzer's input; past its end every draw is 0.
type byteRand struct {
	b []byte
	i int
}

func (r *byteRand) IntN(n int) int {
	if n <= 1 || r.i >= len(r.b) {
		return 0
	}
	v := int(r.b[r.i])
	r.i++
	if n > 256 && r.i < len(r.b) {
		v = v<<8 | int(r.b[r.i])
		r.i++
	}
	return v % n
}

func (r *byteRand) done() bool { return r.i >= len(r.b) }

// seqMsg is what the sequence knows of one message of one range incarnation.
type seqMsg struct {
	ran, failed bool
}

// seq is one sequence's world.
type seq struct {
	rnd   seqRand
	b     books
	stats Stats
	now   time.Time
	log   []string // the steps, for a failure's report
	// jobs handed out and not yet given an outcome, by ref.
	jobs []Job
	// msgs of every incarnation the books took in (rangeID, token, index).
	msgs map[ref]*seqMsg
	// incarnations taken in and not yet let go of, by range id: their token.
	held map[int64]string
	// dropped are acquisitions a hand-back dropped, whose replies may still
	// come.
	dropped []*acquiring
	// left are the ranges a stopped session left (Leftovers).
	left []*inflight
	// stopping: a hand-back ran; the session is stopping and only hands
	// back again, leaves its leftovers, or is gone (restart).
	stopping bool
	nextID   int64
	nextMsg  int64
	nextTok  int
}

func newSeq(rnd seqRand) *seq {
	s := &seq{rnd: rnd, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), msgs: map[ref]*seqMsg{}, held: map[int64]string{}}
	s.b = books{keyBusyDelay: 100 * time.Millisecond, stats: &s.stats}
	s.b.keys.hold = []time.Duration{DefaultKeyHold, DefaultKeyHold, 50 * time.Millisecond, -1}[rnd.IntN(4)]
	s.b.reset()
	return s
}

func (s *seq) say(format string, args ...any) { s.log = append(s.log, fmt.Sprintf(format, args...)) }

func (s *seq) token() string { s.nextTok++; return fmt.Sprintf("t%d", s.nextTok) }

var seqKeys = []string{"", "a", "b", "c", "d"}

// claim takes a new range in, or reclaims one the books hold (an earlier
// incarnation after its own lease lapsed).
func (s *seq) claim() error {
	var r store.Range
	if ids := s.b.ranges.ids(); len(ids) > 0 && s.rnd.IntN(6) == 0 {
		old := s.b.ranges.get(ids[s.rnd.IntN(len(ids))])
		r = store.Range{ID: old.r.ID, Token: s.token(), Messages: slices.Clone(old.r.Messages[old.recorded:])}
		s.say("reclaim range %d as %s (%d messages)", r.ID, r.Token, len(r.Messages))
	} else {
		s.nextID++
		r = store.Range{ID: s.nextID, Token: s.token()}
		for range s.rnd.IntN(7) {
			s.nextMsg++
			r.Messages = append(r.Messages, store.Message{Position: store.Position{Xid: 1, ID: s.nextMsg},
				Key: seqKeys[s.rnd.IntN(len(seqKeys))], Matched: s.rnd.IntN(10) > 0,
				Options: []byte{byte('p' + s.rnd.IntN(3))}})
		}
		s.say("claim range %d as %s (%d messages)", r.ID, r.Token, len(r.Messages))
	}
	if old, ok := s.held[r.ID]; ok {
		s.forgetMsgs(r.ID, old)
	}
	s.held[r.ID] = r.Token
	for i := range r.Messages {
		s.msgs[ref{rangeID: r.ID, token: r.Token, index: i}] = &seqMsg{}
	}
	resolve := func(m *store.Message) policy.Effective {
		return policy.Effective{Concurrency: []policy.Concurrency{policy.Parallel, policy.Exclusive, policy.Ordered}[m.Options[0]-'p']}
	}
	ad := s.b.admit(r, resolve, s.now, int64(s.rnd.IntN(2)))
	if err := s.hand(ad.jobs); err != nil {
		return err
	}
	if ad.complete {
		return s.commit(r.ID)
	}
	return nil
}

// hand hands jobs out: none may start twice.
func (s *seq) hand(jobs []Job) error {
	for _, j := range jobs {
		for _, o := range s.jobs {
			if o.Ref == j.Ref {
				return fmt.Errorf("message %d of range %d (%s) started twice", j.Ref.index, j.Ref.rangeID, j.Ref.token)
			}
		}
		s.msgs[j.Ref].ran = true
		s.jobs = append(s.jobs, j)
	}
	return nil
}

// acquire applies an acquisition's reply: the oldest pending one's mostly,
// another one's or a dropped one's sometimes.
func (s *seq) acquire(cooperate bool) error {
	var p *acquiring
	switch {
	case len(s.dropped) > 0 && !cooperate && s.rnd.IntN(3) == 0:
		i := s.rnd.IntN(len(s.dropped))
		p = s.dropped[i]
		s.dropped = slices.Delete(s.dropped, i, i+1)
	case len(s.b.keys.acqs) > 0:
		i := 0
		if !cooperate && s.rnd.IntN(4) == 0 {
			i = s.rnd.IntN(len(s.b.keys.acqs))
		}
		p = s.b.keys.acqs[i]
	default:
		return nil
	}
	res := Acquired{of: p}
	if !s.b.underGate(p) {
		res.Held, res.Blocked = map[string]bool{}, map[string]bool{}
		if !cooperate && s.rnd.IntN(15) == 0 {
			res.Err = errors.New("connection lost")
		}
		for _, k := range p.req.Want {
			switch v := s.rnd.IntN(10); {
			case cooperate || v < 6:
				res.Held[k.Key] = true
			case v < 8 && k.Ordered:
				res.Blocked[k.Key] = true
			}
		}
		if p.req.Gate != "" && (cooperate || s.rnd.IntN(2) == 0) && res.Err == nil {
			res.Held[store.KeyGateKey] = true
			for _, k := range p.req.Want {
				if !k.Ordered {
					res.Held[k.Key] = true
				}
			}
		}
	}
	s.say("acquired for %s: held %v blocked %v err %v (pending %t)", p.token, res.Held, res.Blocked, res.Err, slices.Contains(s.b.keys.acqs, p))
	ap := s.b.applyAcquired(res, s.now)
	if err := s.hand(ap.jobs); err != nil {
		return err
	}
	for _, id := range ap.complete {
		if err := s.commitOr(id, cooperate); err != nil {
			return err
		}
	}
	return nil
}

// outcome gives a handed-out job its outcome, or drops it as the actor
// does a stale one.
func (s *seq) outcome(cooperate bool) error {
	if len(s.jobs) == 0 {
		return nil
	}
	i := 0
	if !cooperate {
		i = s.rnd.IntN(len(s.jobs))
	}
	j := s.jobs[i]
	s.jobs = slices.Delete(s.jobs, i, i+1)
	if !s.b.running(j.Ref) {
		s.say("outcome of %d/%s#%d: stale", j.Ref.rangeID, j.Ref.token, j.Ref.index)
		return nil
	}
	in := s.b.ranges.of(j.Ref)
	fail := !cooperate && s.rnd.IntN(4) == 0
	var w *store.ExceptionWrite
	if fail {
		m := &in.r.Messages[j.Ref.index]
		w = &store.ExceptionWrite{Position: m.Position, Key: m.Key, Status: policy.StatusPending, Error: "failed"}
		s.msgs[j.Ref].failed = true
	}
	s.say("outcome of %d/%s#%d: failed %t", j.Ref.rangeID, j.Ref.token, j.Ref.index, fail)
	jobs, complete := s.b.outcome(j.Ref, w, fail && in.eff[j.Ref.index].Concurrency == policy.Ordered)
	if err := s.hand(jobs); err != nil {
		return err
	}
	if complete {
		return s.commitOr(j.Ref.rangeID, cooperate)
	}
	return nil
}

// commit commits a complete range with a random result.
func (s *seq) commit(id int64) error { return s.commitOr(id, false) }

func (s *seq) commitOr(id int64, cooperate bool) error {
	in := s.b.ranges.get(id)
	if in == nil {
		return fmt.Errorf("range %d to commit is not held", id)
	}
	plan := s.b.commitPlan(in, s.now)
	switch v := s.rnd.IntN(10); {
	case cooperate || v < 7:
		if err := s.settled(in, plan.Exceptions); err != nil {
			return err
		}
		s.say("commit range %d: ok", id)
		s.b.ranges.forget(id)
		s.forgetMsgs(id, in.r.Token)
	case v < 8:
		s.say("commit range %d: lease lost", id)
		s.b.ranges.forget(id)
		s.forgetMsgs(id, in.r.Token)
	default:
		s.say("commit range %d: failed", id)
		in.uncertain = true
		s.b.ranges.commitDue(in)
	}
	return nil
}

// settled checks what a commit or a progress record writes of a range's
// messages: every message that failed or never ran (parked) has its
// exception row, or had it written by an earlier record; no success has
// one.
func (s *seq) settled(in *inflight, writes []store.ExceptionWrite) error {
	for i := range in.r.Messages {
		m := &in.r.Messages[i]
		if in.state[i] != done {
			return fmt.Errorf("range %d commits with message %d without an outcome", in.r.ID, i)
		}
		written := in.rec[i] || slices.ContainsFunc(writes, func(w store.ExceptionWrite) bool { return w.Position == m.Position })
		sm := s.msgs[ref{rangeID: in.r.ID, token: in.r.Token, index: i}]
		switch {
		case !m.Matched:
		case sm.ran && !sm.failed && !in.rec[i] && written:
			return fmt.Errorf("range %d: message %d succeeded and has an exception row", in.r.ID, i)
		case (sm.failed || !sm.ran) && !written:
			return fmt.Errorf("range %d: message %d (ran %t, failed %t) settles with no exception row: lost", in.r.ID, i, sm.ran, sm.failed)
		}
	}
	return nil
}

// forgetMsgs lets an incarnation's messages go: settled, handed back or
// lost to a reclaimer.
func (s *seq) forgetMsgs(id int64, token string) {
	if s.held[id] == token {
		delete(s.held, id)
	}
	for rf := range s.msgs {
		if rf.rangeID == id && rf.token == token {
			delete(s.msgs, rf)
		}
	}
}

// flush retries failed commits, records progress, and lets kept keys go.
func (s *seq) flush() error {
	for _, c := range s.b.ranges.takeCommits() {
		if s.b.ranges.of(c) != nil {
			if err := s.commit(c.rangeID); err != nil {
				return err
			}
		}
	}
	p := s.b.progress()
	advanced := map[int64]bool{}
	for _, pr := range p.ps {
		if s.rnd.IntN(5) > 0 {
			advanced[pr.RangeID] = true
		}
	}
	for i, pr := range p.ps { // what each record writes: every fresh failure's and parked message's row
		in := s.b.ranges.get(pr.RangeID)
		for _, j := range p.fresh[i] {
			m := &in.r.Messages[j]
			sm := s.msgs[ref{rangeID: in.r.ID, token: in.r.Token, index: j}]
			written := slices.ContainsFunc(pr.Exceptions, func(w store.ExceptionWrite) bool { return w.Position == m.Position })
			if m.Matched && (sm.failed || !sm.ran) && !written {
				return fmt.Errorf("a progress record of range %d settles message %d (ran %t, failed %t) with no exception row: lost", in.r.ID, j, sm.ran, sm.failed)
			}
		}
	}
	s.b.recorded(p, advanced)
	s.say("flush: %d progress records", len(p.ps))
	s.b.keys.dueKept(s.now, s.rnd.IntN(3) == 0)
	if s.b.keys.gate != "" && s.rnd.IntN(3) == 0 {
		s.say("gate given up")
		s.b.keys.gateGivenUp(true, s.now)
	}
	return nil
}

// handBack releases every range, some releases failing, as Actor.HandBack.
func (s *seq) handBack() error {
	s.say("hand back")
	for _, id := range s.b.ranges.ids() {
		in := s.b.ranges.get(id)
		if in.pending == 0 {
			if err := s.commit(id); err != nil {
				return err
			}
			continue
		}
		s.b.releaseKeys(in)
		if s.rnd.IntN(5) == 0 {
			continue // failed: a later hand-back tries again
		}
		s.b.ranges.forget(id)
		s.forgetMsgs(id, in.r.Token)
	}
	before := slices.Clone(s.b.keys.acqs)
	s.b.keys.pruneAcquisitions()
	for _, p := range before {
		if !slices.Contains(s.b.keys.acqs, p) {
			s.dropped = append(s.dropped, p)
		}
	}
	s.b.keys.dueKept(s.now, true)
	if s.b.keys.gate != "" {
		s.b.keys.gateGivenUp(false, s.now)
	}
	return nil
}

// restart drops everything, as a restarted actor or a lapsed incarnation
// does (the database lets its leases go).
func (s *seq) restart() {
	s.say("restart")
	s.jobs = nil // the stopped run's pool and its outcomes went with it
	s.dropped = append(s.dropped, s.b.keys.acqs...)
	s.b.reset()
	for id, tok := range s.held {
		s.forgetMsgs(id, tok)
	}
}

// leave hands the ranges to a stopped session's leftovers; adopt takes
// them back in, as the next session does.
func (s *seq) leave() {
	s.say("leave")
	for _, id := range s.b.ranges.ids() {
		in := s.b.ranges.get(id)
		s.b.releaseKeys(in)
		s.left = append(s.left, in)
	}
	s.jobs = nil
	s.dropped = append(s.dropped, s.b.keys.acqs...)
	s.b.reset()
}

func (s *seq) adopt() error {
	for _, in := range s.left {
		if s.b.ranges.get(in.r.ID) != nil || s.held[in.r.ID] != in.r.Token {
			continue // reclaimed meanwhile
		}
		s.say("adopt range %d", in.r.ID)
		in.adopted = true
		s.b.ranges.add(in)
	}
	s.left = nil
	// An adopted range is only recorded and released.
	for _, id := range s.b.ranges.ids() {
		if in := s.b.ranges.get(id); in.adopted && in.pending > 0 {
			s.b.ranges.forget(id)
			s.forgetMsgs(id, in.r.Token)
		}
	}
	return nil
}

// verify checks what must hold between steps.
func (s *seq) verify() error {
	if err := s.b.check(); err != nil {
		return err
	}
	runningKeys := map[string]int{}
	for _, id := range s.b.ranges.order {
		in := s.b.ranges.get(id)
		if in.adopted {
			continue
		}
		for i, st := range in.state {
			if m := &in.r.Messages[i]; st == running && m.Key != "" && in.eff[i].Concurrency.Keyed() {
				if runningKeys[m.Key]++; runningKeys[m.Key] > 1 {
					return fmt.Errorf("key %q runs two messages at once", m.Key)
				}
			}
		}
	}
	for id, tok := range s.held {
		if in := s.b.ranges.get(id); in == nil || in.r.Token != tok {
			if !slices.ContainsFunc(s.left, func(in *inflight) bool { return in.r.ID == id && in.r.Token == tok }) {
				return fmt.Errorf("range %d (%s) left the books without being settled, handed back or lost", id, tok)
			}
		}
	}
	return nil
}

// step takes one random step.
func (s *seq) step() error {
	if s.stopping {
		switch s.rnd.IntN(3) {
		case 0:
			return s.handBack()
		case 1:
			s.leave()
		default:
			s.restart()
		}
		s.stopping = false
		return nil
	}
	switch v := s.rnd.IntN(100); {
	case v < 22:
		return s.claim()
	case v < 37:
		return s.acquire(false)
	case v < 70:
		return s.outcome(false)
	case v < 78:
		return s.flush()
	case v < 84:
		s.now = s.now.Add(time.Duration(s.rnd.IntN(800)) * time.Millisecond)
		s.say("advance to %s", s.now.Format("15:04:05.000"))
	case v < 88:
		if s.b.ranges.len() == 0 { // a claim that found nothing with nothing in flight
			s.b.keys.dueKept(s.now, true)
			if s.b.keys.gate != "" {
				s.b.keys.gateGivenUp(false, s.now)
			}
		}
	case v < 92:
		s.stopping = true
		return s.handBack()
	case v < 94:
		s.restart()
	case v < 96:
		s.leave()
	default:
		return s.adopt()
	}
	return nil
}

// drain has the store and handlers cooperate until nothing is in flight:
// whatever entered must come out.
func (s *seq) drain() error {
	s.say("drain")
	if s.stopping { // the next session adopts what this one left
		s.leave()
		s.stopping = false
	}
	s.dropped = nil
	if err := s.adopt(); err != nil {
		return err
	}
	for _, id := range s.b.ranges.ids() { // a hand-back's failed releases, now released
		if in := s.b.ranges.get(id); in.left && in.pending > 0 {
			s.b.ranges.forget(id)
			s.forgetMsgs(id, in.r.Token)
		}
	}
	s.b.keys.pruneAcquisitions()
	for range 100000 {
		switch {
		case len(s.b.keys.acqs) > 0:
			if err := s.acquire(true); err != nil {
				return err
			}
		case len(s.jobs) > 0:
			if err := s.outcome(true); err != nil {
				return err
			}
		case len(s.b.ranges.toCommit) > 0:
			for _, c := range s.b.ranges.takeCommits() {
				if s.b.ranges.of(c) != nil {
					if err := s.commitOr(c.rangeID, true); err != nil {
						return err
					}
				}
			}
		default:
			if s.b.ranges.len() > 0 {
				return fmt.Errorf("stuck: %d ranges in flight, nothing to run, acquire or commit", s.b.ranges.len())
			}
			return nil
		}
		if err := s.verify(); err != nil {
			return err
		}
	}
	return errors.New("the drain did not end")
}

// runSeq runs up to steps random steps, then drains. It returns the first
// failure with the steps that led to it; a panic is one too.
func runSeq(rnd seqRand, steps int, stop func() bool) (err error) {
	s := newSeq(rnd)
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v", v)
		}
		if err != nil {
			tail := s.log[max(0, len(s.log)-40):]
			err = fmt.Errorf("%w\nlast steps:\n  %s", err, joinLines(tail))
		}
	}()
	for i := 0; i < steps && (stop == nil || !stop()); i++ {
		if err := s.step(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		if err := s.verify(); err != nil {
			return fmt.Errorf("after step %d: %w", i, err)
		}
	}
	return s.drain()
}

func joinLines(ls []string) string {
	out := ""
	for i, l := range ls {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// newSeqRand is a sequence's PRNG.
func newSeqRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d)) }
