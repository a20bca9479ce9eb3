// Package wakeup sends the wake-ups of produces that committed on the pool,
// merging those that commit while another is being sent: a group commit for
// notifications.
//
// A notifying transaction is assigned an xid and commits with a WAL flush,
// under a lock PostgreSQL holds database-wide across that flush, so
// notifications go out one at a time; one per produce call made concurrent
// producers wait on each other (decision 0014). With the
// combiner, a produce whose wake-up finds a round in flight waits for it, and
// the next round carries every wake-up that arrived meanwhile, for all
// streams, in one statement. A call returns once the round that carried its
// wake-up has been sent, so a consumer woken then finds its messages
// committed.
//
// What a follower sees: every call whose wake-up rode a round gets that
// round's result. When the leader's send fails, each of them gets the error
// too: their messages are committed all the same, and consumers find them at
// their next poll. A call whose context ends while it waits returns its
// context's error; its wake-up stays pending and rides the next round.
//
// It is part of the engine's inside, not an API for users.
package wakeup

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
)

// MaxKeysBytes bounds the routing keys one stream's wake-up lists (each key
// and a separator); past it the wake-up names only the stream, which wakes
// every group of it. PostgreSQL takes notification payloads under 8000
// bytes.
const MaxKeysBytes = 1000

// Keys is one stream's merged wake-up.
type Keys struct {
	All  bool // too many routing keys to list: wake every group of the stream
	List []string
	size int
}

// Add merges routing keys in; empty keys (messages without one) wake no
// group with bindings and are not listed.
func (k *Keys) Add(keys ...string) {
	for _, key := range keys {
		if k.All || key == "" || slices.Contains(k.List, key) {
			continue
		}
		if k.size += len(key) + 1; k.size > MaxKeysBytes {
			k.All, k.List = true, nil
			return
		}
		k.List = append(k.List, key)
	}
}

// Send delivers one round: per stream, its merged keys.
type Send func(ctx context.Context, round map[int64]*Keys) error

// Combiner merges the wake-ups of concurrent calls. The zero value sends
// rounds back to back; a client sets Clock and PerMessage.
//
// At most one round is in flight, and at most one call waits to send the
// next: the first call whose wake-up finds a round in flight, or finds the
// last round's hold-off running. Every later call leaves its wake-up with
// that one and returns at once, so a busy producer does not wait on other
// producers' notifications.
//
// A round's hold-off is PerMessage for each message it carried, at most
// MaxHoldOff: the next round starts no earlier. Each round is a transaction
// of its own, and the wake-ups of batched produces cost a fifth of their
// throughput while a round followed every call (decision 0044); held off, a
// round of 100 messages is followed by the next one 10 ms later at the
// soonest, carrying every call that committed meanwhile. A single message
// holds the next round off for 100 µs, so single produces wake consumers as
// soon as before up to about 10,000 a second.
type Combiner struct {
	// PerMessage is the hold-off after a round for each message it carried
	// (0: none).
	PerMessage time.Duration
	// Clock times the hold-off; it must be set when PerMessage is.
	Clock clocks.Clock

	mu       sync.Mutex
	pending  map[int64]*Keys // carried by the next round
	messages int             // how many messages pending wakes up for
	waiter   bool            // a call waits to send the next round
	inflight chan struct{}   // closed when the round being sent, if any, is
	until    time.Time       // the last round's hold-off ends
}

// MaxHoldOff bounds a round's hold-off: the longest a wake-up waits for the
// round before it, besides the round in flight.
const MaxHoldOff = 10 * time.Millisecond

// DefaultPerMessage is the hold-off per message a client uses.
const DefaultPerMessage = 100 * time.Microsecond

// Wake sends streamID's wake-up for keys, or leaves it with the call that
// will send the next round. It returns the errors of the rounds this call
// sent: nil when it left its wake-up to another call, and its context's
// error when that ended while it waited to send. Its wake-up then stays
// pending: the call in flight, if any, sends it when it finishes and no
// other call waits; otherwise the next produce's round carries it.
func (c *Combiner) Wake(ctx context.Context, streamID int64, keys []string, send Send) error {
	c.mu.Lock()
	if c.pending == nil {
		c.pending = map[int64]*Keys{}
	}
	k := c.pending[streamID]
	if k == nil {
		k = &Keys{}
		c.pending[streamID] = k
	}
	k.Add(keys...)
	c.messages += max(len(keys), 1)
	if c.waiter {
		c.mu.Unlock()
		return nil // the waiting call sends it
	}
	var errs []error
	for {
		// c.mu is held, and this call sends the next round once nothing
		// holds it off.
		if wait := c.holdOff(); wait != nil {
			c.waiter = true
			c.mu.Unlock()
			err := wait(ctx)
			c.mu.Lock()
			c.waiter = false
			if err != nil {
				c.mu.Unlock()
				return errors.Join(append(errs, err)...)
			}
			continue
		}
		// Lead a round: everything pending, this call's wake-up included.
		done := make(chan struct{})
		payload := c.pending
		if c.PerMessage > 0 {
			c.until = c.Clock.Now().Add(min(MaxHoldOff, time.Duration(c.messages)*c.PerMessage))
		}
		c.pending, c.messages, c.inflight = nil, 0, done
		c.mu.Unlock()

		if err := send(ctx, payload); err != nil {
			errs = append(errs, err)
		}

		c.mu.Lock()
		c.inflight = nil
		close(done)
		if len(c.pending) == 0 || c.waiter || ctx.Err() != nil {
			c.mu.Unlock()
			return errors.Join(errs...)
		}
		// Wake-ups were left for a call that gave up waiting: this call
		// sends them too.
	}
}

// holdOff returns what the next round waits for (nil: nothing): the round
// in flight, or a timer for the rest of the last round's hold-off, made here
// while c.mu is held (so a test that sees Waiting knows the timer is set).
func (c *Combiner) holdOff() func(ctx context.Context) error {
	var inflight <-chan struct{}
	var fired <-chan time.Time
	var stop func() bool
	if c.inflight != nil {
		inflight = c.inflight
	} else if c.PerMessage > 0 && c.until.After(c.Clock.Now()) {
		t := c.Clock.Timer(c.until.Sub(c.Clock.Now()))
		fired, stop = t.C(), t.Stop
	} else {
		return nil
	}
	return func(ctx context.Context) error {
		if stop != nil {
			defer stop()
		}
		select { // one of the two is nil, and never ready
		case <-inflight:
			return nil
		case <-fired:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Waiting reports whether a call waits to send the next round (tests).
func (c *Combiner) Waiting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiter
}

// Pending reports how many streams' wake-ups wait for the next round
// (tests).
func (c *Combiner) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}
