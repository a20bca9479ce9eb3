package claimer

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/store"
)

// A session's handler pool holds goroutines only as far as it has work: no
// worker before the first job, one for jobs that arrive one at a time, and
// its full size only when that many handlers run at once (1,000 sessions'
// idle workers were scanned at every garbage collection).
func TestThePoolStartsWorkersOnDemand(t *testing.T) {
	release := make(chan struct{})
	running := make(chan struct{}, 16)
	r := &runner{clock: clocks.Real(), grace: time.Second, stats: &Stats{},
		handler: func(ctx context.Context, d *Delivery) error {
			running <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}}
	r.generation()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const size = 4
	p := r.startPool(ctx, size, 16)
	defer p.stop()
	before := runtime.NumGoroutine()
	if p.started != 0 {
		t.Fatalf("a new pool started %d workers; want none before a job", p.started)
	}
	job := func(i int) Job {
		return Job{Ref: Ref{index: i}, Delivery: Delivery{Msg: &store.Message{}, Attempt: 1, Timeout: time.Hour}}
	}
	// One at a time: each job finishes before the next; one worker serves them.
	for i := range 3 {
		p.submit(job(i))
		<-running
		release <- struct{}{}
		<-p.out
	}
	if p.started != 1 {
		t.Fatalf("jobs one at a time started %d workers; want 1", p.started)
	}
	// size+2 at once, none finishing: size handlers run, two wait queued,
	// and no more than size workers start.
	for i := range size + 2 {
		p.submit(job(10 + i))
	}
	for range size { // blocks (until the test's timeout) if fewer than size handlers run at once
		<-running
	}
	if p.started != size {
		t.Fatalf("started %d workers; want the pool's size, %d", p.started, size)
	}
	if n := runtime.NumGoroutine() - before; n > 2*size {
		t.Fatalf("%d goroutines more than before the first job; want at most %d (a worker and its executor each)", n, 2*size)
	}
	close(release)
	for range size + 2 {
		<-p.out
	}
}
