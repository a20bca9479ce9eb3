package sqlstreams

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The late-commit interleaving, forced: transaction 1 produces first (lower
// xid, lower id) and commits last. A cursor that reads "ids above the last
// one seen" would hand out B, move past A, and lose A for good.
func TestLateCommitIsNotSkipped(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	args := store.ClaimParams{Owner: engine.NewID(), Limit: 100, Lease: time.Minute}
	db := c.db()

	tx1, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	a, err := s.Produce(ctx, order{OrderID: "A"}, &ProduceOptions{Tx: tx1})
	require.NoError(t, err)

	tx2, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	b, err := s.Produce(ctx, order{OrderID: "B"}, &ProduceOptions{Tx: tx2})
	require.NoError(t, err)
	require.Less(t, a.ID, b.ID)
	require.NoError(t, tx2.Commit(ctx))

	// B is committed but sits behind A's open transaction: nothing is handed out.
	_, ok, err := db.ClaimRange(ctx, args)
	require.NoError(t, err)
	require.False(t, ok, "a claim must not pass an open transaction's position")
	g, err := db.GateProbe(ctx, nil)
	require.NoError(t, err)
	require.True(t, g.Pending, "the probe sees committed rows waiting behind the gate")

	require.NoError(t, tx1.Commit(ctx))
	r, ok, err := db.ClaimRange(ctx, args)
	require.NoError(t, err)
	require.True(t, ok)
	var ids []int64
	for _, m := range r.Messages {
		ids = append(ids, m.ID)
	}
	require.Equal(t, []int64{a.ID, b.ID}, ids, "both arrive, in commit-safe order")
	require.NoError(t, db.CommitRange(ctx, store.RangeCommit{RangeID: r.ID, Token: r.Token}))
	_, ok, err = db.ClaimRange(ctx, args)
	require.NoError(t, err)
	require.False(t, ok)
}

// The lease token fences a slow instance whose range was reclaimed: its
// commit writes nothing.
func TestLeaseFenceRejectsTheOldOwner(t *testing.T) {
	e, _, c := setup(t, nil, "g", 5)
	ctx := context.Background()
	st, db := e.client.store, c.db()
	ownerA, ownerB := engine.NewID(), engine.NewID()
	argsA := store.ClaimParams{Owner: ownerA, Limit: 10, Lease: time.Minute}
	argsB := argsA
	argsB.Owner = ownerB

	ra, ok, err := db.ClaimRange(ctx, argsA)
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = db.ReclaimRange(ctx, argsB)
	require.NoError(t, err)
	require.False(t, ok, "a live lease is not reclaimed")

	require.NoError(t, st.ExpireOwnedRanges(ctx, ownerA, c.group.StreamID, nil))
	rb, ok, err := db.ReclaimRange(ctx, argsB)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, ra.ID, rb.ID)
	require.NotEqual(t, ra.Token, rb.Token)
	require.Equal(t, 1, rb.Reclaims)
	require.Len(t, rb.Messages, 5)

	fail := []store.ExceptionWrite{{Position: ra.Messages[0].Position, Concurrency: "parallel", Status: "pending", Attempts: 1, Error: "late"}}
	err = db.CommitRange(ctx, store.RangeCommit{RangeID: ra.ID, Token: ra.Token, Exceptions: fail})
	require.ErrorIs(t, err, store.ErrLeaseLost)
	require.ErrorIs(t, db.ReleaseRange(ctx, store.Release{RangeID: ra.ID, Token: ra.Token}), store.ErrLeaseLost)
	require.Zero(t, e.exceptions(c), "a fenced commit writes nothing")
	require.Len(t, e.leases(c), 1)
	// A commit with nothing but successes takes a shorter statement
	// (decision 0042), fenced the same way.
	require.ErrorIs(t, db.CommitRange(ctx, store.RangeCommit{RangeID: ra.ID, Token: ra.Token}), store.ErrLeaseLost)
	require.Len(t, e.leases(c), 1, "a fenced commit deletes no lease")

	require.NoError(t, db.CommitRange(ctx, store.RangeCommit{RangeID: rb.ID, Token: rb.Token}))
	require.Empty(t, e.leases(c))
	// Committed, the range is gone for both holders, whichever statement
	// their commit takes.
	require.ErrorIs(t, db.CommitRange(ctx, store.RangeCommit{RangeID: rb.ID, Token: rb.Token}), store.ErrRangeGone)
	require.ErrorIs(t, db.CommitRange(ctx, store.RangeCommit{RangeID: ra.ID, Token: ra.Token, Exceptions: fail}), store.ErrRangeGone)
	require.Zero(t, e.exceptions(c), "nor does a commit of a range that is gone")
}

