package actortest

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// CountingPool returns a pool on the tests' database whose statements a
// Counter counts (and can hold or fail), closed when t ends; the counter's
// Reached closes once the caller until has sent n statements.
func CountingPool(t testing.TB, until string, n int) (*pgxpool.Pool, *Counter) {
	t.Helper()
	counter := NewCounter(until, n)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, counter
}

// Counter counts the statements each store caller sends (the
// "-- store.Name" comment every statement starts with), and closes Reached
// once the caller named until has sent n.
type Counter struct {
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
	// that is already cancelled (FailNext).
	fail map[string]int
	// holds: a caller's statements wait at their start until the channel
	// closes (Hold).
	holds, holding map[string]chan struct{}
	// batches counts the batches sent, by their first statement's caller
	// (not in counts: a batch's statements are not counted one by one).
	batches map[string]int
}

// Hold makes caller name's statements wait before they are sent (and
// counted), until the returned release is called or their context ends;
// waiting closes when the first of them waits.
func (c *Counter) Hold(name string) (waiting <-chan struct{}, release func()) {
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

// FailNext makes caller name's next statement fail: it is sent with a
// context that is already cancelled, so pgx returns an error and the
// connection stays usable.
func (c *Counter) FailNext(name string) {
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
	snap chan map[string]int // At's: the counts then, instead of closing ch
}

// When returns a channel closed once caller name has sent n statements.
func (c *Counter) When(name string, n int) <-chan struct{} {
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

// At returns a channel that receives every caller's count at the moment
// caller name sends its n-th statement: what ran before it.
func (c *Counter) At(name string, n int) <-chan map[string]int {
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

// NewCounter returns a Counter whose Reached closes once caller until has
// sent n statements; install it as a pool's tracer (CountingPool does).
func NewCounter(until string, n int) *Counter {
	return &Counter{counts: map[string]int{}, items: map[string]int{}, first: map[string]time.Time{}, until: until, n: n, reached: make(chan struct{})}
}

// TraceQueryStart counts the statement by its caller, holds it while the
// caller is held, and fails it when its caller's next is to fail.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
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
		c.first[name] = clocks.Real().Now()
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
// statement is to fail (FailNext), else ctx. c.mu is held.
func (c *Counter) failLocked(ctx context.Context, name string) context.Context {
	if c.fail[name] == 0 {
		return ctx
	}
	c.fail[name]--
	failed, cancel := context.WithCancel(ctx)
	cancel()
	return failed
}

// TraceQueryEnd does nothing.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// waitHeld waits while caller name is held (Hold).
func (c *Counter) waitHeld(ctx context.Context, name string) {
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
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
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

// TraceBatchQuery does nothing.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// BatchesOf returns how many batches caller name's statements began.
func (c *Counter) BatchesOf(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.batches[name]
}

// ItemsOf returns the slice lengths counted for caller name so far.
func (c *Counter) ItemsOf(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.items[name]
}

// Snapshot returns every caller's count so far.
func (c *Counter) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.copyLocked()
}

func (c *Counter) copyLocked() map[string]int {
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// Reached returns the channel closed once the caller named until has sent n
// statements.
func (c *Counter) Reached() <-chan struct{} { return c.reached }

// First returns when caller name first sent a statement (zero: never, or
// not since Forget).
func (c *Counter) First(name string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first[name]
}

// Forget clears caller name's count and first statement's time, as if it
// had sent none.
func (c *Counter) Forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.counts, name)
	delete(c.first, name)
}
