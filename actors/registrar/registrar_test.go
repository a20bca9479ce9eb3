package registrar_test

import (
	"context"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// TestMain starts the tests' PostgreSQL: the registrar's steps run against
// a real database (internal/actortest).
func TestMain(m *testing.M) { pgtest.Main(m) }

// incumbent stands for a live instance of another process: its binding
// attempt (which inserts its instance row) and its heartbeat, stepped by
// the test.
type incumbent struct {
	reg *registrar.Actor
	hb  *heartbeat.Actor
	id  string
}

func newIncumbent(t *testing.T, e *actortest.Env, g *actortest.Group, patterns []string) (*incumbent, store.BindingResult) {
	t.Helper()
	const ttl = 30 * time.Second
	set, rx := actortest.Bindings(patterns...)
	id := store.NewID()
	wid := g.Worker(store.WorkerMessageConsumer)
	in := &incumbent{id: id}
	in.reg = registrar.New(registrar.Config{Store: e.Store, StreamID: g.StreamID(), GroupID: g.ID(),
		GroupName: g.Row.Name, Patterns: set, Regexes: rx, DeclaredBy: "incumbent:" + id[:8],
		Instances: []store.InstanceInsert{{ID: id, WorkerConfigID: wid, TTL: ttl}},
		Interval:  10 * time.Second, Clock: e.Clock, Logger: e.Logger, DBNow: e.DBNow()})
	res, err := in.reg.Step(context.Background())
	require.NoError(t, err)
	in.hb = heartbeat.New(heartbeat.Config{Store: e.Store, StreamID: g.StreamID(), WorkerConfigID: wid,
		InstanceID: id, DeclaredBy: "incumbent", TTL: ttl, Clock: e.Clock, Logger: e.Logger,
		DBNow: e.DBNow(), Graceful: func() bool { return true }, Registered: true})
	return in, res
}

// ledger returns the group's newest installed set and how many waiting rows
// its ledger holds.
func ledger(t *testing.T, e *actortest.Env, g *actortest.Group) (installed []string, waitingRows int) {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(),
		"SELECT status, patterns FROM "+g.Stream.Table("binding_declaration")+" WHERE group_id = $1 ORDER BY id", g.ID())
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var status string
		var p []string
		require.NoError(t, rows.Scan(&status, &p))
		if status == "installed" {
			installed = p
		} else {
			waitingRows++
		}
	}
	require.NoError(t, rows.Err())
	return installed, waitingRows
}

// Two divergent apps on one group: the first registered set stays, the
// second waits for as long as the first lives. (How the public listing
// shows the waiter, waiting and then stale:
// TestABindingWaiterThatStoppedRetryingIsListedStale, in the root package.)
func TestDivergentAppsFirstWinsUntouched(t *testing.T) {
	mock := clocks.NewMock()
	e := actortest.New(t, &actortest.Options{Clock: mock})
	ctx := context.Background()
	s := e.Stream("orders", settings.Stream{})
	c := s.Group("g", groupconfig.Declared{}, "a.#")
	first, res := newIncumbent(t, e, c, []string{"a.#"})
	require.Equal(t, store.BindingJoined, res.Outcome)
	second, res := newIncumbent(t, e, c, []string{"b.#"})
	require.Equal(t, store.BindingWaiting, res.Outcome)
	for range 100 {
		mock.Add(10 * time.Second)
		require.NoError(t, first.hb.Step(ctx))
		res, err := second.reg.Step(ctx)
		require.NoError(t, err)
		require.Equal(t, store.BindingWaiting, res.Outcome)
		require.Equal(t, []string{"a.#"}, res.Installed)
	}
	installed, _ := ledger(t, e, c)
	require.Equal(t, []string{"a.#"}, installed)

	inst, waits, err := c.DB.BindingLedger(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a.#"}, inst.Patterns)
	require.Len(t, waits, 1, "one waiter")
	require.Equal(t, []string{"b.#"}, waits[0].Patterns)
	require.True(t, mock.Now().Equal(waits[0].AttemptAt), "its newest attempt is the last step's, %s", waits[0].AttemptAt)
}