// An instance that stops without a graceful shutdown (as a crash would)
// leaves its range leased; once the lease expires another instance
// reclaims and delivers it.
func TestKilledInstanceRangeIsReclaimed(t *testing.T) {
	e, _, c := setup(t, nil, "g", 10)
	ctx := context.Background()

	started := make(chan struct{})
	var once sync.Once
	a := consume(t, c, func(ctx context.Context, o *order) error {
		once.Do(func() { close(started) })
		<-ctx.Done()
		return ctx.Err()
	}, &ConsumeOptions{BatchLimit: 10, MessageConcurrency: 1, ClaimPollRate: 5 * time.Millisecond, DisableGracefulShutdown: true})
	aID := within(t, a.id, "instance id")
	within(t, started, "handler to start")
	require.NoError(t, a.stop(t))

	leases := e.leases(c)
	require.Len(t, leases, 1, "the killed instance's range is still leased")
	require.Equal(t, aID, leases[0].Owner)
	require.Zero(t, e.exceptions(c), "nothing was committed")

	require.NoError(t, storetest.ExpireInstanceLeases(ctx, e.client.store, aID, c.group.StreamID))
	col := newCollector(10)
	b := consume(t, c, func(_ context.Context, o *order) error { col.add(o.OrderID); return nil }, fast())
	within(t, col.done, "the reclaimed range")
	require.NoError(t, b.stop(t))
	require.Empty(t, e.leases(c))
	require.EqualValues(t, 1, c.Stats().Reclaimed)
	require.Zero(t, col.duplicates())
}

// Graceful shutdown lets in-flight handlers finish, commits, and leaves
// nothing leased.
func TestGracefulShutdownDrains(t *testing.T) {
	e, _, c := setup(t, nil, "g", 4)
	ctx := context.Background()

	release := make(chan struct{})
	started := make(chan struct{}, 4)
	alive := make(chan error, 4) // each handler's context when it is let go
	col := newCollector(4)
	ready := NewReadiness()
	a := consume(t, c, func(ctx context.Context, o *order) error {
		started <- struct{}{}
		<-release
		alive <- ctx.Err()
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 4, MessageConcurrency: 4, ClaimPollRate: 5 * time.Millisecond, Readiness: ready})
	for range 4 {
		within(t, started, "handlers to start")
	}
	within(t, ready.Done(), "the session to be ready")
	a.cancel()
	for ready.Ready() { // the session stops consuming: the drain begins
		within(t, ready.Changed(), "the session to stop being ready")
	}
	select {
	case err := <-a.done:
		t.Fatalf("Consume returned (%v) while its handlers were still running: nothing drained", err)
	default:
	}
	close(release)
	for range 4 {
		require.NoError(t, within(t, alive, "a handler let go"), "a draining handler keeps its context")
	}
	require.NoError(t, within(t, a.done, "Consume to drain and return"))
	a.done <- nil
	require.Empty(t, e.leases(c), "drained range committed")
	require.Zero(t, e.exceptions(c))
	within(t, col.done, "all handled")
	require.EqualValues(t, 4, c.Stats().Succeeded, "the drained handlers' outcomes were settled")

	var live int
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.client.Schema()+".worker_instance").Scan(&live))
	require.Zero(t, live, "a graceful stop gives the instance row back")
}

