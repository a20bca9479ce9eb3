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

// A range whose holders keep dying is quarantined after MaxRangeReclaims:
// its messages become independent exception rows, the healthy ones are
// delivered, and the poison one ends dead after its own retries.
func TestPoisonRangeIsQuarantinedAndHealthyMessagesAreDelivered(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{MaxRangeReclaims: 1, Message: policy.Options{MaxRetries: 2}},
		func(*order, int) error { return nil })
	ctx := context.Background()
	st.s.Produce(actortest.Orders("m", 5)...)
	stream := st.g.StreamID()
	db, g := st.e.Store, st.g.DB

	// Two holders claim the range and die on it (their leases lapse).
	for i := range 2 {
		owner := store.NewID()
		args := store.ClaimParams{Owner: owner, Limit: 10, Lease: time.Minute, Now: st.now()}
		if i == 0 {
			_, ok, err := g.ClaimRange(ctx, args)
			require.NoError(t, err)
			require.True(t, ok)
		} else {
			_, ok, err := g.ReclaimRange(ctx, args)
			require.NoError(t, err)
			require.True(t, ok)
		}
		require.NoError(t, db.ExpireOwnedRanges(ctx, owner, stream, st.now()))
	}
	// The next reclaim is past MaxRangeReclaims: quarantine, nothing runs.
	require.Zero(t, st.claimRange())
	require.EqualValues(t, 1, st.stats.Quarantined.Load())
	leases, err := g.RangeLeases(ctx)
	require.NoError(t, err)
	require.Empty(t, leases)
	require.Len(t, st.states(), 5)

	// m-2 kills every process that runs it: each time a new process
	// starts, claims, dies mid-handler, and its lease lapses.
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 10, "the poison message must end")
		ex, id := st.newExc()
		jobs, err := ex.Claim(ctx)
		require.NoError(t, err)
		if len(jobs) == 0 {
			break
		}
		for _, j := range jobs {
			if orderOf(t, j).OrderID == "m-2" {
				continue // the process dies mid-handler: no outcome
			}
			more, err := ex.Outcome(ctx, ex.Run(ctx, j))
			require.NoError(t, err)
			require.Empty(t, more, "no chain: the keys differ")
		}
		require.NoError(t, db.ExpireOwnedRanges(ctx, id, stream, st.now()))
	}
	xs := st.states()
	require.Len(t, xs, 1, "the healthy messages were delivered")
	require.Equal(t, "dead", xs[0].Status)
	require.Equal(t, 3, xs[0].Attempts, "the first attempt and MaxRetries retries, each a lapsed lease")
	delivered := map[string]bool{}
	for _, c := range st.calls {
		delivered[c.id] = true
	}
	for _, id := range []string{"m-0", "m-1", "m-3", "m-4"} {
		require.True(t, delivered[id], id)
	}
}

// ConcurrencyOverride is pinned when a message is claimed: flipping it
// afterwards does not change the policy the message finishes under.
func TestOverrideIsPinnedAtClaim(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{ConcurrencyOverride: policy.Exclusive}, func(*order, int) error { return nil })
	ctx := context.Background()
	st.s.Produce(actortest.Msg{Payload: order{OrderID: "o1"}, Key: "customer-1"})

	group := st.g.Policy()
	cfg := common(st.e, st.g, st.mock, nil)
	flip := group
	var seen []policy.Concurrency
	handler := func(_ context.Context, d *claimer.Delivery) error {
		seen = append(seen, d.Concurrency)
		if len(seen) == 1 {
			flip.Override = policy.Parallel // redeclared while the message runs
			return errors.New("fails once")
		}
		return nil
	}
	cfg.Handler = handler
	cfg.Group = func() policy.Group { return flip }
	flip = group
	rc := claimer.New(claimer.Config{Common: cfg, BatchLimit: 10, QueueSize: 10, StallAfter: time.Hour})
	jobs, err := rc.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	_, err = rc.Outcome(ctx, rc.Run(ctx, jobs[0]))
	require.NoError(t, err)
	xs := st.states()
	require.Equal(t, "exclusive", xs[0].Concurrency, "pinned on the exception row")

	ec := cfg
	ec.InstanceID = store.NewID()
	ex := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec})
	st.mock.Add(time.Hour)
	jobs, err = ex.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	more, err := ex.Outcome(ctx, ex.Run(ctx, jobs[0]))
	require.NoError(t, err)
	require.Empty(t, more)
	require.Equal(t, []policy.Concurrency{policy.Exclusive, policy.Exclusive}, seen, "the retry runs under the policy it was claimed with")
	require.Empty(t, st.states())
}

