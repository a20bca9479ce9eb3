package heartbeat

import (
	"context"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Beats renews the worker_instance rows of every heartbeat of a client in
// as few statements as it can (decision 0039): a heartbeat asks (Renew),
// and the beats' goroutine renews everything asked while its previous
// statement ran in one statement (store.RenewInstances). With heartbeats
// ticking at the same instants (Aligned), a process of 500 sessions renews
// its 1,000 instance rows in one or two statements a beat, where each
// heartbeat sent its own.
//
// The goroutine is started by the first Join and stopped, and waited for,
// by the last leave. A heartbeat that stops waiting (its context ended)
// leaves its answer unread; the renewal itself is harmless.
type Beats struct {
	store *store.Store
	clock clock.Clock
	now   func() store.Now // the statements' database time (nil in production)

	mu     sync.Mutex
	refs   int
	asks   chan ask
	cancel context.CancelFunc
	done   chan struct{}
}

// MaxBeatBatch bounds the instances one statement renews.
const MaxBeatBatch = 5000

type ask struct {
	id     string
	worker int64 // its worker config: told when a peer of it lapsed
	ttl    time.Duration
	answer chan answer // buffered: the goroutine never waits on a reader
}

type answer struct {
	live bool
	// peerLapsed: an instance of the same worker lapsed lately (its
	// holder died or stalled): its leases are there to be taken over.
	peerLapsed bool
	sent       time.Time // when the statement was sent: the renewal's start
	err        error
}

// NewBeats returns a client's beats; nothing runs until Join. now is the
// statements' database time (engine.DBNow).
func NewBeats(st *store.Store, clk clock.Clock, now func() store.Now) *Beats {
	return &Beats{store: st, clock: clk, now: now}
}

// Join starts the beats' goroutine if it is the first, and returns the
// function that leaves (the last leave stops the goroutine and waits for it).
func (b *Beats) Join() (leave func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refs == 0 {
		ctx, cancel := context.WithCancel(context.Background())
		b.asks, b.cancel, b.done = make(chan ask, MaxBeatBatch), cancel, make(chan struct{})
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
			}
			b.mu.Unlock()
			if cancel != nil {
				cancel()
				<-done
			}
		})
	}
}

// Renewal is what Renew found.
type Renewal struct {
	// Live: the row was renewed; false means it lapsed or is gone (see
	// store.RenewInstance).
	Live bool
	// Sent is when the statement was sent: the renewed lease's start, for
	// Liveness.
	Sent time.Time
	// PeerLapsed: an instance of the same worker lapsed within the last
	// LapsedWindow TTLs: its leases are to be taken over (decision 0040).
	PeerLapsed bool
}

// LapsedWindow is, in TTLs, how long after an instance lapsed the
// heartbeats of its worker's other instances report it: long enough for
// several sweeps to take its leases over; later a quiet claimer's backstop
// sweep finds what is left.
const LapsedWindow = 3

// Renew renews instance id (of worker config worker) for ttl with whatever
// else is asked at the same time. The caller must have joined.
func (b *Beats) Renew(ctx context.Context, id string, worker int64, ttl time.Duration) (r Renewal, err error) {
	b.mu.Lock()
	asks := b.asks
	b.mu.Unlock()
	a := ask{id: id, worker: worker, ttl: ttl, answer: make(chan answer, 1)}
	select {
	case asks <- a:
	case <-ctx.Done():
		return Renewal{}, ctx.Err()
	}
	select {
	case r := <-a.answer:
		return Renewal{Live: r.live, Sent: r.sent, PeerLapsed: r.peerLapsed}, r.err
	case <-ctx.Done():
		return Renewal{}, ctx.Err()
	}
}

// run renews in batches until ctx ends. A statement's context is the
// goroutine's, bounded by the shortest TTL of its batch: a renewal that
// has not returned by then is too late anyway.
func (b *Beats) run(ctx context.Context, asks <-chan ask, done chan struct{}) {
	defer close(done)
	for {
		var batch []ask
		select {
		case <-ctx.Done():
			return
		case a := <-asks:
			batch = append(batch, a)
		}
	more:
		for len(batch) < MaxBeatBatch {
			select {
			case a := <-asks:
				batch = append(batch, a)
			default:
				break more
			}
		}
		ids, ttls := make([]string, len(batch)), make([]time.Duration, len(batch))
		var watch []int64
		seen := map[int64]bool{}
		bound := batch[0].ttl
		for i, a := range batch {
			ids[i], ttls[i] = a.id, a.ttl
			bound = min(bound, a.ttl)
			if !seen[a.worker] {
				seen[a.worker] = true
				watch = append(watch, a.worker)
			}
		}
		sctx, cancel := b.clock.WithTimeout(ctx, bound)
		sent := b.clock.Now()
		live, lapsed, err := b.store.RenewInstances(sctx, ids, ttls, watch, LapsedWindow*bound, b.now())
		cancel()
		for _, a := range batch {
			a.answer <- answer{live: live[a.id], peerLapsed: lapsed[a.worker], sent: sent, err: err}
		}
	}
}
