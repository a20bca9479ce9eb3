package claimer

import (
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

var bookNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newBooks returns empty books with the actor's defaults.
func newBooks() *books {
	b := &books{keyBusyDelay: 100 * time.Millisecond, stats: &Stats{}}
	b.keys.hold = DefaultKeyHold
	b.reset()
	return b
}

// testRange is a range of messages with the given keys ("" for none), each
// under concurrency c.
func testRange(id int64, token string, c policy.Concurrency, keys ...string) store.Range {
	r := store.Range{ID: id, Token: token}
	for i, k := range keys {
		r.Messages = append(r.Messages, store.Message{Position: store.Position{Xid: id, ID: id*100 + int64(i)}, Key: k, Matched: true,
			Options: []byte(c)})
	}
	return r
}

func resolveFromOptions(m *store.Message) policy.Effective {
	return policy.Effective{Concurrency: policy.Concurrency(m.Options)}
}

// admitT admits r and checks the books.
func admitT(t *testing.T, b *books, r store.Range) admitted {
	t.Helper()
	ad := b.admit(r, resolveFromOptions, bookNow, 0)
	require.NoError(t, b.check())
	return ad
}

func TestUnkeyedMessagesStartAtOnce(t *testing.T) {
	b := newBooks()
	ad := admitT(t, b, testRange(1, "t1", policy.Parallel, "", "k", ""))
	require.Len(t, ad.jobs, 3)
	require.Nil(t, ad.acq)
	require.Equal(t, 3, b.ranges.queued)
	for i, j := range ad.jobs {
		_, complete := b.outcome(j.Ref, nil, false)
		require.NoError(t, b.check())
		require.Equal(t, i == 2, complete)
	}
	require.Zero(t, b.ranges.queued)
}

// The crash a freeze at scale found, at the books: a key busy elsewhere
// parks the messages queued behind it in two ranges, the range between
// them still running; both are complete, and the walk that finds them
// settles nothing itself.
func TestABusyKeyParksTheRangesQueuedBehindIt(t *testing.T) {
	b := newBooks()
	first := admitT(t, b, testRange(1, "t1", policy.Exclusive, "hot", "hot"))
	require.Empty(t, first.jobs)
	require.NotNil(t, first.acq)
	second := admitT(t, b, testRange(2, "t2", policy.Parallel, "", ""))
	require.Len(t, second.jobs, 2)
	third := admitT(t, b, testRange(3, "t3", policy.Exclusive, "hot"))
	require.Empty(t, third.jobs)
	require.Nil(t, third.acq, "queued behind the pending lease")

	ap := b.applyAcquired(Acquired{Held: map[string]bool{}, Blocked: map[string]bool{}}, bookNow)
	require.Empty(t, ap.jobs)
	require.Equal(t, []int64{1, 3}, ap.complete)
	require.EqualValues(t, 3, b.stats.Deferred.Load())
	require.NoError(t, b.check(), "complete ranges are the actor's to commit, and not yet to be retried")
}

// An exclusive key held for one range admits the next range's messages of
// the key behind its running one.
func TestAHeldKeyIsSharedAcrossRanges(t *testing.T) {
	b := newBooks()
	first := admitT(t, b, testRange(1, "t1", policy.Exclusive, "k", "k"))
	ap := b.applyAcquired(Acquired{Held: map[string]bool{"k": true}}, bookNow)
	require.NoError(t, b.check())
	require.Len(t, ap.jobs, 1)
	require.Nil(t, first.jobs)
	second := admitT(t, b, testRange(2, "t2", policy.Exclusive, "k"))
	require.Empty(t, second.jobs)
	require.Nil(t, second.acq)
	jobs := ap.jobs
	var ran []ref
	for len(jobs) > 0 {
		j := jobs[0]
		ran = append(ran, j.Ref)
		more, complete := b.outcome(j.Ref, nil, false)
		require.NoError(t, b.check())
		jobs = append(jobs[1:], more...)
		if complete {
			in := b.ranges.get(j.Ref.rangeID)
			plan := b.commitPlan(in, bookNow)
			b.ranges.forget(in.r.ID)
			require.NoError(t, b.check())
			if in.r.ID == 1 {
				require.Empty(t, plan.Keys, "the key is still used by the second range")
			} else {
				require.Empty(t, plan.Keys, "the last range keeps the key (decision 0045)")
			}
		}
	}
	require.Equal(t, []ref{{rangeID: 1, token: "t1", index: 0}, {rangeID: 1, token: "t1", index: 1}, {rangeID: 2, token: "t2", index: 0}}, ran)
	require.Equal(t, 1, b.keys.nkept)
	require.Len(t, b.keys.dueKept(bookNow.Add(DefaultKeyHold), false), 1)
	require.NoError(t, b.check())
}

// A failed ordered message holds its key's later messages back: they park.
func TestAFailedOrderedMessageParksTheRestOfItsKey(t *testing.T) {
	b := newBooks()
	admitT(t, b, testRange(1, "t1", policy.Ordered, "o", "o", "o"))
	ap := b.applyAcquired(Acquired{Held: map[string]bool{"o": true}}, bookNow)
	require.Len(t, ap.jobs, 1)
	jobs, complete := b.outcome(ap.jobs[0].Ref, &store.ExceptionWrite{Error: "failed"}, true)
	require.NoError(t, b.check())
	require.Empty(t, jobs)
	require.True(t, complete)
	plan := b.commitPlan(b.ranges.get(1), bookNow)
	require.Len(t, plan.Exceptions, 3)
	require.Equal(t, []store.KeyLease{{Key: "o", Token: "t1"}}, plan.Keys, "an ordered key is never kept")
}

// A range reclaimed under a new token replaces its earlier incarnation:
// the old one's running message no longer holds its key, and the next
// range's message of the key starts.
func TestAReclaimedRangeDropsItsEarlierIncarnation(t *testing.T) {
	b := newBooks()
	admitT(t, b, testRange(1, "t1", policy.Exclusive, "k"))
	ap := b.applyAcquired(Acquired{Held: map[string]bool{"k": true}}, bookNow)
	require.Len(t, ap.jobs, 1)
	admitT(t, b, testRange(2, "t2", policy.Exclusive, "k"))
	again := admitT(t, b, testRange(1, "t3", policy.Parallel, ""))
	require.Len(t, again.jobs, 2, "the second range's message of k, then the new incarnation's")
	require.False(t, b.running(ap.jobs[0].Ref), "the old incarnation's outcome is stale")
	require.Equal(t, 2, b.ranges.len())
}

// check catches a book broken in one structure only. Each variant breaks
// what a step must keep in agreement; the intact books pass.
func TestCheckCatchesABrokenBook(t *testing.T) {
	build := func() *books {
		b := newBooks()
		b.admit(testRange(1, "t1", policy.Exclusive, "k", "j", ""), resolveFromOptions, bookNow, 0)
		b.applyAcquired(Acquired{Held: map[string]bool{"k": true, "j": true}}, bookNow)
		b.admit(testRange(2, "t2", policy.Exclusive, "k", "k"), resolveFromOptions, bookNow, 0)
		b.admit(testRange(3, "t3", policy.Exclusive, "m"), resolveFromOptions, bookNow, 0)
		return b
	}
	require.NoError(t, build().check())
	for name, breakIt := range map[string]func(b *books){
		"an id left in the order only": func(b *books) { delete(b.ranges.m, 2) },
		"an id left in the book only":  func(b *books) { b.ranges.order = b.ranges.order[:2] },
		"an id twice in the order":     func(b *books) { b.ranges.order = append(b.ranges.order, 1); delete(b.ranges.m, 3) },
		"a queued count off by one":    func(b *books) { b.ranges.queued++ },
		"a pending count off by one":   func(b *books) { b.ranges.get(2).pending-- },
		"a key forgotten by the book":  func(b *books) { delete(b.keys.m, "j") },
		"a queue naming a gone range": func(b *books) {
			delete(b.ranges.m, 2)
			b.ranges.order = b.ranges.order[:1]
			b.ranges.order = append(b.ranges.order, 3)
		},
		"a message dropped from a queue": func(b *books) { ks := b.keys.get("k"); ks.queue = ks.queue[:len(ks.queue)-1] },
		"a message queued twice":         func(b *books) { ks := b.keys.get("k"); ks.queue = append(ks.queue, ks.queue[len(ks.queue)-1]) },
		"a kept count off by one":        func(b *books) { b.keys.nkept++ },
		"a pending key with no acquisition": func(b *books) {
			b.keys.acqs = nil
		},
		"a held key with its head waiting": func(b *books) { b.ranges.get(1).state[0] = waiting },
		"a complete range not to be committed": func(b *books) {
			in := b.ranges.get(3) // settled by hand, not through the book
			in.state[0], in.pending = done, 0
			b.ranges.queued--
			b.keys.drop("m")
			in.keys, b.keys.acqs = nil, nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := build()
			breakIt(b)
			require.Error(t, b.check(), "the broken book went unnoticed")
		})
	}
}

func TestBooksCheckNamesTheDisagreement(t *testing.T) {
	b := newBooks()
	b.admit(testRange(1, "t1", policy.Parallel, ""), resolveFromOptions, bookNow, 0)
	delete(b.ranges.m, 1)
	require.EqualError(t, b.check(), fmt.Sprintf("ranges: %d in the order, %d in the book", 1, 0))
}
