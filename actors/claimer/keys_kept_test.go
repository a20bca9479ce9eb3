package claimer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// exclusive is the options of an exclusive keyed message.
var exclusive = policy.Options{Concurrency: policy.Exclusive}

// Decision 0045: an exclusive key whose last range settled stays leased to
// the instance for KeyHold, so the next range that brings the key runs it
// without writing a lease again.

// claimNothing is the claim that finds the stream drained with no range in
// flight: it lets every kept key go.
func (st *stepper) claimNothing() {
	st.t.Helper()
	jobs, err := st.ranges.Claim(context.Background())
	require.NoError(st.t, err)
	require.Empty(st.t, jobs)
}

// drainRanges claims and runs ranges until a claim finds nothing.
func (st *stepper) drainRanges() {
	st.t.Helper()
	for {
		jobs, err := st.ranges.Claim(context.Background())
		require.NoError(st.t, err)
		if len(jobs) == 0 {
			return
		}
		st.runAll(jobs)
	}
}

// leaseTokens returns the group's key leases: key -> token.
func (st *stepper) leaseTokens() map[string]string {
	st.t.Helper()
	rows, err := st.e.Pool.Query(context.Background(),
		"SELECT message_key, token::text FROM "+st.s.Table("key_lease")+" WHERE group_id = $1 AND message_key <> ''", st.g.ID())
	require.NoError(st.t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, tok string
		require.NoError(st.t, rows.Scan(&k, &tok))
		out[k] = tok
	}
	require.NoError(st.t, rows.Err())
	return out
}

// twoRangesOfTenKeys produces 40 exclusive messages over 20 keys (key
// i%20) and claims two ranges of 10: k0..k9 and k10..k19.
func twoRangesOfTenKeys(t *testing.T, h func(*order, int) error) (*stepper, []claimer.Job, []claimer.Job) {
	t.Helper()
	st := newStepper(t, groupconfig.Declared{ExceptionInitialBackoff: time.Millisecond}, h)
	ctx := context.Background()
	st.s.Produce(actortest.Keyed(40, 20, exclusive)...)
	first, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, first, 10, "ten keys, one message each")
	second, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, second, 10)
	require.Len(t, st.leaseTokens(), 20)
	return st, first, second
}

func keyRange(lo, hi int) []string {
	var out []string
	for i := lo; i < hi; i++ {
		out = append(out, fmt.Sprintf("k%d", i))
	}
	return out
}

func TestAnExclusiveKeyIsKeptForTheInstancesNextRange(t *testing.T) {
	st, first, second := twoRangesOfTenKeys(t, func(*order, int) error { return nil })
	ctx := context.Background()
	before := st.leaseTokens()

	require.Equal(t, 10, st.runAll(first))
	require.EqualValues(t, 1, st.stats.Committed.Load())
	require.Equal(t, before, st.leaseTokens(), "the first range's keys are kept while the second is in flight")

	third, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, third, 10, "the kept keys run the third range's messages at once")
	require.Zero(t, st.stats.Deferred.Load(), "nothing parked")
	require.Equal(t, before, st.leaseTokens(), "no lease written again: each keeps the token that acquired it")

	require.Equal(t, 10, st.runAll(second))
	fourth, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, fourth, 10)
	require.Equal(t, before, st.leaseTokens(), "the second range's keys were kept for the fourth")

	require.Equal(t, 10, st.runAll(third))
	require.Equal(t, 10, st.runAll(fourth))
	require.EqualValues(t, 4, st.stats.Committed.Load())
	require.Len(t, st.leaseTokens(), 20, "the last range's keys are kept, too")
	st.claimNothing()
	require.Empty(t, st.leaseTokens(), "a claim that finds nothing with nothing in flight lets every kept key go")
	require.Zero(t, st.exceptions())
	require.Zero(t, st.stats.Deferred.Load())
}

func TestAKeptKeyIsReleasedAfterKeyHold(t *testing.T) {
	st, first, second := twoRangesOfTenKeys(t, func(*order, int) error { return nil })
	ctx := context.Background()
	require.Equal(t, 10, st.runAll(first))
	require.Len(t, st.leaseTokens(), 20)

	st.mock.Add(claimer.DefaultKeyHold - time.Millisecond)
	require.NoError(t, st.ranges.Flush(ctx))
	require.Len(t, st.leaseTokens(), 20, "kept for KeyHold")

	st.mock.Add(time.Millisecond)
	require.NoError(t, st.ranges.Flush(ctx))
	left := st.leaseTokens()
	require.ElementsMatch(t, keyRange(10, 20), keysOf(left), "the flush tick lets the idle keys go; the second range's stay")

	require.Equal(t, 10, st.runAll(second))
	st.mock.Add(claimer.DefaultKeyHold)
	require.NoError(t, st.ranges.Flush(ctx))
	require.Empty(t, st.leaseTokens(), "the flush tick lets the last range's keys go after KeyHold, too")
}

