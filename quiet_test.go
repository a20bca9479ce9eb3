package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// countingClient is a client whose pool counts the statements of each store
// caller (actortest.Counter) until `until` has sent n.
func countingClient(t *testing.T, until string, n int) (*Client, *actortest.Counter) {
	t.Helper()
	return countingClientIn(t, pgtest.Schema(t), until, n)
}

// countingClientIn is countingClient on a given schema: a second client
// (process) of the same schema.
func countingClientIn(t *testing.T, schema, until string, n int) (*Client, *actortest.Counter) {
	t.Helper()
	pool, counter := actortest.CountingPool(t, until, n)
	client, err := NewClient(context.Background(), pool, &ClientConfig{Schema: schema})
	require.NoError(t, err)
	return client, counter
}

// While the client's listener is up, an idle session skips its poll ticks
// (decision 0038): a produce wakes it, so a tick would find nothing. With
// the process's beats raising an alarm when a peer lapses (decision 0040),
// it skips its reconcile ticks' sweeps too, but for a backstop sweep every
// QuietSweepEvery ticks; it reconciles only after it took a lease, and its
// heartbeat renews leases only while it may hold some. A produce reaching
// it while it is quiet is delivered at once.
func TestAnIdleSessionIsQuietWhileItsListenerIsUp(t *testing.T) {
	ctx := context.Background()
	const poll = 10 * time.Millisecond
	const ttl = 1500 * time.Millisecond // a reconcile tick and two beats every 500 ms
	const quietSweeps = 6               // a backstop every 3 s (claimer.QuietSweepEvery in production)
	client, counter := countingClient(t, "", 0)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)

	handled := make(chan string, 16)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, func(_ context.Context, o *order) error { handled <- o.OrderID; return nil },
			&ConsumeOptions{ClaimPollRate: poll, InstanceTTL: ttl, test: &hooks.Hooks{QuietSweeps: quietSweeps}})
	}()
	// From the fourth heartbeat statement on (two beats of the session's
	// two heartbeats, one statement each or one for both: heartbeat.Beats)
	// the session is idle. Then sixteen more: four to eight seconds, at
	// least one backstop.
	within(t, counter.When("store.RenewInstances", 4), "four heartbeat statements")
	before, from := counter.Snapshot(), time.Now()
	within(t, counter.When("store.RenewInstances", before["store.RenewInstances"]+16), "sixteen more")
	elapsed := time.Since(from)
	got := counter.Snapshot()
	for k, v := range before {
		got[k] -= v
	}
	t.Logf("statements of an idle session over %s polling every %s: %v", elapsed.Round(time.Millisecond), poll, got)

	// Loud, it would sweep at every MinSweep (claimer.MinSweep): 10 a
	// second. Quiet, at the backstop alone.
	backstop := quietSweeps * ttl / 3
	sweeps := int(elapsed/backstop) + 1
	require.Positive(t, got["store.GateProbe"], "the backstop sweep still looks for lapsed leases")
	require.LessOrEqual(t, got["store.GateProbe"], sweeps, "a quiet range claimer probes only at the backstop")
	require.Zero(t, got["store.ClaimRange"]+got["store.ReclaimRange"], "and claims nothing it was not woken for")
	require.Positive(t, got["store.ExceptionsDue"]+got["store.ClaimExceptions"], "exception rows are still looked for")
	require.LessOrEqual(t, got["store.ExceptionsDue"]+got["store.ClaimExceptions"], sweeps, "a quiet exception claimer probes only at the backstop")
	require.Zero(t, got["store.ForgetUnknownRanges"], "a claimer that took no lease since its last reconcile skips it")
	require.Zero(t, got["store.ForgetUnknownRuns"], "the exception claimer too")
	require.Zero(t, got["store.RenewLeases"], "and the heartbeats renew no leases")

	// Woken while quiet: delivered without waiting for a sweep.
	before = counter.Snapshot()
	_, err = s.Produce(ctx, order{OrderID: "woken"}, nil)
	require.NoError(t, err)
	require.Equal(t, "woken", within(t, handled, "the produced message"))
	after := counter.Snapshot()
	require.Equal(t, before["store.ForgetUnknownRanges"], after["store.ForgetUnknownRanges"],
		"delivered before the next reconcile tick: the wake, not a sweep, claimed it")
	cancel()
	require.NoError(t, within(t, done, "Consume to return"))
}

