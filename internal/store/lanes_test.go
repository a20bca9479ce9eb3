package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// laneSetup is planSetup's store with n lanes and its group's range
// claimer's handle in the first.
func laneSetup(t *testing.T, n int) (*Store, Group) {
	t.Helper()
	st, streamID, groupID := planSetup(t)
	st.SetLanes(n)
	return st, st.Group(streamID, groupID).InLane(false)
}

// backendPID runs a statement through q and returns the backend that ran it.
func backendPID(t *testing.T, q Querier) uint32 {
	t.Helper()
	var pid uint32
	require.NoError(t, q.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return pid
}

// While a consumer session runs, a lane keeps its connection from one
// statement to the next, so its streams keep to one backend; when the last
// session ends, the connection goes back to the pool (which could not close
// otherwise). With no session running a lane keeps nothing.
func TestALaneKeepsItsConnectionWhileASessionRuns(t *testing.T) {
	st, g := laneSetup(t, 2)
	l, db := g.lane, g.db()
	require.NotNil(t, l)

	backendPID(t, db)
	require.Nil(t, l.conn, "no session: the connection went back")

	// The pool has a connection idle besides the lane's.
	ctx := context.Background()
	c1, err := st.pool.Acquire(ctx)
	require.NoError(t, err)
	c2, err := st.pool.Acquire(ctx)
	require.NoError(t, err)
	c1.Release()
	c2.Release()
	end := st.Session()
	pid := backendPID(t, db)
	require.NotNil(t, l.conn, "a session runs and the pool has idle connections: kept")
	held := l.conn
	for range 5 {
		require.Equal(t, pid, backendPID(t, db), "the same backend")
		require.Same(t, held, l.conn)
	}
	endAnother := st.Session()
	end(ctx)
	require.Same(t, held, l.conn, "a session still runs")
	endAnother(ctx)
	require.Nil(t, l.conn, "the last session ended: back in the pool")
	require.Len(t, l.turn, 0)
	require.Equal(t, int32(0), st.pool.Stat().AcquiredConns(), "nothing is held")
}

// A lane gives its connection back when the pool has no other idle one,
// unless a statement of its own waits for it.
func TestALaneGivesItsConnectionBackWhenThePoolRunsShort(t *testing.T) {
	ctx := context.Background()
	st, g := laneSetup(t, 1)
	l := g.lane
	defer st.Session()(context.Background())
	// Take every other connection the pool has.
	var taken []interface{ Release() }
	defer func() {
		for _, c := range taken {
			c.Release()
		}
	}()
	c, done, err := l.acquire(ctx, true)
	require.NoError(t, err)
	for int(st.pool.Stat().TotalConns()) < int(st.pool.Config().MaxConns) || st.pool.Stat().IdleConns() > 0 {
		o, err := st.pool.Acquire(ctx)
		require.NoError(t, err)
		taken = append(taken, o)
	}
	l.waiting.Add(1) // a statement of the lane waits
	done()
	require.Same(t, c, l.conn, "kept for the lane's own waiting statement")
	l.waiting.Add(-1)
	_, done, err = l.acquire(ctx, true)
	require.NoError(t, err)
	done()
	require.Nil(t, l.conn, "the pool has nothing idle and nothing of the lane waits: given back")
}

// A lane keeps its connection while none other is idle but the pool can
// open another: whoever needs one gets a new one, and the lane's streams
// keep to their backend (a lane that gave its connection back under every
// burst had its streams' statements prepared and planned afresh on the next
// connection it took).
func TestALaneKeepsItsConnectionWhileThePoolCanOpenAnother(t *testing.T) {
	ctx := context.Background()
	pool := ownPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns, cfg.MinConns = 4, 0 })
	st, streamID, groupID := planSetupOn(t, pool)
	st.SetLanes(1)
	g := st.Group(streamID, groupID).InLane(false)
	l := g.lane
	defer st.Session()(context.Background())
	c, done, err := l.acquire(ctx, true)
	require.NoError(t, err)
	// Every other connection the pool holds is taken: none is idle.
	var taken []*pgxpool.Conn
	defer func() {
		for _, o := range taken {
			o.Release()
		}
	}()
	for pool.Stat().IdleConns() > 0 {
		o, err := pool.Acquire(ctx)
		require.NoError(t, err)
		taken = append(taken, o)
	}
	require.Less(t, pool.Stat().TotalConns(), pool.Stat().MaxConns(), "the pool has room for another")
	done()
	require.Same(t, c, l.conn, "kept: the pool can open another")
	pid := backendPID(t, g.db())
	require.Equal(t, pid, backendPID(t, g.db()), "the lane's statements keep to one backend")
}

