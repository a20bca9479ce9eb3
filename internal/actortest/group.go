package actortest

import (
	"context"
	"sync"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/stretchr/testify/require"
)

// Group is a registered consumer group.
type Group struct {
	env *Env
	// Stream is the group's stream.
	Stream *Stream
	// Row is the group's row: its id, its stream's, its workers' rows.
	Row store.GroupRow
	// DB is the group's handle on the store.
	DB store.Group

	mu       sync.Mutex
	declared groupconfig.Declared // the config last declared here
}

// Group registers the consumer group name on the stream as Consumer.Register
// does: the group's row and cursor (placed by cfg.Start, the beginning
// when unset), its config declared (newest wins), and one attempt at the
// binding declaration of patterns (none: the whole stream), which must not
// have to wait.
func (s *Stream) Group(name string, cfg groupconfig.Declared, patterns ...string) *Group {
	e := s.env
	e.T.Helper()
	start := cfg.Start
	if start == "" {
		start = store.StartBeginning
	}
	row, err := e.Store.RegisterGroup(context.Background(), s.Row.ID, name, start, e.Now())
	require.NoError(e.T, err)
	g := &Group{env: e, Stream: s, Row: row, DB: e.Store.Group(row.StreamID, row.ID)}
	g.Declare(cfg)
	res := g.DeclareBindings(patterns...)
	require.NotEqual(e.T, store.BindingWaiting, res.Outcome, "group %q's binding declaration waits", name)
	return g
}

// ID returns the group's id.
func (g *Group) ID() int64 { return g.Row.ID }

// StreamID returns the group's stream's id.
func (g *Group) StreamID() int64 { return g.Row.StreamID }

// Worker returns the id of the group's worker_config row of worker
// (store.WorkerMessageConsumer, store.WorkerExceptionConsumer).
func (g *Group) Worker(worker string) int64 { return g.Row.Workers[worker] }

// Declare declares the group's config again (newest wins), as a Register
// with another ConsumerConfig does.
func (g *Group) Declare(cfg groupconfig.Declared) {
	g.env.T.Helper()
	require.NoError(g.env.T, g.TryDeclare(cfg))
}

// TryDeclare is Declare for a goroutine other than the test's (a handler):
// it returns the error instead of failing the test.
func (g *Group) TryDeclare(cfg groupconfig.Declared) error {
	docs, err := cfg.Docs()
	if err != nil {
		return err
	}
	_, _, err = g.env.Store.DeclareGroupConfig(context.Background(), store.GroupConfigParams{GroupID: g.Row.ID, Docs: docs,
		DeclaredBy: DeclaredBy, Now: g.env.Now()})
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.declared = cfg
	g.mu.Unlock()
	return nil
}

// Policy is the group layer the claimers resolve messages against, of the
// config last declared here.
func (g *Group) Policy() policy.Group {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.declared.Group()
}

// DeclareBindings makes one attempt at declaring the binding set patterns
// (none: the whole stream), with no instance row, as Register does.
func (g *Group) DeclareBindings(patterns ...string) store.BindingResult {
	e := g.env
	e.T.Helper()
	set, regexes := Bindings(patterns...)
	res, err := g.DB.DeclareBindings(context.Background(), store.BindingRequest{Patterns: set, Regexes: regexes,
		DeclaredBy: DeclaredBy, Now: e.Now()})
	require.NoError(e.T, err)
	return res
}

// Bindings normalizes a binding set and translates each pattern for the
// database, as the public API does with a group's declared Bindings.
func Bindings(patterns ...string) (set, regexes []string) {
	set = topic.NormalizeSet(patterns)
	regexes = make([]string, len(set))
	for i, p := range set {
		c, _ := topic.Compile(p)
		regexes[i] = c.Regex()
	}
	return set, regexes
}

// States returns the group's exception rows, in log order.
func (g *Group) States() []store.ExceptionState {
	g.env.T.Helper()
	xs, err := g.DB.ExceptionStates(context.Background())
	require.NoError(g.env.T, err)
	return xs
}

// Leases returns the group's outstanding range leases.
func (g *Group) Leases() []store.Lease {
	g.env.T.Helper()
	l, err := g.DB.RangeLeases(context.Background())
	require.NoError(g.env.T, err)
	return l
}
