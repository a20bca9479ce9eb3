package actortest

import (
	"fmt"
	"sync"
	"testing"
)

// Failures collects what goes wrong on goroutines other than the test's
// own (handlers, workers): require there would call FailNow off the test's
// goroutine and turn a failure into a hang or a timeout. Check reports them
// on the test's goroutine; a cleanup checks again at the end.
type Failures struct {
	mu   sync.Mutex
	list []string
}

// NewFailures returns a collector that t's cleanup checks.
func NewFailures(t testing.TB) *Failures {
	f := &Failures{}
	t.Cleanup(func() { f.Check(t) })
	return f
}

// Add records a failure, from any goroutine.
func (f *Failures) Add(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, fmt.Sprintf(format, args...))
}

// Check fails t with every failure reported so far (once each).
func (f *Failures) Check(t testing.TB) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.list {
		t.Errorf("%s", m)
	}
	f.list = nil
}
