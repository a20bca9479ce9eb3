package sqlstreams

import (
	"context"
	"net/http"
	"sync"
)

// Readiness reports whether a Consume session consumes. It turns ready when
// the session's binding set is in force and its actors run, and never while
// the session waits on a binding change: orchestrators should route a
// rollout's readiness probe to it. A nil *Readiness is valid and ignored.
type Readiness struct {
	once sync.Once
	ch   chan struct{}
}

// NewReadiness returns a not-ready signal.
func NewReadiness() *Readiness { return &Readiness{ch: make(chan struct{})} }

func (r *Readiness) set() {
	if r == nil {
		return
	}
	r.once.Do(func() { close(r.ch) })
}

// Ready reports whether the session consumes.
func (r *Readiness) Ready() bool {
	select {
	case <-r.ch:
		return true
	default:
		return false
	}
}

// Done is closed when the session becomes ready.
func (r *Readiness) Done() <-chan struct{} { return r.ch }

// Wait blocks until ready or ctx ends.
func (r *Readiness) Wait(ctx context.Context) error {
	select {
	case <-r.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Handler serves a readiness probe: 200 once ready, 503 before.
func (r *Readiness) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if r.Ready() {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: waiting to consume\n"))
	})
}
