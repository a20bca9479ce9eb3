// Package batch runs many goroutines' requests as one: a Batcher's goroutine
// takes every request waiting and answers them all with one call (one
// statement). The client's heartbeats (heartbeat.Beats) and config reads
// (refresher.Reads) use it, so that a process of a thousand sessions sends
// one statement where each session sent its own.
//
// It is part of the engine's inside, not an API for users.
package batch

import (
	"context"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
)

// Batcher batches requests of type Q into calls of Do, answering each with
// its A. Its goroutine is started by the first Join and stopped, and waited
// for, by the last leave.
type Batcher[Q, A any] struct {
	clock clocks.Clock
	max   int
	do    func(ctx context.Context, qs []Q) ([]A, error)
	bound func(qs []Q) time.Duration

	mu     sync.Mutex
	refs   int
	asks   chan ask[Q, A]
	cancel context.CancelFunc
	done   chan struct{}
}

type ask[Q, A any] struct {
	q      Q
	answer chan answer[A] // buffered: the goroutine never waits on a reader
}

type answer[A any] struct {
	a   A
	err error
}

// New returns a batcher of at most max requests a call. do answers a
// batch (one answer per request, in order, or an error for all of them);
// bound is how long one call of do may take (its context's timeout).
func New[Q, A any](clk clocks.Clock, max int, do func(ctx context.Context, qs []Q) ([]A, error), bound func(qs []Q) time.Duration) *Batcher[Q, A] {
	return &Batcher[Q, A]{clock: clk, max: max, do: do, bound: bound}
}

// Join starts the goroutine if it is the first, and returns the function
// that leaves: the last leave stops the goroutine and waits for it.
func (b *Batcher[Q, A]) Join() (leave func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refs == 0 {
		ctx, cancel := context.WithCancel(context.Background())
		b.asks, b.cancel, b.done = make(chan ask[Q, A], b.max), cancel, make(chan struct{})
		go b.run(ctx, b.asks, b.done)
	}
	b.refs++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.refs--
			var cancel context.CancelFunc
			var done chan struct{}
			if b.refs == 0 {
				cancel, done = b.cancel, b.done
				b.asks = nil
			}
			b.mu.Unlock()
			if cancel != nil {
				cancel()
				<-done
			}
		})
	}
}

// Running reports whether the goroutine runs (someone has joined).
func (b *Batcher[Q, A]) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refs > 0
}

// Do has q answered with whatever else is asked meanwhile. The caller must
// have joined. A caller whose ctx ends stops waiting; its answer is dropped.
func (b *Batcher[Q, A]) Do(ctx context.Context, q Q) (A, error) {
	var zero A
	b.mu.Lock()
	asks := b.asks
	b.mu.Unlock()
	a := ask[Q, A]{q: q, answer: make(chan answer[A], 1)}
	select {
	case asks <- a:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case r := <-a.answer:
		return r.a, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// run answers batches until ctx ends: a batch is every request waiting
// when the goroutine turns to it, up to max.
func (b *Batcher[Q, A]) run(ctx context.Context, asks <-chan ask[Q, A], done chan struct{}) {
	defer close(done)
	for {
		var batch []ask[Q, A]
		select {
		case <-ctx.Done():
			return
		case a := <-asks:
			batch = append(batch, a)
		}
	more:
		for len(batch) < b.max {
			select {
			case a := <-asks:
				batch = append(batch, a)
			default:
				break more
			}
		}
		qs := make([]Q, len(batch))
		for i, a := range batch {
			qs[i] = a.q
		}
		cctx, cancel := b.clock.WithTimeout(ctx, b.bound(qs))
		as, err := b.do(cctx, qs)
		cancel()
		for i, a := range batch {
			var r answer[A]
			if r.err = err; err == nil {
				r.a = as[i]
			}
			a.answer <- r
		}
	}
}

// Aligned is how long until the next multiple of every on the clock (at
// least a tenth of every): actors that tick then meet in one batch.
func Aligned(clk clocks.Clock, every time.Duration) time.Duration {
	now := clk.Now()
	d := now.Truncate(every).Add(every).Sub(now)
	if d < every/10 {
		d += every
	}
	return d
}
