package sqlstreams

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
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
	logs   *actortest.Logs
}

func newEnv(t *testing.T, cfg *ClientConfig) *env {
	t.Helper()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	sink := actortest.NewLogs(t)
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
func (e *env) common(c *Consumer[order], clk clocks.Clock, h claimer.Handler) claimer.Common {
	group := c.cfg.policyGroup()
	return claimer.Common{
		Store: e.client.store, StreamID: c.group.StreamID, GroupID: c.group.ID, InstanceID: engine.NewID(),
		Handler: h, Group: func() policy.Group { return group }, Concurrency: 4, PollRate: time.Second,
		Lease: time.Minute, KeyBusyDelay: 100 * time.Millisecond, TimeoutGrace: time.Second,
		ShutdownTimeout: func() time.Duration { return time.Second }, Clock: clk, Logger: slog.New(e.logs), DBNow: engine.DBNow(clk),
		Stats: &claimer.Stats{},
	}
}
