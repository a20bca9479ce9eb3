package sqlstreams

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/outage"
)

// Readiness is the readiness level of the Consume sessions it is handed to
// (ConsumeOptions.Readiness), for an orchestrator's readiness probe. It is a
// level, not a one-shot: ready while every such session consumes (its
// binding set is in force and its actors run) and reaches its database;
// not ready while a session waits on a binding change, once a store call
// has failed and none has succeeded for its InstanceTTL (within that of an
// outage's start, as its heartbeat calls every third of it; and after such
// an outage until a heartbeat finds the session's instance row live, or the
// session registers again: the level does not turn ready and back while a
// lapsed incarnation is found out), and once its Consume has returned. A Readiness no session was handed to is not ready.
// A nil *Readiness is valid and ignored.
type Readiness struct {
	once  sync.Once
	first chan struct{} // closed the first time the level turns ready

	mu       sync.Mutex
	sessions map[*outage.Health]func() // each attached session and its unwatch
	changed  chan struct{}             // closed and replaced at each possible change
}

// NewReadiness returns a not-ready signal.
func NewReadiness() *Readiness {
	return &Readiness{first: make(chan struct{}), sessions: map[*outage.Health]func(){}, changed: make(chan struct{})}
}

// attach adds a session's health; detach removes it.
func (r *Readiness) attach(h *outage.Health) (detach func()) {
	if r == nil {
		return func() {}
	}
	unwatch := h.Watch(r.notify)
	r.mu.Lock()
	r.sessions[h] = unwatch
	r.mu.Unlock()
	r.notify()
	return func() {
		r.mu.Lock()
		if f, ok := r.sessions[h]; ok {
			f()
			delete(r.sessions, h)
		}
		r.mu.Unlock()
		r.notify()
	}
}

// notify wakes Changed's waiters and records the first time it is ready.
func (r *Readiness) notify() {
	if r.Ready() {
		r.once.Do(func() { close(r.first) })
	}
	r.mu.Lock()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// Ready reports the level now.
func (r *Readiness) Ready() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sessions) == 0 {
		return false
	}
	for h := range r.sessions {
		if !h.Ready() {
			return false
		}
	}
	return true
}

// Changed returns a channel closed at the next moment the level may have
// changed: read Ready again then.
func (r *Readiness) Changed() <-chan struct{} {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Done is closed the first time the level turns ready (a session began to
// consume). It stays closed: use Ready and Changed for the level.
func (r *Readiness) Done() <-chan struct{} {
	if r == nil {
		return nil
	}
	return r.first
}

// Wait blocks until the level is ready or ctx ends.
func (r *Readiness) Wait(ctx context.Context) error {
	for {
		ch := r.Changed()
		if r.Ready() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Handler serves a readiness probe: 200 while ready, 503 otherwise.
func (r *Readiness) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if r.Ready() {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: not consuming, or the database has been unreachable for longer than InstanceTTL\n"))
	})
}

// WedgedAfter is how long a session's claim loop may stay inside one step
// (a claim, a settlement, a flush) before the liveness probe calls the
// process wedged. A database outage does not wedge anything: store calls
// fail and the loops keep turning, backing off. The bound is long because a
// statement may wait for a row lock that long before the process is truly
// stuck; an orchestrator that restarts on it restarts a process no longer
// doing its work.
const WedgedAfter = 5 * time.Minute

// Live reports whether no session handed this Readiness has a claim loop
// stuck in one step for longer than WedgedAfter. Unlike Ready it never
// depends on the database, and a Readiness with no session is live.
func (r *Readiness) Live() bool {
	_, ok := r.wedged()
	return !ok
}

func (r *Readiness) wedged() (string, bool) {
	if r == nil {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for h := range r.sessions {
		if key, since, ok := h.Wedged(WedgedAfter); ok {
			return key + " busy since " + since.UTC().Format(time.RFC3339), true
		}
	}
	return "", false
}

// LiveHandler serves a liveness probe (/livez): 200 unless a claim loop is
// wedged (see Live), 503 naming it then. Wire it to Kubernetes'
// livenessProbe and Handler to its readinessProbe (README, Monitoring).
func (r *Readiness) LiveHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if what, wedged := r.wedged(); wedged {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("wedged: " + what + "\n"))
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("live\n"))
	})
}