func TestAKeyWhoseMessageFailedIsNotKept(t *testing.T) {
	failed := false
	st, first, second := twoRangesOfTenKeys(t, func(o *order, attempt int) error {
		if o.OrderID == "m-0" && attempt == 1 {
			failed = true
			return errors.New("transient")
		}
		return nil
	})
	require.Equal(t, 10, st.runAll(first))
	require.True(t, failed)
	require.ElementsMatch(t, keyRange(1, 20), keysOf(st.leaseTokens()), "k0's retry must not wait for a kept lease")

	st.mock.Add(time.Second) // past the retry's backoff and KeyHold
	require.Equal(t, 1, st.retry(), "the retry of k0 runs")
	require.Equal(t, 10, st.runAll(second))
	st.drainRanges()
	require.Empty(t, st.leaseTokens())
	require.Zero(t, st.exceptions())
}

func TestAClaimerThatMeetsABusyKeyKeepsNone(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return nil })
	ctx := context.Background()
	// Another live instance holds k5.
	other := store.NewID()
	require.NoError(t, st.e.Store.InsertInstance(ctx, store.InsertInstanceParams{ID: other, WorkerConfigID: st.g.Worker(store.WorkerMessageConsumer), DeclaredBy: "test", TTL: time.Hour, Now: st.now()}))
	_, err := st.e.Pool.Exec(ctx,
		"INSERT INTO "+st.s.Table("key_lease")+" (group_id, message_key, token, owner, expires_at) VALUES ($1, 'k5', $2, $3, now() + interval '1 hour')",
		st.g.ID(), store.NewID(), other)
	require.NoError(t, err)
	st.s.Produce(actortest.Keyed(40, 20, exclusive)...)

	first, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, first, 9, "k5 is busy: its message is parked")
	require.EqualValues(t, 1, st.stats.Deferred.Load())
	second, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Equal(t, 9, st.runAll(first))
	require.ElementsMatch(t, append(keyRange(10, 20), "k5"), keysOf(st.leaseTokens()),
		"a claimer that met a busy key keeps nothing: another instance may be waiting for its keys")

	// The other instance lets k5 go; KeyHold after the contention, keys
	// are kept again.
	_, err = st.e.Pool.Exec(ctx, "DELETE FROM "+st.s.Table("key_lease")+" WHERE owner = $1", other)
	require.NoError(t, err)
	st.mock.Add(claimer.DefaultKeyHold)
	third, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, third, 10)
	require.Equal(t, 10, st.runAll(second))
	require.ElementsMatch(t, keyRange(0, 20), keysOf(st.leaseTokens()),
		"the third range holds k0..k9; k10..k19 are kept for the fourth")
	require.Equal(t, 10, st.runAll(third))
	st.drainRanges()
	require.Empty(t, st.leaseTokens())
}

func TestAHandBackReleasesKeptKeys(t *testing.T) {
	st, first, _ := twoRangesOfTenKeys(t, func(*order, int) error { return nil })
	ctx := context.Background()
	require.Equal(t, 10, st.runAll(first))
	require.Len(t, st.leaseTokens(), 20)
	require.NoError(t, st.ranges.HandBack(ctx))
	require.Empty(t, st.leaseTokens(), "the handed-back range's keys and the kept ones are all released")
}

func keysOf(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestAKeyIsKeptNoLongerThanMaxKeyKeepHolds(t *testing.T) {
	st, first, second := twoRangesOfTenKeys(t, func(*order, int) error { return nil })
	ctx := context.Background()
	require.Equal(t, 10, st.runAll(first))
	third, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, third, 10, "k0..k9 kept and used again")

	st.mock.Add(claimer.MaxKeyKeep * claimer.DefaultKeyHold)
	require.Equal(t, 10, st.runAll(third))
	require.ElementsMatch(t, keyRange(10, 20), keysOf(st.leaseTokens()),
		"leases acquired MaxKeyKeep KeyHolds ago go with their range, so a retry elsewhere finds them free")
	require.Equal(t, 10, st.runAll(second))
}

// A flush tick between ranges (none in flight, the next claim not yet made)
// is no reason to let kept keys go: only KeyHold, a claim that finds the
// stream drained, contention, hand-back or MaxKeyKeep are.
func TestAFlushTickBetweenRangesKeepsTheKeptKeys(t *testing.T) {
	st, first, second := twoRangesOfTenKeys(t, func(*order, int) error { return nil })
	ctx := context.Background()
	before := st.leaseTokens()
	require.Equal(t, 10, st.runAll(first))
	require.Equal(t, 10, st.runAll(second))
	require.NoError(t, st.ranges.Flush(ctx))
	require.Equal(t, before, st.leaseTokens(), "no range in flight, KeyHold not over: every key is kept")

	st.mock.Add(claimer.DefaultKeyHold / 2)
	third, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, third, 10, "the kept keys run the next range at once")
	require.Zero(t, st.stats.Deferred.Load())
	require.Equal(t, 10, st.runAll(third))

	st.mock.Add(claimer.DefaultKeyHold / 2)
	require.NoError(t, st.ranges.Flush(ctx))
	require.ElementsMatch(t, keyRange(0, 10), keysOf(st.leaseTokens()),
		"k10..k19, idle for KeyHold, go on the flush tick; k0..k9 were used again by the third range")
	st.drainRanges()
	require.Empty(t, st.leaseTokens())
}