// A connection that broke is given back (and closed by the pool), never kept
// for the next statement.
func TestALaneGivesABrokenConnectionBack(t *testing.T) {
	ctx := context.Background()
	st, g := laneSetup(t, 1)
	l := g.lane
	c, done, err := l.acquire(ctx, true)
	require.NoError(t, err)
	require.NoError(t, c.Conn().Close(ctx))
	defer st.Session()(context.Background())
	done()
	require.Nil(t, l.conn, "even while a session runs")

	var one int
	require.NoError(t, g.db().QueryRow(ctx, "SELECT 1").Scan(&one), "the next statement takes a sound connection")
	require.Equal(t, 1, one)
}

// Every way a statement ends (rows read, closed early, no row, an error, a
// batch) ends the lane's turn, so the next statement runs.
func TestEveryStatementEndsItsLanesTurn(t *testing.T) {
	ctx := context.Background()
	_, g := laneSetup(t, 1)
	l, db := g.lane, g.db()
	free := func(what string) {
		t.Helper()
		require.Len(t, l.turn, 0, "%s: the turn ended", what)
	}

	rows, err := db.Query(ctx, "SELECT generate_series(1, 3)")
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 3, n)
	free("rows read")
	rows.Close()
	free("rows read, then closed")

	rows, err = db.Query(ctx, "SELECT generate_series(1, 3)")
	require.NoError(t, err)
	require.True(t, rows.Next())
	rows.Close()
	free("rows closed early")

	var v int
	require.ErrorIs(t, db.QueryRow(ctx, "SELECT 1 WHERE false").Scan(&v), pgx.ErrNoRows)
	free("no row")

	var pgErr interface{ SQLState() string }
	err = db.QueryRow(ctx, "SELECT 1/0").Scan(&v)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "22012", pgErr.SQLState())
	free("an error")

	_, err = db.Exec(ctx, "SELECT no_such_column")
	require.Error(t, err)
	free("a failed Exec")

	var b pgx.Batch
	b.Queue("SELECT 1")
	b.Queue("SELECT 2")
	br := db.SendBatch(ctx, &b)
	require.NoError(t, br.QueryRow().Scan(&v))
	require.Equal(t, 1, v)
	require.NoError(t, br.Close())
	free("a batch")
}

// A statement whose context ends while it waits for the lane returns the
// context's error, and the lane goes on.
func TestAStatementWaitingForItsLaneHonoursItsContext(t *testing.T) {
	ctx := context.Background()
	_, g := laneSetup(t, 1)
	l := g.lane
	_, done, err := l.acquire(ctx, true) // the turn is taken
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	var v int
	require.ErrorIs(t, g.db().QueryRow(cctx, "SELECT 1").Scan(&v), context.Canceled)
	require.ErrorIs(t, g.db().SendBatch(cctx, &pgx.Batch{}).Close(), context.Canceled)
	require.Equal(t, int32(0), l.waiting.Load())
	done()
	require.NoError(t, g.db().QueryRow(ctx, "SELECT 1").Scan(&v))
	require.Equal(t, 1, v)
}

// Without lanes a group's statements take whatever the pool gives. Range
// claimers take the lanes in turn from the first, exception claimers from
// the last: a session's two claimers do not share a lane when there are two.
func TestClaimersTakeTheLanesInTurn(t *testing.T) {
	st, streamID, groupID := planSetup(t)
	g := st.Group(streamID, groupID)
	require.Nil(t, g.InLane(false).lane, "no lanes")
	require.Same(t, st.pool, g.InLane(false).db())
	st.SetLanes(3)
	for _, exceptions := range []bool{false, true} {
		var got []*lane
		for range 6 {
			got = append(got, g.InLane(exceptions).lane)
		}
		for i, l := range got {
			want := st.lanes.lanes[i%3]
			if exceptions {
				want = st.lanes.lanes[2-i%3]
			}
			require.Same(t, want, l, "exception claimers %v, claimer %d", exceptions, i)
		}
	}
	require.Same(t, st.laneOf("x"), st.laneOf("x"), "an instance's renewals keep to one lane")
	require.NotNil(t, st.laneOf("x"))
}

// appPlanMode is the plan_cache_mode the generic-plan tests' application
// sets on each of its connections (not the server's default, which a RESET
// would restore): what the lane must give back.
const appPlanMode = "force_custom_plan"

