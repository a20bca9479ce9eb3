package store

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// wakeCombiner sends the wake-ups of produces on the pool, merging those that
// commit while another is being sent. A notifying transaction is assigned an
// xid and commits with a WAL flush, under a lock PostgreSQL holds database-wide
// across that flush, so notifications are sent one at a time; one per produce
// call cost a batched produce 15% of its server CPU at 1M messages (decision
// 0014). With the combiner, a produce whose wake-up finds another in flight
// waits for it, and the next one carries every wake-up that arrived in the
// meantime, for all streams, in one statement: like a group commit. A produce
// returns once a send that carried its wake-up has finished, so a consumer
// woken then finds its messages committed.
type wakeCombiner struct {
	mu      sync.Mutex
	pending map[int64]*pendingWake // by stream
	next    uint64                 // the number of the round that will carry what is pending
	done    uint64                 // rounds finished: every round below it
	sending bool
	landed  chan struct{} // closed when the round in flight finishes
}

// pendingWake is one stream's merged wake-up.
type pendingWake struct {
	all  bool // too many routing keys to list: wake every group of the stream
	keys []string
	size int
}

func (p *pendingWake) add(msgs []NewMessage) {
	for _, m := range msgs {
		if p.all || m.RoutingKey == "" || slices.Contains(p.keys, m.RoutingKey) {
			continue
		}
		if p.size += len(m.RoutingKey) + 1; p.size > maxWakeKeys {
			p.all, p.keys = true, nil
			return
		}
		p.keys = append(p.keys, m.RoutingKey)
	}
}

// payload is the notification text (see WakePayload).
func (p *pendingWake) payload(streamID int64) string {
	id := strconv.FormatInt(streamID, 10)
	if p.all {
		return id
	}
	return id + ";" + strings.Join(p.keys, " ")
}

// wake returns once a round carrying streamID's wake-up for msgs has been
// sent, by this call or by another. send delivers one round's payloads.
func (w *wakeCombiner) wake(ctx context.Context, streamID int64, msgs []NewMessage, send func(context.Context, []string) error) error {
	w.mu.Lock()
	if w.pending == nil {
		w.pending = map[int64]*pendingWake{}
	}
	p := w.pending[streamID]
	if p == nil {
		p = &pendingWake{}
		w.pending[streamID] = p
	}
	p.add(msgs)
	round := w.next // the round that takes what is pending now carries this wake-up
	for w.sending {
		landed := w.landed
		w.mu.Unlock()
		select {
		case <-landed:
		case <-ctx.Done():
			// The wake-up stays pending for the next round, or rides the
			// one in flight.
			return &WakeError{Err: ctx.Err()}
		}
		w.mu.Lock()
	}
	if w.done > round { // another call sent it
		w.mu.Unlock()
		return nil
	}
	// Lead this round: take everything pending, this call's wake-up included.
	payloads := make([]string, 0, len(w.pending))
	for id, pw := range w.pending {
		payloads = append(payloads, pw.payload(id))
	}
	w.pending = map[int64]*pendingWake{}
	w.next++
	w.sending = true
	w.landed = make(chan struct{})
	w.mu.Unlock()

	err := send(ctx, payloads)

	w.mu.Lock()
	w.sending = false
	w.done = round + 1
	close(w.landed)
	w.mu.Unlock()
	if err != nil {
		return &WakeError{Err: err}
	}
	return nil
}
