package actortest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/c1702965/sqlstreams/internal/codes"
)

// Logs is a slog.Handler that keeps records for assertions and can signal
// when a message is logged. Every WARN or ERROR it receives must carry a
// registered code (internal/codes), and every actor panic it hears of
// (SQL0401) must have been injected by a test hook (hooks.Inject): NewLogs
// fails the test otherwise.
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
	waiters map[string]chan struct{}
	uncoded []string
	panics  []string
}

// NewLogs returns a sink that fails t, when t ends, if any WARN or ERROR
// line lacked a registered code or an actor panicked uninjected.
func NewLogs(t testing.TB) *Logs {
	s := &Logs{}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, m := range s.uncoded {
			t.Errorf("logged without a registered code: %s", m)
		}
		for _, m := range s.panics {
			t.Errorf("an actor panicked, and no test hook injected it: %s", m)
		}
	})
	return s
}

// Enabled takes every level.
func (s *Logs) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns the sink itself: records are kept as logged.
func (s *Logs) WithAttrs([]slog.Attr) slog.Handler { return s }

// WithGroup returns the sink itself.
func (s *Logs) WithGroup(string) slog.Handler { return s }

// Handle keeps r, notes a WARN or ERROR without a registered code and an
// actor panic no hook injected, and signals Next's waiters.
func (s *Logs) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Level >= slog.LevelWarn {
		code := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "code" {
				code = a.Value.String()
				return false
			}
			return true
		})
		if _, ok := codes.Lookup(code); !ok || code == "" {
			s.uncoded = append(s.uncoded, r.Level.String()+" "+r.Message)
		}
		if code == codes.ActorPanicked.ID {
			var value, stack string
			r.Attrs(func(a slog.Attr) bool {
				switch a.Key {
				case "panic":
					value = a.Value.String()
				case "stack":
					stack = a.Value.String()
				}
				return true
			})
			if !strings.HasPrefix(value, "injected panic at ") {
				s.panics = append(s.panics, value+"\n"+stack)
			}
		}
	}
	s.records = append(s.records, r.Clone())
	for prefix, ch := range s.waiters {
		if strings.HasPrefix(r.Message, prefix) {
			close(ch)
			delete(s.waiters, prefix)
		}
	}
	return nil
}

// Next returns a channel closed by the next record whose message starts
// with prefix: a test signal for asynchronous work that logs.
func (s *Logs) Next(prefix string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters == nil {
		s.waiters = map[string]chan struct{}{}
	}
	ch, ok := s.waiters[prefix]
	if !ok {
		ch = make(chan struct{})
		s.waiters[prefix] = ch
	}
	return ch
}

// Messages returns the logged messages at level or above.
func (s *Logs) Messages(level slog.Level) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.records {
		if r.Level >= level {
			out = append(out, r.Message)
		}
	}
	return out
}

// Record returns the first record with msg.
func (s *Logs) Record(msg string) (slog.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if r.Message == msg {
			return r, true
		}
	}
	return slog.Record{}, false
}

// RecordsWith returns the messages of the records with the given code.
func (s *Logs) RecordsWith(code string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.records {
		found := false
		r.Attrs(func(a slog.Attr) bool {
			found = a.Key == "code" && a.Value.String() == code
			return !found
		})
		if found {
			out = append(out, r.Message)
		}
	}
	return out
}

// Records returns every record so far.
func (s *Logs) Records() []slog.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]slog.Record(nil), s.records...)
}