// genericLaneSetup is laneSetup on a pool of the test's own whose
// connections start with appPlanMode, a session running (end ends it) and
// the pool holding connections idle besides the lane's.
func genericLaneSetup(t *testing.T) (g Group, pool *pgxpool.Pool, end func()) {
	t.Helper()
	ctx := context.Background()
	pool = ownPool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET plan_cache_mode = "+appPlanMode)
			return err
		}
	})
	st, streamID, groupID := planSetupOn(t, pool)
	st.SetLanes(1)
	endSession := st.Session()
	end = sync.OnceFunc(func() { endSession(context.Background()) })
	t.Cleanup(end)
	c1, err := pool.Acquire(ctx)
	require.NoError(t, err)
	c2, err := pool.Acquire(ctx)
	require.NoError(t, err)
	c1.Release()
	c2.Release()
	return st.Group(streamID, groupID).InLane(false), pool, end
}

// planMode is plan_cache_mode on the connection q gives.
func planMode(t *testing.T, q Querier) string {
	t.Helper()
	var mode string
	require.NoError(t, q.QueryRow(context.Background(), "SELECT current_setting('plan_cache_mode')").Scan(&mode))
	return mode
}

// takeIdle acquires connections until the pool has none idle and cannot
// open more; release gives them back.
func takeIdle(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	var taken []*pgxpool.Conn
	for pool.Stat().IdleConns() > 0 || pool.Stat().TotalConns() < pool.Config().MaxConns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		taken = append(taken, c)
	}
	return func() {
		for _, c := range taken {
			c.Release()
		}
	}
}

// appModes checks every connection of the pool for the application's own
// plan_cache_mode and returns their backends.
func appModes(t *testing.T, pool *pgxpool.Pool) map[uint32]bool {
	t.Helper()
	ctx := context.Background()
	pids := map[uint32]bool{}
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range pool.Stat().IdleConns() {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
		var mode string
		var pid uint32
		require.NoError(t, c.QueryRow(ctx, "SELECT current_setting('plan_cache_mode'), pg_backend_pid()").Scan(&mode, &pid))
		require.Equal(t, appPlanMode, mode, "backend %d", pid)
		pids[pid] = true
	}
	return pids
}