// An exclusive key held for one range is shared with the instance's next
// range: the later messages queue behind the running one instead of being
// parked as exception rows, they run one at a time in claim order, and the
// lease row stays until the last range using it commits.
func TestExclusiveKeyIsSharedAcrossAnInstancesRanges(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return nil })
	ctx := context.Background()
	st.s.Produce(actortest.Keyed(20, 2, exclusive)...)
	leaseRows := func() (n int, tokens int) {
		require.NoError(t, st.e.Pool.QueryRow(ctx,
			"SELECT count(*), count(DISTINCT token) FROM "+st.s.Table("key_lease")+" WHERE group_id = $1 AND message_key <> ''",
			st.g.ID()).Scan(&n, &tokens))
		return n, tokens
	}

	first, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, first, 2, "one running message per key")
	second, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, second, "the second range's messages queue behind the first's")
	require.Zero(t, st.stats.Deferred.Load(), "nothing parked")
	n, tokens := leaseRows()
	require.Equal(t, 2, n)
	require.Equal(t, 1, tokens, "the leases keep the acquiring range's token")

	var ran []int
	running := map[string]bool{}
	for _, j := range first {
		running[j.Delivery.Msg.Key] = true
	}
	jobs := first
	for len(jobs) > 0 {
		j := jobs[0]
		jobs = jobs[1:]
		ran = append(ran, orderOf(t, j).Amount)
		running[j.Delivery.Msg.Key] = false
		more, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
		for _, m := range more {
			require.False(t, running[m.Delivery.Msg.Key], "two messages of key %s at once", m.Delivery.Msg.Key)
			running[m.Delivery.Msg.Key] = true
		}
		jobs = append(jobs, more...)
		if st.stats.Committed.Load() == 1 {
			n, _ := leaseRows()
			require.Equal(t, 2, n, "the second range still uses both keys")
		}
	}
	require.Len(t, ran, 20)
	require.EqualValues(t, 2, st.stats.Committed.Load())
	n, _ = leaseRows()
	require.Equal(t, 2, n, "kept after the last range (decision 0045)")
	none, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, none)
	n, _ = leaseRows()
	require.Zero(t, n, "released by the claim that found nothing, with no range in flight")
	perKey := map[int][]int{}
	for _, a := range ran {
		perKey[a%2] = append(perKey[a%2], a)
	}
	for k, got := range perKey {
		require.IsIncreasing(t, got, "key k%d ran in claim order", k)
	}
	require.Zero(t, st.stats.Deferred.Load())
	require.Zero(t, st.exceptions())
}

// An ordered key's parked rows run as a chain: one exception claim leases the
// head and queues the rest behind it; each success starts the next row and
// hands it the key lease without another claim; a failure gives the rest of
// the chain back to pending, and a chain whose holder dies lapses without
// charging an attempt to rows that never started.
func TestOrderedChainRunsInOneClaimAndBreaksOnFailure(t *testing.T) {
	failOnce := map[string]bool{"m-0": true, "m-5": true}
	st := newStepper(t, groupconfig.Declared{ExceptionInitialBackoff: time.Second}, func(o *order, attempt int) error {
		if failOnce[o.OrderID] {
			delete(failOnce, o.OrderID)
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Keyed(10, 1, policy.Options{Concurrency: policy.Ordered})...)
	st.claimRange()
	require.Len(t, st.states(), 10, "m-0 failed: the key's later messages parked behind it")
	statuses := func() (out []string) {
		for _, x := range st.states() {
			out = append(out, fmt.Sprintf("%d:%s/%d", x.MessageID-st.states()[0].MessageID, x.Status, x.Attempts))
		}
		return out
	}
	var leaseToken, rowToken string
	leaseHolder := func(id int64) {
		require.NoError(t, st.e.Pool.QueryRow(ctx, fmt.Sprintf(
			`SELECT l.token::text, x.token::text FROM %s l, %s x
WHERE l.group_id = $1 AND l.message_key <> '' AND x.group_id = $1 AND x.message_id = $2`, st.s.Table("key_lease"), st.s.Table("exception")),
			st.g.ID(), id).Scan(&leaseToken, &rowToken))
	}

	st.mock.Add(2 * time.Second)
	first := st.states()[0].MessageID
	jobs, err := st.exc.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1, "one job per chain")
	require.Equal(t, []string{"0:running/1", "1:queued/0", "2:queued/0", "3:queued/0", "4:queued/0", "5:queued/0",
		"6:queued/0", "7:queued/0", "8:queued/0", "9:queued/0"}, statuses())
	for n := 0; len(jobs) > 0; n++ {
		require.Len(t, jobs, 1)
		require.Equal(t, first+int64(n), jobs[0].Delivery.Msg.ID, "the chain runs in log order")
		leaseHolder(jobs[0].Delivery.Msg.ID)
		require.Equal(t, rowToken, leaseToken, "the key lease follows the running row")
		jobs, err = st.exc.Outcome(ctx, st.exc.Run(ctx, jobs[0]))
		require.NoError(t, err)
	}
	require.Equal(t, []string{"0:pending/1", "1:pending/0", "2:pending/0", "3:pending/0", "4:pending/0"},
		statuses(), "m-5 failed: it waits on its curve, the rest of its chain is back to pending and unspent")

	// The next chain's holder dies: its head is charged the lapse, the
	// queued rows are not.
	st.mock.Add(2 * time.Second)
	dying, _ := st.newExc()
	jobs, err = dying.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	st.mock.Add(2 * time.Minute) // past the lease: nothing renews it
	jobs, err = st.exc.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, []string{"0:running/2", "1:queued/0", "2:queued/0", "3:queued/0", "4:queued/0"}, statuses())
	for len(jobs) > 0 {
		jobs, err = st.exc.Outcome(ctx, st.exc.Run(ctx, jobs[0]))
		require.NoError(t, err)
	}
	require.Empty(t, st.states())
	var order []string
	for _, c := range st.calls {
		order = append(order, c.id)
	}
	require.Equal(t, []string{"m-0", "m-0", "m-1", "m-2", "m-3", "m-4", "m-5", "m-5", "m-6", "m-7", "m-8", "m-9"}, order)
	// Retried counts rows begun: 6 in the first chain, 1 by the holder that
	// died, 5 in the last.
	require.Equal(t, int64(12), st.stats.Retried.Load())
}