// A quiet session still runs a retry when it falls due: the range claimer
// tells its exception claimer that it wrote the failure, the exception
// claimer's probe says when the row falls due, and the poll tick after that
// claims it. Without the listener's wake or the sweep (the first sweep comes
// InstanceTTL/3 = 10 s in), nothing else would.
func TestAQuietSessionRunsARetryWhenItFallsDue(t *testing.T) {
	ctx := context.Background()
	client, counter := countingClient(t, "", 0)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 200 * time.Millisecond})
	require.NoError(t, err)

	attempts := make(chan int32, 4)
	var n atomic.Int32
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, func(context.Context, *order) error {
			k := n.Add(1)
			attempts <- k
			if k == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		}, &ConsumeOptions{ClaimPollRate: 50 * time.Millisecond})
	}()
	// The exception claimer's first probe found nothing due: it is quiet.
	within(t, counter.When("store.ExceptionsDue", 1), "the exception claimer's first probe")
	_, err = s.Produce(ctx, order{OrderID: "m"}, nil)
	require.NoError(t, err)
	require.Equal(t, int32(1), within(t, attempts, "the first attempt"))
	require.Equal(t, int32(2), within(t, attempts, "the retry"))
	got := counter.Snapshot()
	require.Zero(t, got["store.ForgetUnknownRuns"], "the retry ran before the first reconcile tick: not found by the sweep")
	cancel()
	require.NoError(t, within(t, done, "Consume to return"))
}

// A client's heartbeats renew their instance rows together (decision 0039):
// they tick at the same instants, and heartbeat.Beats renews every row asked
// for while its previous statement ran in one statement. Twelve sessions
// (24 heartbeats) send one or two statements a beat (a few on a loaded
// machine), where each heartbeat sent its own; and every session stays
// live. Their config refreshes read together the same way
// (refresher.Reads).
func TestAClientsHeartbeatsRenewTogether(t *testing.T) {
	ctx := context.Background()
	const ttl = 3 * time.Second // a beat every second
	const sessions = 12
	client, counter := countingClient(t, "", 0)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, sessions)
	for i := range sessions {
		c, err := s.Consumer(fmt.Sprintf("g%d", i)).Register(ctx, nil)
		require.NoError(t, err)
		go func() {
			done <- c.Consume(cctx, func(context.Context, *order) error { return nil },
				&ConsumeOptions{InstanceTTL: ttl, ConfigRefreshInterval: time.Second})
		}()
	}
	// Every session has started (its first config read is its own) before
	// the baseline: on a loaded machine the last one may start after the
	// first beats.
	within(t, counter.When("store.ReadGroupConfig", sessions), "every session's first config read")
	within(t, counter.When("store.RenewInstances", 2), "the first beats")
	before := counter.Snapshot()
	rowsBefore, groupsBefore := counter.ItemsOf("store.RenewInstances"), counter.ItemsOf("store.ReadGroupConfigs")
	// Four more beats' worth: 4 × 24 heartbeats; as many refreshes.
	within(t, counter.When("store.RenewInstances", before["store.RenewInstances"]+4), "four more heartbeat statements")
	within(t, counter.When("store.ReadGroupConfigs", before["store.ReadGroupConfigs"]+4), "four more config reads")
	got := counter.Snapshot()
	renewals := got["store.RenewInstances"] - before["store.RenewInstances"]
	reads := got["store.ReadGroupConfigs"] - before["store.ReadGroupConfigs"]
	rows := counter.ItemsOf("store.RenewInstances") - rowsBefore
	groups := counter.ItemsOf("store.ReadGroupConfigs") - groupsBefore
	t.Logf("%d sessions: %d heartbeat statements renewing %d rows, %d config reads of %d groups", sessions, renewals, rows, reads, groups)
	// Together, a statement carries many sessions' rows: without the
	// aligned ticks each heartbeat's request would come alone (one row a
	// statement). The bound leaves room for a loaded machine splitting an
	// instant's requests over a few statements.
	require.GreaterOrEqual(t, rows, 3*renewals, "a heartbeat statement renews many sessions' rows (24 heartbeats a beat)")
	require.GreaterOrEqual(t, groups, 2*reads, "a config read reads many sessions' groups (12 a refresh)")
	require.Zero(t, got["store.RenewInstance"], "no heartbeat renews its row alone")
	require.Equal(t, before["store.ReadGroupConfig"], got["store.ReadGroupConfig"], "no running session reads its config alone")
	require.Equal(t, before["store.DeclareBindings"], got["store.DeclareBindings"],
		"no session lost its incarnation (a lost one registers again)")
	cancel()
	for range sessions {
		require.NoError(t, within(t, done, "Consume to return"))
	}
}

