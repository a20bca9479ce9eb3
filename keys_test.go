package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// A range whose holders keep dying is quarantined after MaxRangeReclaims:
// its messages become independent exception rows, the healthy ones are
// delivered, and the poison one ends dead after its own retries.
func TestPoisonRangeIsQuarantinedAndHealthyMessagesAreDelivered(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{MaxRangeReclaims: 1, Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 2}}},
		func(*order, int) error { return nil })
	ctx := context.Background()
	st.e.produceN(s, "m", 5)
	stream := st.c.group.StreamID
	db, g := st.e.client.store, st.c.db()

	// Two holders claim the range and die on it (their leases lapse).
	for i := range 2 {
		owner := engine.NewID()
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
			var o order
			require.NoError(t, json.Unmarshal(j.Delivery.Msg.Payload, &o))
			if o.OrderID == "m-2" {
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
	st, s := newStepper(t, &ConsumerConfig{ConcurrencyOverride: Exclusive}, func(*order, int) error { return nil })
	ctx := context.Background()
	_, err := s.Produce(ctx, order{OrderID: "o1"}, &ProduceOptions{Key: "customer-1"})
	require.NoError(t, err)

	group := st.c.cfg.policyGroup()
	common := st.e.common(st.c, st.mock, nil)
	flip := group
	var seen []policy.Concurrency
	handler := func(_ context.Context, d *claimer.Delivery) error {
		seen = append(seen, d.Concurrency)
		if len(seen) == 1 {
			flip.Override = Parallel // redeclared while the message runs
			return errors.New("fails once")
		}
		return nil
	}
	common.Handler = handler
	common.Group = func() policy.Group { return flip }
	flip = group
	rc := claimer.New(claimer.Config{Common: common, BatchLimit: 10, QueueSize: 10, StallAfter: time.Hour})
	jobs, err := rc.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	_, err = rc.Outcome(ctx, rc.Run(ctx, jobs[0]))
	require.NoError(t, err)
	xs := st.states()
	require.Equal(t, "exclusive", xs[0].Concurrency, "pinned on the exception row")

	ec := common
	ec.InstanceID = engine.NewID()
	ex := claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec})
	st.mock.Add(time.Hour)
	jobs, err = ex.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	more, err := ex.Outcome(ctx, ex.Run(ctx, jobs[0]))
	require.NoError(t, err)
	require.Empty(t, more)
	require.Equal(t, []policy.Concurrency{Exclusive, Exclusive}, seen, "the retry runs under the policy it was claimed with")
	require.Empty(t, st.states())
}

// keyTracker records handler start and stop per key and notes any overlap.
type keyTracker struct {
	mu       sync.Mutex
	inFlight map[string]int
	overlaps int
	order    map[string][]int
	handled  map[string]bool
	want     int
	done     chan struct{}
}

func newKeyTracker(want int) *keyTracker {
	return &keyTracker{inFlight: map[string]int{}, order: map[string][]int{}, handled: map[string]bool{}, want: want, done: make(chan struct{})}
}

func (k *keyTracker) start(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inFlight[key]++
	if k.inFlight[key] > 1 {
		k.overlaps++
	}
}

func (k *keyTracker) stop(key string, o *order, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inFlight[key]--
	if ok && !k.handled[o.OrderID] {
		k.handled[o.OrderID] = true
		k.order[key] = append(k.order[key], o.Amount)
		if len(k.handled) == k.want {
			close(k.done)
		}
	}
}

// work yields many times so that overlapping handlers would interleave.
func work() {
	for range 200 {
		runtime.Gosched()
	}
}

func keyedBatch(n, keys int) []BatchItem[order] {
	items := make([]BatchItem[order], n)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("m-%d", i), Amount: i}, Key: fmt.Sprintf("k%d", i%keys)}
	}
	return items
}

