package claimer

import (
	"fmt"
	"slices"
)

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