// A session that begins takes no expired lease over for TakeoverGrace
// (decision 0032): it may be starting right after an outage it never saw.
// Its first sweep probes at once (decision 0038: a listening claimer's
// probe runs during the grace, so that an idle one turns quiet), and
// reclaims only after the grace; with or without the listener.
func TestASessionThatBeginsTakesNoExpiredLeaseOverForTakeoverGrace(t *testing.T) {
	for name, hooks := range map[string]*hooks.Hooks{"listening": nil, "without the listener": {NoListener: true}} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			client, counter := countingClient(t, "", 0)
			e := &env{t: t, client: client, logs: actortest.NewLogs(t)}
			s := e.stream("orders")
			c, err := s.Consumer("g").Register(ctx, nil)
			require.NoError(t, err)
			// A dead instance's range of three messages, its lease lapsed.
			e.produceN(s, "m", 3)
			dead := claimer.New(claimer.Config{Common: e.common(c, clocks.Real(), func(context.Context, *claimer.Delivery) error { return nil }),
				BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
			jobs, err := dead.Claim(ctx)
			require.NoError(t, err)
			require.Len(t, jobs, 3)
			_, err = client.store.Pool().Exec(ctx, fmt.Sprintf(`UPDATE %s.stream_%d_range SET expires_at = '-infinity'`,
				pgx.Identifier{client.Schema()}.Sanitize(), c.group.StreamID))
			require.NoError(t, err)

			counter.Forget("store.ReclaimRange") // the dead instance's own claim reclaimed nothing, but it asked

			handled := make(chan string, 3)
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			started := time.Now()
			go func() {
				done <- c.Consume(cctx, func(_ context.Context, o *order) error { handled <- o.OrderID; return nil },
					&ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, test: hooks})
			}()
			for range 3 {
				within(t, handled, "the dead instance's messages")
			}
			reclaimed := counter.First("store.ReclaimRange").Sub(started)
			require.GreaterOrEqual(t, reclaimed, claimer.TakeoverGrace(DefaultInstanceTTL), "the first reclaim waits for TakeoverGrace")
			cancel()
			require.NoError(t, within(t, done, "Consume to return"))
		})
	}
}

// A quiet session skips the reconcile ticks' sweeps (all of them here: its
// backstop is pushed out of reach), so when the instance holding a range
// dies, only the alarm brings the takeover: the process's beat reports
// that an instance of the same worker lapsed, and the session sweeps
// (decision 0040).
func TestAQuietSessionTakesALapsedPeersRangeOverOnTheAlarm(t *testing.T) {
	ctx := context.Background()
	const ttl = 2 * time.Second
	e, s, c := setup(t, nil, "g", 0)

	// Process A claims three messages and hangs on them.
	release := make(chan struct{})
	defer close(release)
	startedA := make(chan string, 3)
	actx, killA := context.WithCancel(ctx)
	doneA := make(chan error, 1)
	go func() {
		doneA <- c.Consume(actx, func(_ context.Context, o *order) error {
			startedA <- o.OrderID
			<-release
			return nil
		}, &ConsumeOptions{InstanceTTL: ttl, DisableGracefulShutdown: true, DisableManager: true})
	}()
	e.produceN(s, "m", 3)
	for range 3 {
		within(t, startedA, "A to start the messages")
	}

	// Process B, another client, starts while A holds them: quiet.
	clientB, err := NewClient(ctx, poolOf(t, 8), &ClientConfig{Schema: e.client.Schema(), Logger: slog.New(e.logs)})
	require.NoError(t, err)
	cB, err := Stream[order](clientB, "orders").Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	handledB := make(chan string, 3)
	bctx, stopB := context.WithCancel(ctx)
	doneB := make(chan error, 1)
	go func() {
		doneB <- cB.Consume(bctx, func(_ context.Context, o *order) error { handledB <- o.OrderID; return nil },
			&ConsumeOptions{InstanceTTL: ttl, DisableManager: true, test: &hooks.Hooks{QuietSweeps: 1 << 20}})
	}()

	// A dies: its rows and leases lapse one TTL later.
	killA()
	require.NoError(t, within(t, doneA, "A to stop"))
	got := map[string]bool{}
	for range 3 {
		got[within(t, handledB, "B to take A's range over")] = true
	}
	require.Len(t, got, 3)
	stopB()
	require.NoError(t, within(t, doneB, "B to stop"))
}