// At ShutdownTimeout the drain stops waiting: the settled prefix is
// committed and the rest handed back with its lease expired, so another
// instance takes it at once.
func TestShutdownTimeoutHandsBackUnfinishedWork(t *testing.T) {
	e, _, c := setup(t, nil, "g", 10)

	stuck := make(chan struct{})
	a := consume(t, c, func(ctx context.Context, o *order) error {
		if o.OrderID == "m-1" {
			close(stuck)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, &ConsumeOptions{BatchLimit: 10, MessageConcurrency: 1, ClaimPollRate: 5 * time.Millisecond, ShutdownTimeout: 50 * time.Millisecond})
	within(t, stuck, "the stuck handler")
	require.NoError(t, a.stop(t))
	require.Len(t, e.leases(c), 1)

	got := make(chan string, 20)
	col := newCollector(9)
	b := consume(t, c, func(_ context.Context, o *order) error { got <- o.OrderID; col.add(o.OrderID); return nil }, fast())
	within(t, col.done, "the handed-back rest")
	require.NoError(t, b.stop(t))
	close(got)
	for id := range got {
		require.NotEqual(t, "m-0", id, "the settled prefix is not delivered again")
	}
	require.Empty(t, e.leases(c))
}

// child is a consumer running in another process: this test binary,
// re-run as TestChildConsumer. Its stdout lines arrive on lines.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

func spawn(t *testing.T, e *env, mode string) *child { t.Helper(); return spawnWith(t, e, mode) }

// spawnWith is spawn with more environment variables for the child.
func spawnWith(t *testing.T, e *env, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildConsumer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SQLSTREAMS_CHILD_SCHEMA="+e.client.Schema(), "SQLSTREAMS_CHILD_MODE="+mode,
		"SQLSTREAMS_TEST_DATABASE_URL="+pgtest.URL())
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, lines: make(chan string, 1024), stdin: in}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); <-done })
	return c
}

// next returns the child's next line with the given prefix, minus the prefix.
func (c *child) next(t *testing.T, prefix string) string {
	t.Helper()
	for {
		l, ok := <-c.lines
		require.True(t, ok, "child exited before printing %q", prefix)
		if rest, found := strings.CutPrefix(l, prefix); found {
			return rest
		}
	}
}

// A separate process is killed (SIGKILL) mid-range; after its lease expires
// this process reclaims and delivers the range.
func TestKilledProcessRangeIsReclaimed(t *testing.T) {
	e, _, c := setup(t, nil, "g", 20)
	ctx := context.Background()

	ch := spawn(t, e, "block")
	childID := ch.next(t, "INSTANCE ")
	ch.next(t, "HANDLING ")
	require.NoError(t, ch.cmd.Process.Kill())
	_ = ch.cmd.Wait()

	leases := e.leases(c)
	require.Len(t, leases, 1)
	require.Equal(t, childID, leases[0].Owner)
	require.NoError(t, storetest.ExpireInstanceLeases(ctx, e.client.store, childID, c.group.StreamID))

	col := newCollector(20)
	b := consume(t, c, func(_ context.Context, o *order) error { col.add(o.OrderID); return nil }, fast())
	within(t, col.done, "the dead process's range")
	require.NoError(t, b.stop(t))
	require.Empty(t, e.leases(c))
	require.EqualValues(t, 1, c.Stats().Reclaimed)
}

