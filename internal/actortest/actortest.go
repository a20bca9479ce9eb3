// Package actortest is the harness of the actors' step-driven tests: a
// schema migrated on the tests' PostgreSQL (internal/pgtest), streams and
// consumer groups registered and declared through internal/store as the
// public API's Register does, messages produced through store.Produce, a
// mock clock that reaches the database (DBNow), a log sink that fails a
// test on an uncoded warning or a panic no hook injected (Logs), and a
// counter of each store caller's statements (Counter).
//
// It imports neither the root package nor an actor, so every actor's own
// tests can use it. It is a test helper, not an API for users: only tests
// import it.
package actortest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Epoch is where a new Env's mock clock starts.
var Epoch = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// DeclaredBy is the declarer the harness names in the rows it declares.
const DeclaredBy = "actortest"

// Options shape an Env; nil is the defaults.
type Options struct {
	// Clock is the Env's clock. nil: a mock set to Epoch. A real clock
	// (clocks.Real()) sends no time to the database: its statements use
	// now().
	Clock clocks.Clock
	// Pool is the pool the store runs on (one with a Counter as its
	// tracer, say). nil: a new pool on the tests' database.
	Pool *pgxpool.Pool
	// Schema is the schema to work in: another Env's, for a second process
	// of the same database. "": a new one, dropped when the test ends.
	Schema string
}

// Env is one test's store on its own migrated schema.
type Env struct {
	T     testing.TB
	Pool  *pgxpool.Pool
	Store *store.Store
	Clock clocks.Clock
	// Mock is Clock when it is a mock, else nil.
	Mock *clocks.Mock
	// Logs receives what Logger logs.
	Logs   *Logs
	Logger *slog.Logger
}

// New returns an Env: the schema migrated, its store's lanes as a client's
// by default (decision 0048), nothing registered.
func New(t testing.TB, opts *Options) *Env {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Clock == nil {
		m := clocks.NewMock()
		m.Set(Epoch)
		o.Clock = m
	}
	if o.Pool == nil {
		o.Pool = pgtest.Pool(t)
	}
	if o.Schema == "" {
		o.Schema = pgtest.Schema(t)
	}
	st, err := store.New(o.Pool, o.Schema)
	require.NoError(t, err)
	st.SetLanes(min(max(4, runtime.GOMAXPROCS(0)), int(o.Pool.Config().MaxConns)/2))
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
	logs := NewLogs(t)
	e := &Env{T: t, Pool: o.Pool, Store: st, Clock: o.Clock, Logs: logs, Logger: slog.New(logs)}
	e.Mock, _ = o.Clock.(*clocks.Mock)
	return e
}

// Schema returns the Env's schema.
func (e *Env) Schema() string { return e.Store.Schema() }

// DBNow returns the time the Env's statements send the database, as the
// engine's DBNow does: the mock clock's time, or nil (now()) for a real
// clock.
func (e *Env) DBNow() func() store.Now {
	if e.Mock == nil {
		return func() store.Now { return nil }
	}
	return func() store.Now { t := e.Mock.Now(); return &t }
}

// Now is DBNow's time now.
func (e *Env) Now() store.Now { return e.DBNow()() }

// Stream registers the stream name with config cfg, as Stream.Register
// does (creating its tables), and returns it.
func (e *Env) Stream(name string, cfg settings.Stream) *Stream {
	e.T.Helper()
	s := &Stream{env: e}
	s.Declare(name, cfg)
	return s
}

// Stream is a registered stream.
type Stream struct {
	env *Env
	Row store.StreamRow
}

// ID returns the stream's id.
func (s *Stream) ID() int64 { return s.Row.ID }

// Declare registers the stream name again with config cfg (newest wins).
func (s *Stream) Declare(name string, cfg settings.Stream) {
	s.env.T.Helper()
	doc, err := json.Marshal(cfg)
	require.NoError(s.env.T, err)
	s.Row, _, _, _, err = s.env.Store.RegisterStream(context.Background(), name, doc, DeclaredBy, s.env.Now())
	require.NoError(s.env.T, err)
}

// Table returns the stream's table name (log, range, exception,
// key_lease, ...), schema-qualified, for a test's own statements.
func (s *Stream) Table(name string) string { return s.env.Store.StreamTable(s.Row.ID, name) }

// Msg is a message to produce.
type Msg struct {
	// Payload is encoded as JSON.
	Payload                         any
	Key, RoutingKey, IdempotencyKey string
	// Options is the message's options document (the merged
	// MessageOptions of a produce); empty writes none.
	Options policy.Options
}

// Order is the tests' message: the root package's tests' order.
type Order struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

// Orders returns n unkeyed orders "<prefix>-0".."<prefix>-<n-1>", each with
// its index as its amount.
func Orders(prefix string, n int) []Msg {
	out := make([]Msg, n)
	for i := range out {
		out[i] = Msg{Payload: Order{OrderID: fmt.Sprintf("%s-%d", prefix, i), Amount: i}}
	}
	return out
}

// Keyed returns n orders "m-0".."m-<n-1>" (amount i) keyed "k<i%keys>",
// each with options o.
func Keyed(n, keys int, o policy.Options) []Msg {
	out := make([]Msg, n)
	for i := range out {
		out[i] = Msg{Payload: Order{OrderID: fmt.Sprintf("m-%d", i), Amount: i}, Key: fmt.Sprintf("k%d", i%keys), Options: o}
	}
	return out
}

// Produce writes msgs in one store.Produce (one transaction), in order.
func (s *Stream) Produce(msgs ...Msg) []store.Produced { return s.ProduceIn(nil, msgs...) }

// ProduceIn is Produce on the caller's transaction tx (nil: its own).
func (s *Stream) ProduceIn(tx pgx.Tx, msgs ...Msg) []store.Produced {
	s.env.T.Helper()
	out := make([]store.NewMessage, len(msgs))
	for i, m := range msgs {
		payload, err := json.Marshal(m.Payload)
		require.NoError(s.env.T, err)
		var opts []byte
		if m.Options != (policy.Options{}) {
			opts, err = json.Marshal(m.Options)
			require.NoError(s.env.T, err)
		}
		out[i] = store.NewMessage{Version: 1, RoutingKey: m.RoutingKey, Key: m.Key, IdempotencyKey: m.IdempotencyKey,
			Payload: payload, Options: opts}
	}
	var q store.Querier
	if tx != nil {
		q = tx
	}
	res, err := s.env.Store.Produce(context.Background(), q, store.StreamRef{ID: s.Row.ID, Name: s.Row.Name}, out, s.env.Now())
	require.NoError(s.env.T, err)
	return res
}
