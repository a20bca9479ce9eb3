package heartbeat_test

import (
	"context"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/incarnation"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestMain starts the tests' PostgreSQL: the heartbeat's steps run against
// a real database (internal/actortest).
func TestMain(m *testing.M) { pgtest.Main(m) }

// The heartbeat's step registers the instance, renews it together with the
// instance's range leases, keeps the incarnation valid until its last
// renewal's send time + TTL - TTL/10, and refuses to renew a row that has
// lapsed: the incarnation is lost, and nothing is renewed or inserted again.
func TestHeartbeatStepRenewsLeasesAndReportsLoss(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := actortest.New(t, &actortest.Options{Clock: mock})
	s := e.Stream("orders", settings.Stream{})
	c := s.Group("g", groupconfig.Declared{})
	s.Produce(actortest.Orders("m", 3)...)
	ctx := context.Background()

	id := store.NewID()
	liveness := incarnation.NewLiveness(mock, 30*time.Second)
	hb := heartbeat.New(heartbeat.Config{
		Store: e.Store, StreamID: c.StreamID(), WorkerConfigID: c.Worker(store.WorkerMessageConsumer),
		InstanceID: id, DeclaredBy: actortest.DeclaredBy, TTL: 30 * time.Second, Clock: mock, Logger: e.Logger,
		DBNow: e.DBNow(), Liveness: liveness, Graceful: func() bool { return true },
	})
	require.Equal(t, 10*time.Second, hb.Interval())
	require.False(t, liveness.Valid(), "not valid before the row exists")
	t0 := mock.Now()
	require.NoError(t, hb.Step(ctx))
	require.Equal(t, t0.Add(27*time.Second), liveness.ValidUntil(), "TTL minus the 10% safety margin from when the insert was sent")
	live := func() int {
		n, err := storetest.LiveInstances(ctx, e.Store, c.Worker(store.WorkerMessageConsumer), e.Now())
		require.NoError(t, err)
		return n
	}
	require.Equal(t, 1, live())

	args := store.ClaimParams{Owner: id, Limit: 10, Lease: 30 * time.Second, Now: e.Now()}
	_, ok, err := c.DB.ClaimRange(ctx, args)
	require.NoError(t, err)
	require.True(t, ok)

	// 25s later a beat renews both; at 40s neither has lapsed.
	mock.Add(25 * time.Second)
	require.NoError(t, hb.Step(ctx))
	mock.Add(15 * time.Second)
	require.Equal(t, 1, live())
	other := args
	other.Owner, other.Now = store.NewID(), e.Now()
	_, ok, err = c.DB.ReclaimRange(ctx, other)
	require.NoError(t, err)
	require.False(t, ok, "a renewed lease is not reclaimable")

	require.True(t, liveness.Valid())
	require.Equal(t, t0.Add(52*time.Second), liveness.ValidUntil(), "renewed at 25s")

	// Without beats, both lapse; the incarnation stops being valid first.
	mock.Add(31 * time.Second)
	require.False(t, liveness.Valid(), "past the renewal's TTL minus the margin")
	require.Zero(t, live())
	other.Now = e.Now()
	_, ok, err = c.DB.ReclaimRange(ctx, other)
	require.NoError(t, err)
	require.True(t, ok, "a lapsed instance's range is reclaimed")

	// A renewal of the lapsed row is refused: the incarnation is lost, and
	// the heartbeat renews and inserts nothing more (the session registers
	// again through the registrar, under new ids).
	require.NoError(t, hb.Step(ctx))
	select {
	case <-liveness.C():
	default:
		t.Fatal("nothing reported")
	}
	require.True(t, liveness.Lost())
	require.True(t, hb.Lost())
	require.False(t, liveness.Valid())
	require.Zero(t, live(), "the lapsed row was not renewed")
	mock.Add(10 * time.Second)
	require.NoError(t, hb.Step(ctx))
	require.Zero(t, live(), "nor inserted again")
	require.False(t, liveness.Wait(ctx), "a lost incarnation starts nothing, and says so at once")
}

// A lease renewal never waits on a row lock. A heartbeat runs its beats and
// its lease renewals on one loop, so a renewal waiting on a row another
// transaction held (a commit not yet finished, an operator's transaction)
// held up the beat that would find the incarnation lapsed:
// TestTheNextIncarnationRecordsWhatALapsedOneCouldNot waited its minute for
// the lapse about half the time under -race. A locked row is skipped; the
// next renewal, a third of the TTL later, takes it.
func TestALeaseRenewalSkipsLockedRows(t *testing.T) {
	e := actortest.New(t, &actortest.Options{Clock: clocks.Real()})
	s := e.Stream("orders", settings.Stream{})
	c := s.Group("g", groupconfig.Declared{})
	ctx := context.Background()
	s.Produce(actortest.Orders("m", 4)...)
	db := c.DB
	owner := store.NewID()
	var ranges []store.Range
	for range 2 {
		r, ok, err := db.ClaimRange(ctx, store.ClaimParams{Owner: owner, Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)
		ranges = append(ranges, r)
	}
	// The other two messages become exception rows the owner leases.
	r, ok, err := db.ClaimRange(ctx, store.ClaimParams{Owner: owner, Limit: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, ok)
	writes := make([]store.ExceptionWrite, len(r.Messages))
	for i, m := range r.Messages {
		writes[i] = store.ExceptionWrite{Position: m.Position, Concurrency: "parallel", Status: "pending"}
	}
	require.NoError(t, db.CommitRange(ctx, store.RangeCommit{RangeID: r.ID, Token: r.Token, Exceptions: writes}))
	runs, err := db.ClaimExceptions(ctx, store.ClaimExceptions{Owner: owner, Limit: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, runs, 2)

	table := s.Table
	lock, err := e.Pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx)
	_, err = lock.Exec(ctx, "SELECT 1 FROM "+table("range")+" WHERE id = $1 FOR UPDATE", ranges[0].ID)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, "SELECT 1 FROM "+table("exception")+" WHERE message_id = $1 FOR UPDATE", runs[0].ID)
	require.NoError(t, err)

	// Renewed for an hour: a row the renewal took expires after 30 minutes.
	renewed := func() (rangesDone, exceptionsDone []bool) {
		rows, err := e.Pool.Query(ctx, "SELECT expires_at > now() + interval '30 minutes' FROM "+table("range")+" ORDER BY id")
		require.NoError(t, err)
		rangesDone, err = pgx.CollectRows(rows, pgx.RowTo[bool])
		require.NoError(t, err)
		rows, err = e.Pool.Query(ctx, "SELECT expires_at > now() + interval '30 minutes' FROM "+table("exception")+" ORDER BY message_id")
		require.NoError(t, err)
		exceptionsDone, err = pgx.CollectRows(rows, pgx.RowTo[bool])
		require.NoError(t, err)
		return rangesDone, exceptionsDone
	}
	for _, kinds := range []store.LeaseKinds{store.RangeLeases, store.ExceptionLeases, store.AllLeases} {
		// A bound, not a wait: the renewal must not wait on the lock at all.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := e.Store.RenewLeases(rctx, store.RenewLeasesParams{Kinds: kinds, InstanceID: owner, StreamID: c.StreamID(), TTL: time.Hour})
		cancel()
		require.NoError(t, err, "kinds %v", kinds)
	}
	rs, xs := renewed()
	require.Equal(t, []bool{false, true}, rs, "the locked range skipped, the other renewed")
	require.Equal(t, []bool{false, true}, xs, "the locked exception row skipped, the other renewed")

	require.NoError(t, lock.Rollback(ctx))
	require.NoError(t, e.Store.RenewLeases(ctx, store.RenewLeasesParams{Kinds: store.AllLeases, InstanceID: owner, StreamID: c.StreamID(), TTL: time.Hour}))
	rs, xs = renewed()
	require.Equal(t, []bool{true, true}, rs)
	require.Equal(t, []bool{true, true}, xs)
}
