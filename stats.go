package sqlstreams

import (
	"sync/atomic"

	"github.com/c1702965/sqlstreams/engine"
)

// Stats is a snapshot of counters: a Consumer's (Consumer.Stats:
// cumulative over every Consume session of this process, so metrics built on
// them only ever go up) or one session's (Session.Stats: from zero).
type Stats struct {
	Claimed     int64 // messages handed to handlers from ranges
	Reclaimed   int64 // ranges taken over from a dead holder
	Quarantined int64 // ranges split into exception rows
	Succeeded   int64
	Failed      int64 // failed attempts: errors, panics, timeouts
	Dead        int64 // messages that became dead letters
	Delayed     int64 // Delay results that spent no retry
	Deferred    int64 // keyed messages parked behind a busy or blocked key
	Retried     int64 // exception attempts started
	Panics      int64
	TimedOut    int64
	Abandoned   int64 // handlers that ignored their context past TimeoutGrace
	Committed   int64 // ranges committed
	LeasesLost  int64 // writes fenced off by a reclaimer
	Stalls      int64 // claims held back by an open transaction past StallWarning
	// ProgressRecorded counts settled prefixes recorded on ranges still in
	// flight (at most one write per claim poll), which a reclaimer skips.
	ProgressRecorded int64
	// AlertsDropped counts alerts not produced because the session's
	// bounded alert queue was full (the conditions were logged all the same).
	AlertsDropped int64
	// KeyGates counts the times the range claimer was granted its group's
	// key gate: it then held every exclusive key without a lease row each,
	// as the only session of the group (decision 0051). KeyGatesGivenUp
	// counts the times it gave the gate up because another session of
	// the group started or a keyed message waited for a retry.
	KeyGates, KeyGatesGivenUp int64
}

// statsOf reads an actor counter set.
func statsOf(s *engine.Stats) Stats {
	return Stats{
		Claimed: s.Claimed.Load(), Reclaimed: s.Reclaimed.Load(), Quarantined: s.Quarantined.Load(),
		Succeeded: s.Succeeded.Load(), Failed: s.Failed.Load(), Dead: s.Dead.Load(), Delayed: s.Delayed.Load(),
		Deferred: s.Deferred.Load(), Retried: s.Retried.Load(), Panics: s.Panics.Load(), TimedOut: s.TimedOut.Load(),
		Abandoned: s.Abandoned.Load(), Committed: s.Committed.Load(), LeasesLost: s.LeasesLost.Load(), Stalls: s.Stalls.Load(),
		ProgressRecorded: s.ProgressRecorded.Load(), AlertsDropped: s.AlertsDropped.Load(),
		KeyGates: s.KeyGates.Load(), KeyGatesGivenUp: s.KeyGatesGivenUp.Load(),
	}
}

// plus adds two snapshots field by field.
func (a Stats) plus(b Stats) Stats {
	return Stats{
		Claimed: a.Claimed + b.Claimed, Reclaimed: a.Reclaimed + b.Reclaimed, Quarantined: a.Quarantined + b.Quarantined,
		Succeeded: a.Succeeded + b.Succeeded, Failed: a.Failed + b.Failed, Dead: a.Dead + b.Dead, Delayed: a.Delayed + b.Delayed,
		Deferred: a.Deferred + b.Deferred, Retried: a.Retried + b.Retried, Panics: a.Panics + b.Panics, TimedOut: a.TimedOut + b.TimedOut,
		Abandoned: a.Abandoned + b.Abandoned, Committed: a.Committed + b.Committed, LeasesLost: a.LeasesLost + b.LeasesLost,
		Stalls: a.Stalls + b.Stalls, ProgressRecorded: a.ProgressRecorded + b.ProgressRecorded, AlertsDropped: a.AlertsDropped + b.AlertsDropped,
		KeyGates: a.KeyGates + b.KeyGates, KeyGatesGivenUp: a.KeyGatesGivenUp + b.KeyGatesGivenUp,
	}
}

// Stats returns the consumer's counters, cumulative over every Consume
// session of this process (ended ones and those running). A session's own
// counters, from zero, are its Session's (ConsumeOptions.Session).
func (c *Consumer[T]) Stats() Stats {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	sum := c.ended
	for s := range c.live {
		sum = sum.plus(statsOf(s))
	}
	return sum
}

// track adds a session's counters to the consumer's and returns the
// function that folds them into the ended sessions' total when it ends.
func (c *Consumer[T]) track(s *engine.Stats) (end func()) {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	if c.live == nil {
		c.live = map[*engine.Stats]struct{}{}
	}
	c.live[s] = struct{}{}
	return func() {
		c.statsMu.Lock()
		defer c.statsMu.Unlock()
		delete(c.live, s)
		c.ended = c.ended.plus(statsOf(s))
	}
}

// Session is one Consume call, seen from outside: its counters start at
// zero when the call starts and stay readable after it returns (seed 001: a
// Consume call is one session). A Session serves one Consume call; pass a
// new one to each.
type Session struct {
	stats engine.Stats
	used  atomic.Bool
}

// NewSession returns a Session to pass in ConsumeOptions.Session.
func NewSession() *Session { return &Session{} }

// Stats returns the session's counters.
func (s *Session) Stats() Stats { return statsOf(&s.stats) }