// A lane plans its statements generically on a connection it keeps
// (decision 0052): a stream's statement is not planned afresh for each of its
// first five executions on a backend.
func TestALaneRunsItsStatementsWithGenericPlans(t *testing.T) {
	ctx := context.Background()
	g, _, _ := genericLaneSetup(t)
	require.Equal(t, appPlanMode, planMode(t, g.db()), "the first statement runs as the connection came")
	require.Equal(t, "force_generic_plan", planMode(t, g.db()), "then the lane has switched it")
	for range 3 {
		_, err := g.GateProbe(ctx, nil)
		require.NoError(t, err)
	}
	var generic, custom int64
	require.NoError(t, g.db().QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_catalog.pg_prepared_statements
WHERE statement LIKE '-- store.GateProbe%'`).Scan(&generic, &custom))
	require.Equal(t, [2]int64{3, 0}, [2]int64{generic, custom}, "every execution ran the generic plan")
}

// The exception claimer's statements run with the connection's own
// plan_cache_mode even in a lane that switched to generic plans: the
// exception claim's generic plan is not its custom one (decision 0052).
func TestAnExceptionClaimersStatementsRunWithoutGenericPlans(t *testing.T) {
	g, _, _ := genericLaneSetup(t)
	ex := g.st.Group(g.StreamID, g.GroupID).InLane(true)
	require.Same(t, g.lane, ex.lane, "one lane: the two claimers share it")
	planMode(t, g.db())
	require.Equal(t, "force_generic_plan", planMode(t, g.db()))
	pid := backendPID(t, g.db())
	require.Equal(t, appPlanMode, planMode(t, ex.db()), "put back for the exception claimer's statement")
	require.Equal(t, appPlanMode, planMode(t, ex.db()))
	require.Equal(t, pid, backendPID(t, ex.db()), "on the same connection")
	planMode(t, g.db())
	require.Equal(t, "force_generic_plan", planMode(t, g.db()), "and switched again for the range claimer's")
	require.Equal(t, appPlanMode, planMode(t, ex.db()))
}

// The application's connections never carry the lane's setting: a lane that
// gives a connection back restores the connection's own value first (not the
// server's default a RESET would give).
func TestALaneGivesItsConnectionBackWithItsOwnPlanMode(t *testing.T) {
	g, pool, _ := genericLaneSetup(t)
	l := g.lane
	backendPID(t, g.db())
	require.Equal(t, "force_generic_plan", planMode(t, g.db()))
	pid := backendPID(t, g.db())

	release := takeIdle(t, pool) // the pool runs short: the next statement gives the connection back
	backendPID(t, g.db())
	require.Nil(t, l.conn, "given back")
	release()
	require.True(t, appModes(t, pool)[pid], "the lane's connection is back, restored, not closed")
}

// A connection whose restore cannot run is closed, so that the pool discards
// it: when the statement's context ended before the lane gave the connection
// back, and when the last session ends with its context done (a stop that
// was not graceful, or one past its deadline).
func TestALaneClosesAConnectionItCannotRestore(t *testing.T) {
	g, pool, _ := genericLaneSetup(t)
	l := g.lane
	require.Equal(t, appPlanMode, planMode(t, g.db()))
	require.NotEmpty(t, l.was, "switched")

	ctx, cancel := context.WithCancel(context.Background())
	c, done, err := l.acquire(ctx, true)
	require.NoError(t, err)
	pc := c.Conn().PgConn()
	release := takeIdle(t, pool)
	cancel()
	done()
	require.Nil(t, l.conn)
	require.True(t, pc.IsClosed(), "its statement's context ended: closed, not given back switched")
	release()
	appModes(t, pool)

	require.Equal(t, appPlanMode, planMode(t, g.db()))
	require.NotEmpty(t, l.was, "switched again")
	pc = l.conn.Conn().PgConn()
	ended, cancelEnd := context.WithCancel(context.Background())
	cancelEnd()
	g.st.lanes.endSession(ended)
	require.Nil(t, l.conn)
	require.True(t, pc.IsClosed(), "the last session ended with its context done: closed")
	appModes(t, pool)
}

// When the last session ends with time left, its lanes restore their
// connections' own plan_cache_mode and give them back to the pool instead of
// closing them: a process whose consumers stop and start again keeps the
// backends they warmed (caches, prepared statements, the shared buffers
// each backend has mapped; a fresh backend maps them again one page fault at
// a time, which cost a 4-instance burn-down a quarter of its server CPU on a
// host with slow page faults; decision 0052's amendment).
func TestTheLastSessionGivesItsLanesConnectionsBackRestored(t *testing.T) {
	g, pool, end := genericLaneSetup(t)
	l := g.lane
	backendPID(t, g.db()) // the lane's first statement: its connection switched after it
	require.Equal(t, "force_generic_plan", planMode(t, g.db()))
	pid := backendPID(t, g.db())
	pc := l.conn.Conn().PgConn()
	end()
	require.Nil(t, l.conn, "the last session ended: the lane holds nothing")
	require.False(t, pc.IsClosed(), "given back, not closed")
	require.Zero(t, pool.Stat().AcquiredConns(), "nothing is held")
	require.True(t, appModes(t, pool)[pid], "the lane's backend is in the pool with the application's plan_cache_mode")
}

// A session's occasional per-stream statements (the sweep look, the lease
// renewals, the reconcile's look and forget) run unprepared: over 1,000
// streams each call met a text new to its connection and cycled it through
// pgx's statement cache of 512 (decision 0061). They leave nothing prepared on
// the lane's connection, and the claim path's statements stay prepared.
func TestOccasionalStatementsRunUnprepared(t *testing.T) {
	ctx := context.Background()
	g, _, _ := genericLaneSetup(t)
	planMode(t, g.db())
	require.Equal(t, "force_generic_plan", planMode(t, g.db()))
	for range 2 {
		_, err := g.LeasesExpired(ctx, nil)
		require.NoError(t, err)
		_, _, err = g.ForgetUnknownRanges(ctx, ForgetRanges{Owner: "00000000-0000-0000-0000-000000000001"})
		require.NoError(t, err)
		_, err = g.GateProbe(ctx, nil)
		require.NoError(t, err)
	}
	st := g.st
	id := "00000000-0000-0000-0000-000000000002"
	for _, kinds := range []LeaseKinds{AllLeases, RangeLeases, ExceptionLeases} {
		require.NoError(t, st.RenewLeases(ctx, RenewLeasesParams{Kinds: kinds, InstanceID: id, StreamID: g.StreamID, TTL: time.Minute}))
	}
	rows, err := g.db().Query(ctx, `SELECT split_part(statement, E'\n', 1) FROM pg_catalog.pg_prepared_statements`)
	require.NoError(t, err)
	prepared, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, prepared, "-- store.GateProbe", "the claim path's statements are prepared")
	for _, p := range prepared {
		for _, occasional := range []string{"-- store.LeasesExpired", "-- store.RenewLeases", "-- store.ForgetUnknownRanges"} {
			require.False(t, strings.HasPrefix(p, occasional), "%s is prepared on the lane's connection", p)
		}
	}
}
