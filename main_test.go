package sqlstreams

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/codes"
	conformancecases "github.com/c1702965/sqlstreams/internal/conformance"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestMain starts the tests' PostgreSQL, and hands its URL to the runnable
// examples as SQLSTREAMS_DATABASE_URL (they import no test helper); their
// example_ schemas are dropped afterwards.
func TestMain(m *testing.M) { pgtest.MainExporting(m, "SQLSTREAMS_DATABASE_URL", "example_") }

// env is one test's client on its own schema.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	client *Client
	logs   *logSink
}

func newEnv(t *testing.T, cfg *ClientConfig) *env {
	t.Helper()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	sink := newSink(t)
	c := ClientConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	if c.Logger == nil {
		c.Logger = slog.New(sink)
	}
	client, err := NewClient(context.Background(), pool, &c)
	require.NoError(t, err)
	return &env{t: t, pool: pool, client: client, logs: sink}
}

// logSink is a slog.Handler that keeps records for assertions and can signal
// when a message is logged. Every WARN or ERROR it receives must carry a
// registered code (internal/codes), and every actor panic it hears of
// (SQL0401) must have been injected by a test hook (hooks.Inject): newSink
// fails the test otherwise.
type logSink struct {
	mu      sync.Mutex
	records []slog.Record
	waiters map[string]chan struct{}
	uncoded []string
	panics  []string
}

// newSink returns a sink that fails t, when t ends, if any WARN or ERROR
// line lacked a registered code.
func newSink(t *testing.T) *logSink {
	s := &logSink{}
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

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *logSink) WithGroup(string) slog.Handler            { return s }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
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

// next returns a channel closed by the next record whose message starts
// with prefix: a test signal for asynchronous work that logs.
func (s *logSink) next(prefix string) <-chan struct{} {
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

// messages returns the logged messages at level or above.
func (s *logSink) messages(level slog.Level) []string {
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

// record returns the first record with msg.
func (s *logSink) record(msg string) (slog.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if r.Message == msg {
			return r, true
		}
	}
	return slog.Record{}, false
}

// readConformance returns one of the conformance files: the repository's
// copy in testdata/conformance, which internal/conformance holds identical
// to ../shared/conformance whenever that folder is beside the checkout.
func readConformance(t *testing.T, name string) string {
	t.Helper()
	s, err := conformancecases.Read(name)
	require.NoError(t, err)
	return s
}

// conformance reads one of the conformance files: lines between bars,
// '#' comments skipped.
func conformance(t *testing.T, name string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(readConformance(t, name), "\n") {
		if strings.HasPrefix(line, "|") {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|"))
		}
	}
	require.NotEmpty(t, out)
	return out
}

// within fails the test if ch is not closed or sent on before a generous
// bound. It is a safety net against hangs, not a timing assertion.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// setup is the common fixture: a client on its own schema, the stream
// "orders", the group named group, and n messages "m-0".."m-<n-1>".
func setup(t *testing.T, cfg *ClientConfig, group string, n int) (*env, *StreamHandle[order], *Consumer[order]) {
	t.Helper()
	e := newEnv(t, cfg)
	s := e.stream("orders")
	c, err := s.Consumer(group).Register(context.Background(), nil)
	require.NoError(t, err)
	if n > 0 {
		e.produceN(s, "m", n)
	}
	return e, s, c
}

// common is an actor config for driving the claimers' step functions
// directly against c's group, with the group config cfg.
func (e *env) common(c *Consumer[order], clk clock.Clock, h claimer.Handler) claimer.Common {
	group := c.cfg.policyGroup()
	return claimer.Common{
		Store: e.client.store, StreamID: c.group.StreamID, GroupID: c.group.ID, InstanceID: engine.NewID(),
		Handler: h, Group: func() policy.Group { return group }, Concurrency: 4, PollRate: time.Second,
		Lease: time.Minute, KeyBusyDelay: 100 * time.Millisecond, TimeoutGrace: time.Second,
		ShutdownTimeout: func() time.Duration { return time.Second }, Clock: clk, Logger: slog.New(e.logs), DBNow: engine.DBNow(clk),
		Stats: &claimer.Stats{},
	}
}

// failures collects what goes wrong on goroutines other than the test's
// own (handlers, workers): require there would call FailNow off the test's
// goroutine and turn a failure into a hang or a timeout. check reports them
// on the test's goroutine; a cleanup checks again at the end.
type failures struct {
	mu   sync.Mutex
	list []string
}

func newFailures(t *testing.T) *failures {
	f := &failures{}
	t.Cleanup(func() { f.check(t) })
	return f
}

func (f *failures) add(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, fmt.Sprintf(format, args...))
}

// check fails t with every failure reported so far (once each).
func (f *failures) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.list {
		t.Error(m)
	}
	f.list = nil
}

// recordsWith returns the messages of the records with the given code.
func (s *logSink) recordsWith(code string) []string {
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

// snapshotRecords returns every record so far.
func (s *logSink) snapshotRecords() []slog.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]slog.Record(nil), s.records...)
}
