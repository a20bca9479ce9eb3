package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// A claimer that panics keeps what it has settled: the handlers already
// running finish, their outcomes and those waiting are applied and recorded,
// and the restarted claimer's reclaim delivers nothing twice. Before, every
// restart ran its in-flight ranges again whole (most of the chaos run's
// duplicates came from actor panics).
func TestAClaimerPanicKeepsWhatItSettled(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	e.produceN(s, "m", 10)
	release := make(chan struct{})
	var finished atomic.Int32 // handlers of m-1 … m-9 returned
	var armed, fired atomic.Bool
	var mu sync.Mutex
	runs := map[string]int{}
	done := make(chan string, 64)
	restarted := e.logs.Next("actor panicked; restarting")
	h := func(ctx context.Context, o *order) error {
		mu.Lock()
		runs[o.OrderID]++
		mu.Unlock()
		if o.OrderID == "m-0" && !fired.Load() {
			<-release // it runs while its range's other messages settle, and past the panic
		} else if finished.Add(1) == 9 {
			armed.Store(true)
		}
		done <- o.OrderID
		return nil
	}
	b := consume(t, c, h, &ConsumeOptions{BatchLimit: 10, QueueSize: 20, MessageConcurrency: 10,
		test: &hooks.Hooks{Step: func(site hooks.Site) error {
			if site == hooks.ClaimerClaim && armed.Load() && fired.CompareAndSwap(false, true) {
				close(release)
				hooks.Inject(site) // the claimer panics with its range in flight
			}
			return nil
		}}})
	for range 10 {
		within(t, done, "each message handled")
	}
	within(t, restarted, "the claimer's restart")
	e.produceN(s, "after", 1)
	require.Equal(t, "after-0", within(t, done, "a message produced after the restart"))
	require.NoError(t, b.stop(t))
	mu.Lock()
	defer mu.Unlock()
	for id, n := range runs {
		require.Equal(t, 1, n, "%s ran %d times", id, n)
	}
	require.Len(t, runs, 11)
	require.Empty(t, e.leases(c))
}

// successObserver signals each handler attempt the claimer has applied as a
// success (the observer hears of it after the outcome is in the actor's
// state).
type successObserver struct {
	NopObserver
	ok chan struct{}
}

func (o *successObserver) AttemptDone(a AttemptEvent) {
	if a.Outcome == OutcomeSuccess {
		o.ok <- struct{}{}
	}
}

