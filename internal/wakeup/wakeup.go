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
	"slices"
	"sync"
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

// Combiner merges the wake-ups of concurrent calls. The zero value is ready.
type Combiner struct {
	mu       sync.Mutex
	pending  map[int64]*Keys // carried by next
	next     *round          // the round that will carry what is pending
	inflight *round          // the round being sent, if any
}

type round struct {
	done chan struct{}
	err  error
}

func (r *round) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Wake returns once a round carrying streamID's wake-up for keys has been
// sent, by this call or by another, with that round's error.
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
	if c.next == nil {
		c.next = &round{done: make(chan struct{})}
	}
	mine := c.next
	for c.inflight != nil {
		wait := c.inflight
		c.mu.Unlock()
		select {
		case <-wait.done:
		case <-ctx.Done():
			return ctx.Err() // the wake-up stays pending for the next round
		}
		c.mu.Lock()
		if mine.finished() { // another call led it
			c.mu.Unlock()
			return mine.err
		}
	}
	// Lead this round: take everything pending, this call's wake-up included.
	payload := c.pending
	c.pending, c.next, c.inflight = nil, nil, mine
	c.mu.Unlock()

	err := send(ctx, payload)

	c.mu.Lock()
	mine.err = err
	c.inflight = nil
	close(mine.done)
	c.mu.Unlock()
	return err
}

// Pending reports how many streams' wake-ups wait for the next round
// (tests).
func (c *Combiner) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}
