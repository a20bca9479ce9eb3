package sqlstreams

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// callerCounter counts the statements each store caller sends (the
// "-- store.Name" comment every statement starts with), and closes reached
// once the caller named until has sent n.
type callerCounter struct {
	mu     sync.Mutex
	counts map[string]int
	// items adds up, per caller, the length of each statement's first
	// argument when it is a slice: the rows a batched statement carries.
	items   map[string]int
	first   map[string]time.Time // when each caller first sent a statement
	until   string
	n       int
	reached chan struct{}
	waits   []countWait
	// fail: the next statements of each caller to fail, with a context
	// that is already cancelled (failNext).
	fail map[string]int
	// holds: a caller's statements wait at their start until the channel
	// closes (hold).
	holds, holding map[string]chan struct{}
	// batches counts the batches sent, by their first statement's caller
	// (not in counts: a batch's statements are not counted one by one).
	batches map[string]int
}

// hold makes caller name's statements wait before they are sent (and
// counted), until the returned release is called or their context ends;
// waiting closes when the first of them waits.
func (c *callerCounter) hold(name string) (waiting <-chan struct{}, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holds == nil {
		c.holds, c.holding = map[string]chan struct{}{}, map[string]chan struct{}{}
	}
	ch, w := make(chan struct{}), make(chan struct{})
	c.holds[name], c.holding[name] = ch, w
	var once sync.Once
	return w, func() {
		once.Do(func() {
			c.mu.Lock()
			delete(c.holds, name)
			c.mu.Unlock()
			close(ch)
		})
	}
}

// failNext makes caller name's next statement fail: it is sent with a
// context that is already cancelled, so pgx returns an error and the
// connection stays usable.
func (c *callerCounter) failNext(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail == nil {
		c.fail = map[string]int{}
	}
	c.fail[name]++
}

type countWait struct {
	name string
	n    int
	ch   chan struct{}
	snap chan map[string]int // at's: the counts then, instead of closing ch
}

// when returns a channel closed once caller name has sent n statements.
func (c *callerCounter) when(name string, n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	if c.counts[name] >= n {
		close(ch)
		return ch
	}
	c.waits = append(c.waits, countWait{name: name, n: n, ch: ch})
	return ch
}

// at returns a channel that receives every caller's count at the moment
// caller name sends its n-th statement: what ran before it.
func (c *callerCounter) at(name string, n int) <-chan map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan map[string]int, 1)
	if c.counts[name] >= n {
		ch <- c.copyLocked()
		return ch
	}
	c.waits = append(c.waits, countWait{name: name, n: n, snap: ch})
	return ch
}

func newCallerCounter(until string, n int) *callerCounter {
	return &callerCounter{counts: map[string]int{}, items: map[string]int{}, first: map[string]time.Time{}, until: until, n: n, reached: make(chan struct{})}
}

func (c *callerCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name, ok := strings.CutPrefix(d.SQL, "-- ")
	if !ok {
		return ctx
	}
	name, _, _ = strings.Cut(name, "\n")
	if !strings.HasPrefix(name, "store.") {
		return ctx // a migration's comment
	}
	c.waitHeld(ctx, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[name]++
	if len(d.Args) > 0 {
		if v := reflect.ValueOf(d.Args[0]); v.Kind() == reflect.Slice {
			c.items[name] += v.Len()
		}
	}
	if c.counts[name] == 1 {
		c.first[name] = time.Now()
	}
	if name == c.until && c.counts[name] == c.n {
		close(c.reached)
	}
	kept := c.waits[:0]
	for _, w := range c.waits {
		if w.name == name && c.counts[name] >= w.n {
			if w.snap != nil {
				w.snap <- c.copyLocked()
			} else {
				close(w.ch)
			}
			continue
		}
		kept = append(kept, w)
	}
	c.waits = kept
	return c.failLocked(ctx, name)
}

// failLocked returns a context already cancelled when caller name's next
// statement is to fail (failNext), else ctx. c.mu is held.
func (c *callerCounter) failLocked(ctx context.Context, name string) context.Context {
	if c.fail[name] == 0 {
		return ctx
	}
	c.fail[name]--
	failed, cancel := context.WithCancel(ctx)
	cancel()
	return failed
}

func (c *callerCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// waitHeld waits while caller name is held (hold).
func (c *callerCounter) waitHeld(ctx context.Context, name string) {
	c.mu.Lock()
	held := c.holds[name]
	if w := c.holding[name]; held != nil && w != nil {
		close(w)
		delete(c.holding, name)
	}
	c.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
		}
	}
}