// A key acquisition that finds its key busy elsewhere parks the messages
// queued behind it, in every range that shares the key: here the first and
// the third of three ranges, the second still running. Both settle at once.
// Settling one must not upset the walk over the others (a freeze at scale
// made the claimer panic here: a range forgotten mid-walk was looked up).
func TestABusyKeyParksEveryRangeQueuedBehindItAndSettlesThem(t *testing.T) {
	ctx := context.Background()
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return nil })
	st.ranges = claimer.New(claimer.Config{Common: st.common, BatchLimit: 10, QueueSize: 30, StallAfter: time.Hour})
	st.ranges.DeferAcquire(true)
	keyed := func(prefix string) []actortest.Msg {
		items := make([]actortest.Msg, 10)
		for i := range items {
			items[i] = actortest.Msg{Payload: order{OrderID: fmt.Sprintf("%s-%d", prefix, i)}, Key: "hot", Options: exclusive}
		}
		return items
	}
	plain := make([]actortest.Msg, 10)
	for i := range plain {
		plain[i] = actortest.Msg{Payload: order{OrderID: fmt.Sprintf("p-%d", i)}}
	}
	st.s.Produce(keyed("a")...)
	st.s.Produce(plain...)
	st.s.Produce(keyed("c")...)

	// Another live instance holds the key.
	other := store.NewID()
	require.NoError(t, st.e.Store.InsertInstance(ctx, store.InsertInstanceParams{ID: other, WorkerConfigID: st.g.Worker(store.WorkerMessageConsumer), DeclaredBy: "test", TTL: time.Hour, Now: st.now()}))
	held, _, err := st.g.DB.AcquireKeys(ctx, store.AcquireKeys{Want: []store.KeyClaim{{Key: "hot"}},
		Token: store.NewID(), Owner: other, TTL: time.Hour, Now: st.now()})
	require.NoError(t, err)
	require.True(t, held["hot"])

	first, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, first, "the first range waits for its key")
	second, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, second, 10, "the second range runs (and is left running)")
	third, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, third, "the third range queues behind the same pending key")
	require.True(t, st.ranges.Acquiring())

	jobs, err := st.ranges.Acquire(ctx)
	require.NoError(t, err)
	require.Empty(t, jobs)
	require.EqualValues(t, 20, st.stats.Deferred.Load(), "both keyed ranges' messages parked")
	require.EqualValues(t, 2, st.stats.Committed.Load(), "both keyed ranges settled")
	require.Equal(t, 10, st.ranges.Queued(), "the second range alone is in flight")
	require.Equal(t, 10, st.runAll(second))
	require.EqualValues(t, 3, st.stats.Committed.Load())
	require.EqualValues(t, 20, st.exceptions(), "every keyed message is an exception row")
}
