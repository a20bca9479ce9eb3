package claimer_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// A producer transaction left open stalls delivery; the stall is logged with
// the blocking session and counted, and nothing is lost when it commits.
func TestOpenTransactionStallIsVisible(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := actortest.New(t, &actortest.Options{Clock: mock})
	s := e.Stream("orders", settings.Stream{})
	g := s.Group("g", groupconfig.Declared{})
	ctx := context.Background()

	tx1, err := e.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	_, err = tx1.Exec(ctx, "SET application_name = 'slow-producer'")
	require.NoError(t, err)
	s.ProduceIn(tx1, actortest.Msg{Payload: order{OrderID: "late"}})
	s.Produce(actortest.Orders("after", 3)...)

	cfg := common(e, g, mock, func(context.Context, *claimer.Delivery) error { return nil })
	stats := cfg.Stats
	cl := claimer.New(claimer.Config{Common: cfg, BatchLimit: 10, QueueSize: 20, StallAfter: 10 * time.Second})
	jobs, err := cl.Claim(ctx)
	require.NoError(t, err)
	require.Empty(t, jobs)
	mock.Add(5 * time.Second)
	_, err = cl.Claim(ctx)
	require.NoError(t, err)
	require.Zero(t, stats.Stalls.Load(), "not yet past StallAfter")
	mock.Add(6 * time.Second)
	_, err = cl.Claim(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, stats.Stalls.Load())
	rec, ok := e.Logs.Record("delivery stalled: committed messages wait behind an open transaction")
	require.True(t, ok)
	attrs := map[string]string{}
	rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	require.Equal(t, "slow-producer", attrs["blocker_application"])
	require.Equal(t, rec.Level, slog.LevelWarn)

	require.NoError(t, tx1.Commit(ctx))
	jobs, err = cl.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 4, "the late message and the ones behind it all arrive")
	_, ok = e.Logs.Record("delivery resumed after a stall")
	require.True(t, ok)
}

// A claim whose reply is lost (the connection dies after the commit) leaves
// a lease the claimer never learned of; its heartbeat would renew it
// forever. Reconcile lets go of it, and of key leases the claimer does not
// hold, and the messages are delivered.
func TestALostClaimReplyIsLetGo(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{ExceptionInitialBackoff: time.Millisecond}, func(o *order, attempt int) error {
		if o.OrderID == "x" && attempt == 1 {
			return errors.New("fails once")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Keyed(4, 2, exclusive)...)
	db := st.g.DB
	me := st.common.InstanceID
	args := store.ClaimParams{Owner: me, Limit: 10, Lease: time.Minute, Now: st.now()}
	lost, ok, err := db.ClaimRange(ctx, args) // the claimer never sees this reply
	require.NoError(t, err)
	require.True(t, ok)
	_, _, err = db.AcquireKeys(ctx, store.AcquireKeys{RangeID: lost.ID, Want: []store.KeyClaim{{Key: "k0"}, {Key: "k1"}},
		Token: lost.Token, Owner: me, TTL: time.Minute, Now: st.now()})
	require.NoError(t, err)

	require.Zero(t, st.claimRange(), "nothing new to claim, and the lost range is live")
	require.NoError(t, st.ranges.Reconcile(ctx))
	require.Equal(t, 4, st.claimRange(), "the let-go range is reclaimed and delivered")
	require.Zero(t, st.stats.Deferred.Load(), "its keys were released too")
	require.Empty(t, st.g.Leases())

	// The same for an exception claim whose reply was lost.
	st.s.Produce(actortest.Msg{Payload: order{OrderID: "x"}})
	require.Equal(t, 1, st.claimRange())
	st.mock.Add(time.Second)
	ex, exID := st.newExc()
	runs, err := db.ClaimExceptions(ctx, store.ClaimExceptions{Owner: exID, Limit: 10, Lease: time.Minute, Now: st.now()})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, "running", st.states()[0].Status)
	require.NoError(t, ex.Reconcile(ctx))
	xs := st.states()
	require.Len(t, xs, 1)
	require.Equal(t, "pending", xs[0].Status, "handed back")
	require.Equal(t, 1, xs[0].Attempts, "no attempt spent: it never ran")
	require.Equal(t, 1, st.retry(), "and it is retried")
	require.Empty(t, st.states())
}