// TraceBatchStart applies hold and failNext to a batch by its first
// statement's caller (store.AcquireKeys sends a batch); batches are not
// counted.
func (c *callerCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if d.Batch == nil || len(d.Batch.QueuedQueries) == 0 {
		return ctx
	}
	name, ok := strings.CutPrefix(d.Batch.QueuedQueries[0].SQL, "-- ")
	if !ok {
		return ctx
	}
	name, _, _ = strings.Cut(name, "\n")
	c.waitHeld(ctx, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.batches == nil {
		c.batches = map[string]int{}
	}
	c.batches[name]++
	return c.failLocked(ctx, name)
}

func (c *callerCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *callerCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// batchesOf returns how many batches caller name's statements began.
func (c *callerCounter) batchesOf(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.batches[name]
}

// itemsOf returns the slice lengths counted for caller name so far.
func (c *callerCounter) itemsOf(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.items[name]
}

func (c *callerCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.copyLocked()
}

func (c *callerCounter) copyLocked() map[string]int {
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// While the client's listener is down (NoListener: no hub), an idle
// instance that polls faster than MinSweep reads new positions at
// every poll, but looks for expired leases, probes the gate and claims
// exception rows at most every MinSweep: those statements are a poll's
// most expensive (the exception claim visits every key with unresolved
// rows), and under a 20 ms poll they were most of a loaded server's work.
// Idle, the sweep is its probe alone, and the exception claimer asks
// whether anything is due before it claims: the claims cost most of an
// idle session's server CPU in planning.
func TestAFastPollSweepsAtMostEveryMinSweep(t *testing.T) {
	ctx := context.Background()
	const poll = 10 * time.Millisecond
	// Two seconds of polls: the first TakeoverGrace after the session
	// begins (1 s at the default InstanceTTL) looks for no expired lease.
	const polls = 200
	client, counter := countingClient(t, "store.ClaimRange", polls)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, func(context.Context, *order) error { return nil }, &ConsumeOptions{ClaimPollRate: poll,
			test: &hooks.Hooks{NoListener: true}})
	}()
	within(t, counter.reached, "200 polls of an idle instance")
	cancel()
	require.NoError(t, within(t, done, "Consume to return"))

	got := counter.snapshot()
	claims := got["store.ClaimRange"]
	t.Logf("statements of an idle instance polling every %s: %v", poll, got)
	// MinSweep/poll = 10 polls per sweep; a fifth leaves room for the
	// sweep at the start and for ticks a loaded runner coalesces.
	bound := claims / 5
	require.GreaterOrEqual(t, claims, polls)
	// An idle sweep looks for expired leases with its probe, and reclaims
	// only when the probe finds one.
	require.Positive(t, got["store.GateProbe"], "expired leases are still looked for")
	// (That the sweep reclaims nothing for TakeoverGrace after the session
	// begins: TestASessionThatBeginsTakesNoExpiredLeaseOverForTakeoverGrace.)
	require.LessOrEqual(t, got["store.ReclaimRange"], bound, "the look for expired leases runs at most every MinSweep (%s)", claimer.MinSweep)
	require.LessOrEqual(t, got["store.GateProbe"], bound, "the gate probe runs at most every MinSweep")
	require.Positive(t, got["store.ClaimExceptions"]+got["store.ExceptionsDue"], "exception rows are still looked for")
	require.LessOrEqual(t, got["store.ClaimExceptions"]+got["store.ExceptionsDue"], bound, "an exception claimer with nothing due looks at most every MinSweep")
	require.LessOrEqual(t, got["store.ClaimExceptions"], 1, "and, after a claim that found nothing, asks whether anything is due before it claims")
}

// A busy claimer's sweep (its last claim found positions, so it has no gate
// probe) looks for a lapsed lease with one small statement, and reclaims
// only when the look finds one: the reclaim is as costly to plan as the
// claim, and over 1,000 streams most calls plan their statement afresh
// (decision 0042).
func TestABusyClaimersSweepLooksBeforeItReclaims(t *testing.T) {
	ctx := context.Background()
	client, counter := countingClient(t, "", 0)
	e := &env{t: t, client: client, logs: newSink(t)}
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	e.produceN(s, "m", 30)
	handler := func(context.Context, *claimer.Delivery) error { return nil }
	cfgA := e.common(c, clock.New(), handler)
	a := claimer.New(claimer.Config{Common: cfgA, BatchLimit: 10, QueueSize: 100, StallAfter: time.Hour})

	for i := range 2 {
		jobs, err := a.Claim(ctx) // each Claim sweeps (no TakeoverGrace for the step functions)
		require.NoError(t, err)
		require.Len(t, jobs, 10, "claim %d", i+1)
	}
	got := counter.snapshot()
	require.Equal(t, 2, got["store.ClaimRange"])
	require.Equal(t, 2, got["store.LeasesExpired"], "each sweep looked for a lapsed lease")
	require.Zero(t, got["store.ReclaimRange"], "and, finding none, reclaimed nothing")

	// A's leases lapse: B's sweep finds one and takes it over.
	require.NoError(t, storetest.ExpireInstanceLeases(ctx, client.store, cfgA.InstanceID, c.group.StreamID))
	cfgB := e.common(c, clock.New(), handler)
	b := claimer.New(claimer.Config{Common: cfgB, BatchLimit: 10, QueueSize: 100, StallAfter: time.Hour})
	jobs, err := b.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 10, "a lapsed range of A's")
	require.EqualValues(t, 1, cfgB.Stats.Reclaimed.Load())
	got = counter.snapshot()
	require.Equal(t, 3, got["store.LeasesExpired"])
	require.Equal(t, 1, got["store.ReclaimRange"])
	require.Equal(t, 2, got["store.ClaimRange"], "the reclaim's range came first")
}