func TestExclusiveKeysNeverOverlapAcrossInstances(t *testing.T) {
	_, s, c := setup(t, nil, "g", 0)
	const n, keys = 300, 5
	_, err := s.ProduceBatch(context.Background(), keyedBatch(n, keys), &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.NoError(t, err)
	kt := newKeyTracker(n)
	bad := newFailures(t)
	// Each instance's first handler holds its keys until the other has
	// made a claim, so the other's claim meets busy keys whatever the
	// timing: the contention the test is about always happens.
	claimed := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var claims [2]atomic.Int32
	var first [2]sync.Once
	opts := func(me int) *ConsumeOptions {
		return &ConsumeOptions{BatchLimit: 20, QueueSize: 40, MessageConcurrency: 8, ClaimPollRate: 5 * time.Millisecond,
			test: &hooks.Hooks{Step: func(site hooks.Site) error {
				// Room for two batches: the second claim starts as soon as
				// the first is done, whatever its handlers do.
				if site == hooks.ClaimerClaim && claims[me].Add(1) == 2 {
					close(claimed[me])
				}
				return nil
			}}}
	}
	h := func(me int) Handler[order] {
		return func(ctx context.Context, o *order) error {
			meta, _ := MetaFromContext(ctx)
			if meta.Concurrency != Exclusive {
				bad.add("%s ran as %s, want exclusive", o.OrderID, meta.Concurrency)
			}
			kt.start(meta.Key)
			var err error
			first[me].Do(func() {
				select {
				case <-claimed[1-me]:
				case <-ctx.Done():
					err = ctx.Err()
				}
			})
			work()
			kt.stop(meta.Key, o, err == nil)
			return err
		}
	}
	consume(t, c, h(0), opts(0))
	consume(t, c, h(1), opts(1))
	within(t, kt.done, "every keyed message")
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Zero(t, kt.overlaps, "two messages of one exclusive key ran at once")
	require.Positive(t, c.Stats().Deferred, "an instance found keys busy and parked messages")
}

func TestOrderedKeysRunInPositionOrderEvenWhenAnEarlierMessageRetries(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	const n, keys = 60, 3
	_, err := s.ProduceBatch(context.Background(), keyedBatch(n, keys), &BatchOptions{Message: &MessageOptions{
		Concurrency: Ordered, Retry: &RetryPolicy{BaseDelay: time.Millisecond}}})
	require.NoError(t, err)
	reg, err := s.Consumer("g").Register(context.Background(), &ConsumerConfig{ExceptionInitialBackoff: 5 * time.Millisecond})
	require.NoError(t, err)
	kt := newKeyTracker(n)
	var mu sync.Mutex
	failedOnce := map[string]bool{}
	h := func(ctx context.Context, o *order) error {
		meta, _ := MetaFromContext(ctx)
		kt.start(meta.Key)
		work()
		mu.Lock()
		fail := o.Amount%7 == 1 && !failedOnce[o.OrderID]
		failedOnce[o.OrderID] = true
		mu.Unlock()
		kt.stop(meta.Key, o, !fail)
		if fail {
			return errors.New("transient")
		}
		return nil
	}
	opts := &ConsumeOptions{BatchLimit: 10, MessageConcurrency: 4, ClaimPollRate: 5 * time.Millisecond}
	consume(t, reg, h, opts)
	consume(t, reg, h, opts)
	within(t, kt.done, "every ordered message")
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Zero(t, kt.overlaps)
	for key, got := range kt.order {
		for i := 1; i < len(got); i++ {
			require.Less(t, got[i-1], got[i], "key %s ran out of order: %v", key, got)
		}
	}
	require.Positive(t, reg.Stats().Failed)
	_, _ = e, c
}

// An exclusive key held for one range is shared with the instance's next
// range: the later messages queue behind the running one instead of being
// parked as exception rows, they run one at a time in claim order, and the
// lease row stays until the last range using it commits.
func TestExclusiveKeyIsSharedAcrossAnInstancesRanges(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	_, err := s.ProduceBatch(ctx, keyedBatch(20, 2), &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.NoError(t, err)
	leaseRows := func() (n int, tokens int) {
		require.NoError(t, st.e.pool.QueryRow(ctx, fmt.Sprintf(
			"SELECT count(*), count(DISTINCT token) FROM %s.stream_%d_key_lease WHERE group_id = $1 AND message_key <> ''",
			st.e.client.Schema(), st.c.group.StreamID), st.c.group.ID).Scan(&n, &tokens))
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
		var o order
		require.NoError(t, json.Unmarshal(j.Delivery.Msg.Payload, &o))
		ran = append(ran, o.Amount)
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
	require.Zero(t, st.e.exceptions(st.c))
}

// An ordered key's parked rows run as a chain: one exception claim leases the
// head and queues the rest behind it; each success starts the next row and
// hands it the key lease without another claim; a failure gives the rest of
// the chain back to pending, and a chain whose holder dies lapses without
// charging an attempt to rows that never started.
func TestOrderedChainRunsInOneClaimAndBreaksOnFailure(t *testing.T) {
	failOnce := map[string]bool{"m-0": true, "m-5": true}
	st, s := newStepper(t, &ConsumerConfig{ExceptionInitialBackoff: time.Second}, func(o *order, attempt int) error {
		if failOnce[o.OrderID] {
			delete(failOnce, o.OrderID)
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	_, err := s.ProduceBatch(ctx, keyedBatch(10, 1), &BatchOptions{Message: &MessageOptions{Concurrency: Ordered}})
	require.NoError(t, err)
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
		require.NoError(t, st.e.pool.QueryRow(ctx, fmt.Sprintf(
			`SELECT l.token::text, x.token::text FROM %[1]s.stream_%[2]d_key_lease l, %[1]s.stream_%[2]d_exception x
WHERE l.group_id = $1 AND l.message_key <> '' AND x.group_id = $1 AND x.message_id = $2`, st.e.client.Schema(), st.c.group.StreamID),
			st.c.group.ID, id).Scan(&leaseToken, &rowToken))
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