// A lapsed incarnation records what it had settled before it stops (where
// its lease is still its own: the write is fenced by the range's token), so
// the next incarnation (or another instance) delivers only what had not
// settled. Before, a lapse dropped every outcome not yet recorded, and a
// restart of PostgreSQL that outlasted the TTL ran them all again. The
// same holds when the row that lapses is the session's other worker's (its
// exception worker): the session registers both again, and before, the
// range claimer, whose own row was still live, stopped as if killed and
// dropped what it had settled (the chaos run's "abandoned" repeats under a
// graceful session).
func TestALapsedIncarnationRecordsWhatItSettled(t *testing.T) {
	for _, worker := range []string{store.WorkerMessageConsumer, store.WorkerExceptionConsumer} {
		t.Run(worker, func(t *testing.T) {
			obs := &successObserver{ok: make(chan struct{}, 64)}
			e, s, c := setup(t, &ClientConfig{Observer: obs}, "g", 0)
			e.produceN(s, "m", 10)
			ctx := context.Background()
			runs := newHeldM0()
			h := runs.handle
			b := consume(t, c, h, &ConsumeOptions{BatchLimit: 10, QueueSize: 20, MessageConcurrency: 10, InstanceTTL: 3 * time.Second,
				ClaimPollRate: time.Hour}) // no flush tick: nothing is recorded unless the lapse records it
			within(t, b.id, "the first incarnation")
			for range 9 {
				within(t, obs.ok, "m-1 … m-9 settled in the claimer")
			}
			// The incarnation lapses (a stall, a partition): a row
			// expires, and the next renewal finds it lapsed. Once the
			// session has stopped that incarnation and registers again,
			// its range lease is expired too, so the next incarnation
			// reclaims the range.
			lapsed := e.logs.Next("instance lapsed")
			tag, err := e.pool.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s.worker_instance w SET expires_at = '-infinity'
FROM %[1]s.worker_config wc WHERE wc.id = w.worker_config_id AND wc.consumer_group_id = $1 AND wc.name = $2`, e.client.Schema()), c.group.ID, worker)
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected(), "the session's %s row", worker)
			within(t, lapsed, "the lapse")
			_, err = e.pool.Exec(ctx, fmt.Sprintf("UPDATE %s.stream_%d_range SET expires_at = '-infinity'", e.client.Schema(), c.group.StreamID))
			require.NoError(t, err)
			within(t, obs.ok, "m-0, run again by the next incarnation")
			require.NoError(t, b.stop(t))
			requireEachOnce(t, &runs.mu, runs.succeeded, 10)
			require.Empty(t, e.leases(c))
		})
	}
}

// A session stopped while PostgreSQL is down cannot hand its ranges back.
// The consumer's next session in this process records what their handlers
// had settled and releases the rest, so nothing that succeeded runs again.
// Before, every message of those ranges ran again once their leases lapsed
// (the chaos run's largest source of repeats: a session cancelled while
// PostgreSQL was down).
func TestTheNextSessionRecordsWhatAStoppedSessionCouldNotHandBack(t *testing.T) {
	skipOutageWhenShort(t)
	obs := &successObserver{ok: make(chan struct{}, 64)}
	e, s, c := setup(t, &ClientConfig{Observer: obs, Retry: Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}}, "g", 0)
	e.produceN(s, "m", 10)
	runs := newHeldM0()
	h := runs.handle
	opts := &ConsumeOptions{BatchLimit: 10, QueueSize: 20, MessageConcurrency: 10, InstanceTTL: 2 * time.Second,
		ShutdownTimeout: 200 * time.Millisecond, DisableManager: true,
		ClaimPollRate: time.Hour} // no flush tick: nothing is recorded before the stop
	first := consume(t, c, h, opts)
	within(t, first.id, "the first session")
	for range 9 {
		within(t, obs.ok, "m-1 … m-9 settled in the claimer")
	}
	start := pgtest.StopFor(t, "fast")
	require.NoError(t, first.stop(t), "the drain returns within its budget with the database down")
	require.Equal(t, 1, c.leftovers.Len(), "the range it could not hand back is left to the next session")
	start()

	second := consume(t, c, h, opts)
	within(t, obs.ok, "m-0, released by the second session and run again")
	require.NoError(t, second.stop(t))
	requireEachOnce(t, &runs.mu, runs.succeeded, 10)
	require.Zero(t, c.leftovers.Len())
	require.Empty(t, e.leases(c))
}

// The same for an exception row: a retry that succeeded while PostgreSQL
// was down, in a session stopped before the database came back, has its
// result written by the consumer's next session instead of running again
// when the row's lease lapses.
func TestTheNextSessionWritesAnExceptionResultAStoppedSessionCouldNot(t *testing.T) {
	skipOutageWhenShort(t)
	obs := &successObserver{ok: make(chan struct{}, 64)}
	e := newEnv(t, &ClientConfig{Observer: obs, Retry: Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}})
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(context.Background(), &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond,
		Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 5, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}}})
	require.NoError(t, err)
	e.produceN(s, "m", 1)
	retrying := make(chan struct{}, 1)
	release := make(chan struct{})
	var succeeded atomic.Int64
	h := func(ctx context.Context, o *order) error {
		meta, _ := MetaFromContext(ctx)
		if meta.Attempt == 1 {
			return errors.New("the first attempt fails")
		}
		retrying <- struct{}{}
		<-release // the database goes away while it runs
		succeeded.Add(1)
		return nil
	}
	opts := &ConsumeOptions{InstanceTTL: 2 * time.Second, ShutdownTimeout: 200 * time.Millisecond, DisableManager: true,
		ClaimPollRate: 20 * time.Millisecond}
	first := consume(t, c, h, opts)
	within(t, retrying, "the retry running")
	start := pgtest.StopFor(t, "fast")
	close(release)
	within(t, obs.ok, "the retry's success, whose write fails")
	require.NoError(t, first.stop(t), "the drain returns within its budget with the database down")
	require.Equal(t, 1, c.leftovers.Len(), "the row whose result could not be written is left to the next session")
	start()

	written := e.logs.Next("wrote the exception rows an earlier session of this consumer could not hand back")
	second := consume(t, c, h, opts)
	within(t, written, "the second session to write the result")
	g, err := e.client.Group(context.Background(), "orders", "g")
	require.NoError(t, err)
	st, err := g.Status(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Retrying, "the row is settled")
	require.Zero(t, st.Lag)
	require.Zero(t, c.leftovers.Len())
	require.NoError(t, second.stop(t))
	require.EqualValues(t, 1, succeeded.Load(), "the retry that succeeded is not run again")
}

// requireEachOnce checks, under mu, that n messages succeeded, each once.
// heldM0 is a handler that holds its first run of m-0 until its context
// ends (still running when the session stops, drains or loses its
// incarnation) and counts every success.
type heldM0 struct {
	mu        sync.Mutex
	succeeded map[string]int
	first     atomic.Bool
}

func newHeldM0() *heldM0 { return &heldM0{succeeded: map[string]int{}} }

func (h *heldM0) handle(ctx context.Context, o *order) error {
	if o.OrderID == "m-0" && h.first.CompareAndSwap(false, true) {
		<-ctx.Done()
		return ctx.Err()
	}
	h.mu.Lock()
	h.succeeded[o.OrderID]++
	h.mu.Unlock()
	return nil
}

func requireEachOnce(t *testing.T, mu *sync.Mutex, succeeded map[string]int, n int) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, succeeded, n)
	for id, k := range succeeded {
		require.Equal(t, 1, k, "%s succeeded %d times", id, k)
	}
}

// A session that takes another session's leftovers while the database is
// down gives them back when its write fails, so the session that reaches
// the database first writes them. Before, it kept them through its backoff
// (or until its own incarnation lapsed), and another instance could take
// their leases over first: the chaos run's "left, adopted, never written"
// repeats. Here the second adoption attempt is the proof: with the ranges
// kept, nothing is left to adopt again before the taker's lapse, minutes
// away.
func TestAnAdoptionTheDatabaseRefusesGoesBackToTheLeftovers(t *testing.T) {
	skipOutageWhenShort(t)
	obs := &successObserver{ok: make(chan struct{}, 64)}
	e, s, c := setup(t, &ClientConfig{Observer: obs, Retry: Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}}, "g", 0)
	e.produceN(s, "m", 10)
	runs := newHeldM0()
	first := consume(t, c, runs.handle, &ConsumeOptions{BatchLimit: 10, QueueSize: 20, MessageConcurrency: 10, InstanceTTL: 2 * time.Second,
		ShutdownTimeout: 200 * time.Millisecond, DisableManager: true,
		ClaimPollRate: time.Hour}) // no flush tick: nothing is recorded before the stop
	within(t, first.id, "the first session")
	for range 9 {
		within(t, obs.ok, "m-1 … m-9 settled in the first session's claimer")
	}
	adopted, begun := make(chan struct{}, 64), make(chan struct{}, 1)
	second := consume(t, c, runs.handle, &ConsumeOptions{InstanceTTL: 2 * time.Minute, ShutdownTimeout: 200 * time.Millisecond,
		DisableManager: true, ClaimPollRate: 20 * time.Millisecond, test: &hooks.Hooks{Trace: func(kind hooks.TraceKind, _ []int64) {
			ch := map[hooks.TraceKind]chan struct{}{hooks.TraceAdopted: adopted, hooks.TraceBegun: begun}[kind]
			select {
			case ch <- struct{}{}:
			default: // nil (another kind), or full
			}
		}}})
	within(t, begun, "the second session's claimer to begin (a begin that cannot reach the database adopts nothing)")

	start := pgtest.StopFor(t, "fast")
	require.NoError(t, first.stop(t), "the drain returns within its budget with the database down")
	within(t, adopted, "the second session to take the leftovers")
	within(t, adopted, "the second session to take them again: its failed write gave them back")
	start()

	within(t, obs.ok, "m-0, released by the second session and run again")
	require.NoError(t, second.stop(t))
	requireEachOnce(t, &runs.mu, runs.succeeded, 10)
	require.Zero(t, c.leftovers.Len())
	require.Empty(t, e.leases(c))
}