// An instance whose own lease lapsed (its heartbeat failed while the
// database restarted) may reclaim its own range. What it still holds of the
// earlier incarnation — a commit that failed and waits for a retry, jobs
// whose outcomes arrive late — belongs to a lease that is gone: applied to
// the new incarnation they settled messages that had not run. The 30-minute
// chaos run lost five messages this way.
func TestAReclaimedRangeIsNeverSettledByItsEarlierIncarnation(t *testing.T) {
	failOnce := map[string]bool{"m-2": true}
	st := newStepper(t, groupconfig.Declared{}, func(o *order, attempt int) error {
		if failOnce[o.OrderID] {
			delete(failOnce, o.OrderID)
			return errors.New("transient")
		}
		return nil
	})
	ctx := context.Background()
	st.s.Produce(actortest.Keyed(5, 5, policy.Options{})...)
	lapse := st.expireRanges // the instance's own lease lapses
	ranges := func() (n int) {
		require.NoError(t, st.e.Pool.QueryRow(ctx, "SELECT count(*) FROM "+st.s.Table("range")).Scan(&n))
		return n
	}

	// A failed commit, retried after the instance reclaimed its own range.
	first, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, first, 5)
	down, cancel := context.WithCancel(ctx)
	cancel() // the database is unreachable when the range completes
	for _, j := range first {
		_, _ = st.ranges.Outcome(down, st.ranges.Run(ctx, j))
	}
	lapse()
	second, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, second, 5, "the same range, reclaimed under a new token")
	require.NoError(t, st.ranges.Flush(ctx))
	require.Equal(t, 1, ranges(), "the failed commit of the earlier incarnation must not settle the new one")

	// Late outcomes of an earlier incarnation whose low bound moved.
	for _, j := range second[:2] {
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.NoError(t, st.ranges.HandBack(ctx)) // m-0 and m-1 settled: lo moves past them
	third, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, third, 3)
	_, err = st.ranges.Outcome(ctx, st.ranges.Run(ctx, second[2]))
	require.NoError(t, err)
	require.Equal(t, 3, st.ranges.Queued(), "an outcome of the earlier incarnation settles nothing in the new one")
	for _, j := range third {
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.Zero(t, ranges())
	require.Empty(t, st.states(), "every message ran and succeeded; m-2 failed only in the dropped incarnation")
}

// A range commit whose outcome is unknown (its attempt failed without
// saying whether it applied, as when the reply is lost to a restart) is
// retried; when the retry finds the range row gone and no one holding it,
// the earlier attempt applied: the range is counted committed, and nothing
// claims it was lost to a reclaimer that delivers it again.
func TestACommitWhoseReplyWasLostIsNotReportedAsALostLease(t *testing.T) {
	st := newStepper(t, groupconfig.Declared{}, func(*order, int) error { return nil })
	ctx := context.Background()
	st.s.Produce(actortest.Orders("m", 3)...)
	jobs, err := st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 3)
	leases := st.g.Leases()
	require.Len(t, leases, 1)

	lost, cancel := context.WithCancel(ctx)
	cancel() // the commit's attempt fails without knowing whether it applied
	for _, j := range jobs {
		_, _ = st.ranges.Outcome(lost, st.ranges.Run(ctx, j))
	}
	require.Len(t, st.g.Leases(), 1, "the attempt failed")
	// What the lost attempt would have done on the server: the range,
	// committed under its own token.
	require.NoError(t, st.g.DB.CommitRange(ctx,
		store.RangeCommit{RangeID: leases[0].ID, Token: leases[0].Token, Now: st.now()}))

	require.NoError(t, st.ranges.Flush(ctx)) // the retry finds the range gone
	require.Zero(t, st.stats.LeasesLost.Load(), "no lease was lost")
	require.EqualValues(t, 1, st.stats.Committed.Load())
	require.Zero(t, st.ranges.Queued())
	for _, m := range st.e.Logs.Messages(slog.LevelWarn) {
		require.NotContains(t, m, "range lease lost", "nothing is delivered again")
	}
	_, ok := st.e.Logs.Record("range committed by an earlier attempt whose reply was lost")
	require.True(t, ok)

	// A range another instance took over is still reported as lost.
	st.s.Produce(actortest.Orders("n", 3)...)
	jobs, err = st.ranges.Claim(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 3)
	_, err = st.e.Pool.Exec(ctx, "UPDATE "+st.s.Table("range")+" SET token = gen_random_uuid()")
	require.NoError(t, err)
	for _, j := range jobs {
		_, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, st.stats.LeasesLost.Load())
	_, ok = st.e.Logs.Record("range lease lost before commit; a reclaimer delivers it again")
	require.True(t, ok)
}