// Two processes share one group's work: every message is handled once,
// and each process handles some. Each holds one range at a time, and each
// one's first handler waits for the other to be handling too, so the split
// does not depend on timing.
func TestProcessesShareTheWork(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ch := spawn(t, e, "share")
	ch.next(t, "INSTANCE ")

	const n = 400
	col := newCollector(n)
	childGot := make(chan struct{})
	var parentCount int
	var mu sync.Mutex
	var tellChild sync.Once
	a := consume(t, c, func(ctx context.Context, o *order) error {
		tellChild.Do(func() { _, _ = io.WriteString(ch.stdin, "GO\n") })
		select {
		case <-childGot:
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		parentCount++
		mu.Unlock()
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 10, QueueSize: 10, MessageConcurrency: 2, ClaimPollRate: 5 * time.Millisecond})
	e.produceN(s, "m", n)

	childCount := 0
	for {
		select {
		case l, ok := <-ch.lines:
			require.True(t, ok, "child exited early")
			if id, found := strings.CutPrefix(l, "GOT "); found {
				if childCount == 0 {
					close(childGot)
				}
				childCount++
				col.add(id)
			}
			continue
		case <-col.done:
		}
		break
	}
	require.NoError(t, ch.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, ch.cmd.Wait(), "the child stops gracefully")
	require.NoError(t, a.stop(t))

	require.Zero(t, col.duplicates(), "no message handled by both processes")
	require.Positive(t, childCount)
	mu.Lock()
	require.Positive(t, parentCount)
	mu.Unlock()
	require.Empty(t, e.leases(c))
}

// TestChildConsumer is the other process of the tests above.
func TestChildConsumer(t *testing.T) {
	schema := os.Getenv("SQLSTREAMS_CHILD_SCHEMA")
	if schema == "" {
		t.Skip("helper process of TestKilledProcessRangeIsReclaimed, TestProcessesShareTheWork and TestAStalledProcessComesBackAsANewIncarnation")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool := pgtest.Pool(t)
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: schema})
	require.NoError(t, err)
	c, err := Stream[order](client, "orders").Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	hooks := &hooks.Hooks{OnStart: func(id string) { fmt.Println("INSTANCE " + id) }}
	var once sync.Once
	var mu sync.Mutex
	switch os.Getenv("SQLSTREAMS_CHILD_MODE") {
	case "block":
		_ = c.Consume(ctx, func(ctx context.Context, o *order) error {
			once.Do(func() { fmt.Println("HANDLING " + o.OrderID) })
			select {} // until killed
		}, &ConsumeOptions{BatchLimit: 20, MessageConcurrency: 1, test: hooks})
	case "stall":
		cfg, err := pgxpool.ParseConfig(pgtest.URL())
		require.NoError(t, err)
		deadlocks := &deadlockCounter{}
		cfg.ConnConfig.Tracer = deadlocks
		traced, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer traced.Close()
		client, err := NewClient(ctx, traced, &ClientConfig{Schema: schema})
		require.NoError(t, err)
		c, err := Stream[order](client, "orders").Consumer("g").Register(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, childStall(ctx, c, pool, schema, hooks))
		fmt.Printf("DEADLOCKS %d\n", deadlocks.n.Load())
	case "freeze":
		client, err := NewClient(ctx, pool, &ClientConfig{Schema: schema, Logger: slog.New(lineLogger{})})
		require.NoError(t, err)
		hooks.OnStart = func(id string) { childSay("INSTANCE " + id) }
		require.NoError(t, childFreeze(ctx, client, hooks))
	case "tx":
		hooks.OnStart = func(id string) { childSay("INSTANCE " + id) }
		require.NoError(t, childTx(ctx, schema, hooks))
	case "share":
		goSignal := make(chan struct{})
		go func() { // the parent says GO once it is handling a range too
			sc := bufio.NewScanner(os.Stdin)
			if sc.Scan() && sc.Text() == "GO" {
				close(goSignal)
			}
		}()
		err := c.Consume(ctx, func(ctx context.Context, o *order) error {
			select {
			case <-goSignal:
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			defer mu.Unlock()
			fmt.Println("GOT " + o.OrderID)
			return nil
		}, &ConsumeOptions{BatchLimit: 10, QueueSize: 10, MessageConcurrency: 2, ClaimPollRate: 5 * time.Millisecond, test: hooks})
		require.NoError(t, err)
	}
}
