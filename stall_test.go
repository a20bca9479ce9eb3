package sqlstreams

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// stallTTL is the children's InstanceTTL in TestAStalledProcessComesBackAsANewIncarnation.
const stallTTL = 2 * time.Second

// A process frozen (SIGSTOP) for longer than its InstanceTTL and then
// continued (SIGCONT) comes back as a new incarnation: while it slept the
// other process reclaimed its ranges and took its key leases, so it must
// not start a handler of a key the other holds. Only the handlers already
// running when it froze may overlap (nothing can recall them; their late
// outcomes settle nothing). Two child processes of one group handle hot
// Exclusive keys and record each handler's start and end (one system
// clock: the processes share the machine); afterwards no two handlers of a
// key overlap across processes save for those, and every message was
// handled. Before incarnations, the woken process started such handlers
// within milliseconds of SIGCONT.
func TestAStalledProcessComesBackAsANewIncarnation(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes a process for several seconds")
	}
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.stall_log (
    pid int NOT NULL, order_id text NOT NULL, entered timestamptz NOT NULL, finished timestamptz NOT NULL)`, e.client.Schema()))
	require.NoError(t, err)
	const n, keys = 1500, 12
	_, err = s.ProduceBatch(ctx, keyedBatch(n, keys), &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.NoError(t, err)

	frozen, other := spawn(t, e, "stall"), spawn(t, e, "stall")
	frozenID := frozen.next(t, "INSTANCE ")
	other.next(t, "INSTANCE ")
	col := newCollector(n)
	frozenGot := 0
	var incarnations []string
	deadlockLines := 0
	line := func(ch *child, l string, ok bool) {
		require.True(t, ok, "a child exited early")
		if n, found := strings.CutPrefix(l, "DEADLOCKS "); found {
			deadlockLines++
			require.Equal(t, "0", n, "a child's statements hit `deadlock detected`")
		} else if id, found := strings.CutPrefix(l, "GOT "); found {
			col.add(id)
			if ch == frozen {
				frozenGot++
			}
		} else if id, found := strings.CutPrefix(l, "INSTANCE "); found && ch == frozen {
			incarnations = append(incarnations, id)
		}
	}
	for frozenGot < 30 { // both at work, the one to freeze holding keys
		select {
		case l, ok := <-frozen.lines:
			line(frozen, l, ok)
		case l, ok := <-other.lines:
			line(other, l, ok)
		}
	}

	stopAt := time.Now()
	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGSTOP))
	// The freeze lasts 2.5 TTLs: past its TTL, long enough for the other
	// process to reclaim its work. (A deliberate pause of the test's
	// subject, not a wait for anything asynchronous.)
	thaw := time.NewTimer(stallTTL*2 + stallTTL/2)
	for thawed := false; !thawed; {
		select {
		case <-thaw.C:
			thawed = true
		case l, ok := <-frozen.lines: // lines printed before the freeze
			line(frozen, l, ok)
		case l, ok := <-other.lines:
			line(other, l, ok)
		}
	}
	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGCONT))
	contAt := time.Now()

	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for done := false; !done; {
		select {
		case <-col.done:
			done = true
		case <-deadline.C:
			t.Fatalf("not every message was handled within 2 minutes of SIGCONT")
		case l, ok := <-frozen.lines:
			line(frozen, l, ok)
		case l, ok := <-other.lines:
			line(other, l, ok)
		}
	}
	for _, ch := range []*child{frozen, other} {
		require.NoError(t, ch.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, ch.cmd.Wait(), "the child stops gracefully")
	}
	for _, ch := range []*child{frozen, other} { // what they printed while stopping
		for l := range ch.lines {
			line(ch, l, true)
		}
	}
	require.Equal(t, 2, deadlockLines, "both children report their deadlock count")
	require.NotEmpty(t, incarnations, "the resumed process registered again as a new incarnation")
	require.NotEqual(t, frozenID, incarnations[0], "under a new instance id")
	require.Empty(t, e.leases(c), "both stopped gracefully: nothing is held")

	type run struct {
		pid               int
		key               string
		entered, finished time.Time
	}
	rows, err := e.pool.Query(ctx, fmt.Sprintf(`SELECT pid, order_id, entered, finished FROM %s.stall_log`, e.client.Schema()))
	require.NoError(t, err)
	byKey := map[string][]run{}
	frozenPID := frozen.cmd.Process.Pid
	tookOver := 0
	for rows.Next() {
		var r run
		var id string
		require.NoError(t, rows.Scan(&r.pid, &id, &r.entered, &r.finished))
		var i int
		_, err := fmt.Sscanf(id, "m-%d", &i)
		require.NoError(t, err)
		r.key = fmt.Sprintf("k%d", i%keys)
		byKey[r.key] = append(byKey[r.key], r)
		if r.pid != frozenPID && r.entered.After(stopAt) && r.entered.Before(contAt) {
			tookOver++
		}
	}
	require.NoError(t, rows.Err())
	require.Positive(t, tookOver, "the other process worked while the first was frozen")
	// In flight at the freeze: running when SIGSTOP landed. Nothing of the
	// frozen process runs between the stop and SIGCONT, so a handler of it
	// entered before SIGCONT was entered before the stop landed (which can
	// be a little after stopAt); the millisecond after SIGCONT covers a
	// handler dispatched before the freeze whose first line ran after it (a
	// new start needs a renewal round trip first, and a lapsed instance
	// none until it has registered again).
	inFlightAtFreeze := func(r run) bool {
		return r.pid == frozenPID && r.entered.Before(contAt.Add(time.Millisecond)) && r.finished.After(stopAt)
	}
	var overlaps []string
	for key, runs := range byKey {
		sort.Slice(runs, func(i, j int) bool { return runs[i].entered.Before(runs[j].entered) })
		for i, a := range runs {
			for _, b := range runs[i+1:] {
				if !b.entered.Before(a.finished) {
					break
				}
				if a.pid != b.pid && !inFlightAtFreeze(a) && !inFlightAtFreeze(b) {
					overlaps = append(overlaps, fmt.Sprintf("%s: pid %d [%s, %s] and pid %d [%s, %s] (SIGCONT at %s)", key,
						a.pid, a.entered.Format("15:04:05.000"), a.finished.Format("15:04:05.000"),
						b.pid, b.entered.Format("15:04:05.000"), b.finished.Format("15:04:05.000"), contAt.Format("15:04:05.000")))
				}
			}
		}
	}
	require.Empty(t, overlaps, "handlers of one exclusive key ran at once in two processes")
}

// childStall is TestChildConsumer's "stall" mode: hot exclusive keys, a
// short TTL, each handler recording when it ran.
func childStall(ctx context.Context, c *Consumer[order], pool *pgxpool.Pool, schema string, hooks *hooks.Hooks) error {
	pid := os.Getpid()
	var out sync.Mutex
	return c.Consume(ctx, func(ctx context.Context, o *order) error {
		entered := time.Now()
		work := time.NewTimer(20 * time.Millisecond) // the handler's work
		defer work.Stop()
		select {
		case <-work.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".stall_log (pid, order_id, entered, finished) VALUES ($1, $2, $3, $4)",
			pid, o.OrderID, entered, time.Now()); err != nil {
			return err
		}
		out.Lock()
		defer out.Unlock()
		fmt.Println("GOT " + o.OrderID)
		return nil
	}, &ConsumeOptions{InstanceTTL: stallTTL, BatchLimit: 10, QueueSize: 20, MessageConcurrency: 4,
		ClaimPollRate: 20 * time.Millisecond, test: hooks})
}