// A wake reaching a quiet session claims at once, without probing first: a
// produce's wake, nearly every wake, names new positions. When that claim
// finds none, the session sweeps, so a stopping peer's hand-back, which
// wakes the stream, is still taken over at once, with no poll or reconcile
// tick's sweep to bring it (decision 0041).
func TestAWakeReachingAQuietSessionClaimsFirstAndSweepsWhenNothingIsNew(t *testing.T) {
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	p := twoProcesses(t) // "held" may be produced before the peer's first claim: StartBeginning
	counter, s, c, pc := p.counter, p.s, p.c, p.peerConsumer

	// The peer holds "held" in a handler that waits for its stop; with a
	// queue of one it claims nothing more.
	stuck := make(chan struct{})
	peer := consume(t, pc, func(ctx context.Context, o *order) error {
		if o.OrderID == "held" {
			close(stuck)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, &ConsumeOptions{BatchLimit: 1, QueueSize: 1, MessageConcurrency: 1, InstanceTTL: ttl, ShutdownTimeout: 50 * time.Millisecond})
	_, err := s.Produce(ctx, order{OrderID: "held"}, nil)
	require.NoError(t, err)
	within(t, stuck, "the peer's handler")

	handled, signals := quietSession(t, c, counter, ttl)

	// A produce's wake: a claim, and no probe before it.
	before := counter.Snapshot()
	claimed := counter.At("store.ClaimRange", before["store.ClaimRange"]+1)
	_, err = s.Produce(ctx, order{OrderID: "new"}, nil)
	require.NoError(t, err)
	require.Equal(t, "new", within(t, handled, "the produced message"))
	require.Equal(t, before["store.GateProbe"], within(t, claimed, "the claim")["store.GateProbe"], "the wake claimed without a probe")

	// Quiet again: the range committed, and a sweep's probe found nothing
	// (after the commit, or while the range was in flight). The quiet ticks
	// signalled before the wake's claim are stale; none comes while the
	// range is in flight.
	within(t, counter.At("store.CommitRange", before["store.CommitRange"]+1), "the commit")
	quietRanges(t, signals)

	// The peer stops: its hand-back wakes the stream, the claim finds no new
	// position, and the sweep takes the range over.
	before = counter.Snapshot()
	require.NoError(t, peer.stop(t))
	require.Equal(t, "held", within(t, handled, "the handed-back message"))
	after := counter.Snapshot()
	require.Greater(t, after["store.ReclaimRange"], before["store.ReclaimRange"], "taken over by the wake's sweep")
}

// A burst's last range leaves no claim that finds nothing: the claim that
// took the last claimable position says so (store.Range.Drained), and the
// claimer's next look is a sweep's probe, a read, instead of a claim, a
// write (a row lock, a transaction id, a commit). Over a thousand streams
// that claim was a third of the running burn-down's claims.
func TestABurstsLastRangeLeavesNoClaimThatFindsNothing(t *testing.T) {
	ctx := context.Background()
	const batch = 5
	client, counter := countingClient(t, "", 0)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	handled := make(chan string, 2*batch)
	consume(t, c, func(_ context.Context, o *order) error { handled <- o.OrderID; return nil },
		&ConsumeOptions{BatchLimit: batch, QueueSize: 10 * batch, ClaimPollRate: claimer.MinSweep, InstanceTTL: 1500 * time.Millisecond}) // every tick a sweep
	within(t, counter.When("store.RenewInstances", 4), "four heartbeat statements: the session is quiet")

	// Two full ranges in one transaction; the produce's wake claims both.
	before := counter.Snapshot()
	items := make([]BatchItem[order], 2*batch)
	for i := range items {
		items[i].Msg = order{OrderID: fmt.Sprint(i)}
	}
	_, err = s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)
	for range 2 * batch {
		within(t, handled, "the burst's messages")
	}
	// The sweep that follows the burst: what ran before its probe.
	at := within(t, counter.At("store.GateProbe", before["store.GateProbe"]+1), "the sweep's probe after the burst")
	require.Equal(t, 2, at["store.ClaimRange"]-before["store.ClaimRange"],
		"two claims, each of a full range, and none that found nothing")
}

// quietRanges drains the stale quiet ticks, then waits for the range
// claimer's next one: it is quiet (a wake, an alarm or the backstop alone
// makes it look for work again).
func quietRanges(t *testing.T, signals *hooks.Hooks) {
	t.Helper()
	for drained := false; !drained; {
		select {
		case <-signals.QuietTick.C():
		default:
			drained = true
		}
	}
	for within(t, signals.QuietTick.C(), "a quiet poll tick of the range claimer") != "in-flight ranges" {
	}
}

// A hand-back that released a range and then failed (here its last
// statement, giving up the key gate it took alone in its group, decision
// 0051) still wakes the stream: the range
// is back in the database, and a quiet peer takes it over at once. The
// wake used to follow only an attempt that succeeded as a whole, so the
// peer waited for its backstop sweep (out of reach here).
func TestAHandBackThatReleasedARangeWakesEvenWhenItFailsAfter(t *testing.T) {
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	p := twoProcesses(t)
	counter, peerCounter, s, c, pc := p.counter, p.peerCounter, p.s, p.c, p.peerConsumer

	// One range a message: "keyed" (exclusive, key k1, held under the
	// session's key gate) commits; "held" stays in flight.
	stuck := make(chan struct{})
	handled := make(chan string, 4)
	first := consume(t, c, func(ctx context.Context, o *order) error {
		if o.OrderID == "held" {
			close(stuck)
			<-ctx.Done()
			return ctx.Err()
		}
		handled <- o.OrderID
		return nil
	}, &ConsumeOptions{BatchLimit: 1, QueueSize: 2, InstanceTTL: ttl, ShutdownTimeout: 50 * time.Millisecond,
		test: &hooks.Hooks{KeyHold: time.Minute}})
	_, err := s.ProduceBatch(ctx, []BatchItem[order]{
		{Msg: order{OrderID: "keyed"}, Key: "k1", Message: &MessageOptions{Concurrency: Exclusive}},
		{Msg: order{OrderID: "held"}},
	}, nil)
	require.NoError(t, err)
	require.Equal(t, "keyed", within(t, handled, "the keyed message"))
	within(t, stuck, "the held message's handler")
	within(t, counter.When("store.CommitRange", 1), "the keyed message's range committed, its key kept")

	// A quiet peer, with no backstop sweep within reach.
	peerHandled, signals := quietSession(t, pc, peerCounter, ttl)
	quietRanges(t, signals)

	// The first session stops: its hand-back releases "held"'s range, then
	// fails to give its key gate up (a gate is given up to a second
	// session at a flush tick once a KeyHold, a minute here).
	counter.FailNext("store.ReleaseKeyGate")
	require.NoError(t, first.stop(t))
	require.Positive(t, counter.Snapshot()["store.ReleaseKeyGate"], "the gate's release was tried (and failed)")
	require.Equal(t, "held", within(t, peerHandled, "the handed-back message, taken over on the hand-back's wake"))
}

// processes is one stream's group "g" (StartBeginning) as two processes
// see it: each its own counting client on the same schema.
type processes struct {
	counter, peerCounter *actortest.Counter
	s                    *StreamHandle[order]
	c, peerConsumer      *Consumer[order]
}

func twoProcesses(t *testing.T) processes {
	t.Helper()
	ctx := context.Background()
	client, counter := countingClient(t, "", 0)
	peerClient, peerCounter := countingClientIn(t, client.Schema(), "", 0)
	cfg := &ConsumerConfig{Start: StartBeginning}
	p := processes{counter: counter, peerCounter: peerCounter, s: Stream[order](client, "orders")}
	require.NoError(t, p.s.Register(ctx, nil))
	var err error
	p.c, err = p.s.Consumer("g").Register(ctx, cfg)
	require.NoError(t, err)
	ps := Stream[order](peerClient, "orders")
	require.NoError(t, ps.Register(ctx, nil))
	p.peerConsumer, err = ps.Consumer("g").Register(ctx, cfg)
	require.NoError(t, err)
	return p
}

// quietSession starts a session of c that sends what it handles on the
// returned channel, polling every 10 ms, with no backstop sweep within
// reach and its quiet ticks signalled. It returns after four heartbeat
// statements of c's client (counter): past the session's start, the wake
// its listener gave every session on coming up has been answered, its
// TakeoverGrace is over, and it is quiet.
func quietSession(t *testing.T, c *Consumer[order], counter *actortest.Counter, ttl time.Duration) (<-chan string, *hooks.Hooks) {
	t.Helper()
	handled := make(chan string, 16)
	signals := &hooks.Hooks{QuietSweeps: 1 << 20}
	signals.QuietTick.Init()
	consume(t, c, func(_ context.Context, o *order) error { handled <- o.OrderID; return nil },
		&ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, InstanceTTL: ttl, test: signals})
	within(t, counter.When("store.RenewInstances", 4), "four heartbeat statements: the session is quiet")
	return handled, signals
}
