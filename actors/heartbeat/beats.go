package heartbeat

import (
	"context"
	"time"

	"github.com/c1702965/sqlstreams/internal/batch"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Beats renews the worker_instance rows of every heartbeat of a client in
// as few statements as it can (decision 0039): a heartbeat asks (Renew),
// and the beats' goroutine renews everything asked while its previous
// statement ran in one statement (store.RenewInstances). With heartbeats
// ticking at the same instants (batch.Aligned), a process of 500 sessions
// renews its 1,000 instance rows in one or two statements a beat, where
// each heartbeat sent its own.
//
// The goroutine is started by the first Join and stopped, and waited for,
// by the last leave. A heartbeat that stops waiting (its context ended)
// leaves its answer unread; the renewal itself is harmless.
type Beats struct {
	*batch.Batcher[ask, Renewal]
}

// MaxBeatBatch bounds the instances one statement renews.
const MaxBeatBatch = 5000

type ask struct {
	id     string
	worker int64 // its worker config: told when a peer of it lapsed
	ttl    time.Duration
}

// NewBeats returns a client's beats; nothing runs until Join. now is the
// statements' database time (engine.DBNow).
func NewBeats(st *store.Store, clk clocks.Clock, now func() store.Now) *Beats {
	renew := func(ctx context.Context, asks []ask) ([]Renewal, error) {
		rows := make([]store.InstanceRenewal, len(asks))
		var watch []int64
		seen := map[int64]bool{}
		bound := asks[0].ttl
		for i, a := range asks {
			rows[i] = store.InstanceRenewal{ID: a.id, TTL: a.ttl}
			bound = min(bound, a.ttl)
			if !seen[a.worker] {
				seen[a.worker] = true
				watch = append(watch, a.worker)
			}
		}
		sent := clk.Now()
		live, lapsed, err := st.RenewInstances(ctx, store.RenewInstancesParams{Instances: rows, Watch: watch, LapsedWithin: LapsedWindow * bound, Now: now()})
		if err != nil {
			return nil, err
		}
		out := make([]Renewal, len(asks))
		for i, a := range asks {
			out[i] = Renewal{Live: live[a.id], Sent: sent, PeerLapsed: lapsed[a.worker]}
		}
		return out, nil
	}
	// A statement's context is bounded by the shortest TTL of its batch: a
	// renewal that has not returned by then is too late anyway.
	bound := func(asks []ask) time.Duration {
		b := asks[0].ttl
		for _, a := range asks {
			b = min(b, a.ttl)
		}
		return b
	}
	return &Beats{batch.New(clk, MaxBeatBatch, renew, bound)}
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
func (b *Beats) Renew(ctx context.Context, id string, worker int64, ttl time.Duration) (Renewal, error) {
	return b.Do(ctx, ask{id: id, worker: worker, ttl: ttl})
}
