package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// effects is a test's table of a transactional handler's writes: one row
// per handled attempt that committed, with no unique constraint, so that a
// second commit of one message's effects shows as a second row.
type effects struct {
	t     *testing.T
	pool  *pgxpool.Pool
	table string
}

func newEffects(t *testing.T, e *env) *effects {
	t.Helper()
	f := &effects{t: t, pool: e.pool, table: e.client.Schema() + ".effects"}
	_, err := e.pool.Exec(context.Background(), "CREATE TABLE "+f.table+" (order_id text NOT NULL)")
	require.NoError(t, err)
	return f
}

// write inserts one effect row in tx.
func (f *effects) write(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+f.table+" (order_id) VALUES ($1)", id)
	return err
}

// counts returns how many rows each order id has.
func (f *effects) counts() map[string]int {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT order_id, count(*) FROM "+f.table+" GROUP BY order_id")
	require.NoError(f.t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int
	}, error) {
		var v struct {
			id string
			n  int
		}
		return v, r.Scan(&v.id, &v.n)
	})
	require.NoError(f.t, err)
	m := make(map[string]int, len(out))
	for _, v := range out {
		m[v.id] = v.n
	}
	return m
}

// requireOnce fails unless every id of want has exactly one row and no
// other id has any.
func (f *effects) requireOnce(want []string) {
	f.t.Helper()
	got := f.counts()
	var dup, missing []string
	for _, id := range want {
		switch n := got[id]; {
		case n == 0:
			missing = append(missing, id)
		case n > 1:
			dup = append(dup, fmt.Sprintf("%s×%d", id, n))
		}
		delete(got, id)
	}
	require.Empty(f.t, missing, "effects missing")
	require.Empty(f.t, dup, "effects committed more than once")
	require.Empty(f.t, got, "effects of messages never produced")
}

// A transactional handler's writes and what it produces commit with its
// message's settlement, once: each message inserts a row and produces a
// derived message in the handler's transaction; a failed attempt's writes
// are rolled back and the message runs again; a terminal failure writes
// nothing and ends dead. Every message's effects commit exactly once.
func TestATransactionalHandlersWritesCommitOnceWithItsSettlement(t *testing.T) {
	ctx := context.Background()
	e, s, _ := setup(t, nil, "g", 0)
	derived := e.stream("derived")
	dc, err := derived.Consumer("d").Register(ctx, nil)
	require.NoError(t, err)
	fx := newEffects(t, e)
	const n = 300
	e.produceN(s, "m", n)

	var mu sync.Mutex
	attempts := map[string]int{}
	cx, err := s.Consumer("tx").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); <-done }()
	go func() {
		done <- cx.ConsumeTx(cctx, func(ctx context.Context, tx pgx.Tx, o *order) error {
			if err := fx.write(ctx, tx, o.OrderID); err != nil {
				return err
			}
			if _, err := derived.Produce(ctx, order{OrderID: "from-" + o.OrderID}, &ProduceOptions{Tx: tx}); err != nil {
				return err
			}
			mu.Lock()
			attempts[o.OrderID]++
			k := attempts[o.OrderID]
			mu.Unlock()
			switch {
			case o.Amount%10 == 3 && k == 1:
				return errors.New("fails once after writing") // its writes are rolled back
			case o.Amount == 7:
				return Terminal(errors.New("never"))
			}
			return nil
		}, fast())
	}()
	want := make([]string, 0, n)
	for i := range n {
		if i != 7 {
			want = append(want, fmt.Sprintf("m-%d", i))
		}
	}
	col := newCollector(len(want))
	consume(t, dc, func(_ context.Context, o *order) error { col.add(o.OrderID); return nil }, fast())
	select {
	case <-col.done:
	case err := <-done:
		t.Fatalf("ConsumeTx returned: %v", err)
	case <-time.After(20 * time.Second):
		t.Logf("effects: %d distinct; logs: %q", len(fx.counts()), e.logs.Messages(slog.LevelInfo))
		t.FailNow()
	}
	fx.requireOnce(want)
	require.Zero(t, col.duplicates(), "each derived message produced once")
}

// consumeTx is consume for a transactional handler.
func consumeTx[T any](t *testing.T, c *Consumer[T], h TxHandler[T], opts *ConsumeOptions) *session {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{cancel: cancel, done: make(chan error, 1), id: make(chan string, 1)}
	var o ConsumeOptions
	if opts != nil {
		o = *opts
	}
	h2 := hooks.Hooks{}
	if o.test != nil {
		h2 = *o.test
	}
	h2.OnStart = func(id string) {
		select {
		case s.id <- id:
		default:
		}
	}
	o.test = &h2
	go func() { s.done <- c.ConsumeTx(ctx, h, &o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(60 * time.Second):
			t.Errorf("ConsumeTx did not return after cancel")
		}
	})
	return s
}

// A transaction whose lease lapsed while its handler ran commits nothing:
// a handler holds its message past its range's lease; the range is
// reclaimed (here by the same session's sweep: any reclaimer does) under a
// new token, and the message runs again and commits its effect; when the
// first handler returns, its settlement finds its token gone and its
// transaction, with its write, rolls back. The message's effect commits
// once.
func TestATransactionWhoseLeaseLapsedCommitsNothing(t *testing.T) {
	ctx := context.Background()
	e, s, _ := setup(t, nil, "g", 0)
	fx := newEffects(t, e)
	c, err := s.Consumer("tx").Register(ctx, nil)
	require.NoError(t, err)
	e.produceN(s, "m", 1)

	entered, release := make(chan struct{}, 1), make(chan struct{})
	var calls atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, o *order) error {
		n := calls.Add(1)
		if err := fx.write(ctx, tx, o.OrderID+"/"+strconv.Itoa(int(n))); err != nil {
			return err
		}
		if n == 1 { // held past its lease
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	recorded, lost := make(chan int64, 4), make(chan int64, 4)
	a := consumeTx(t, c, handler, &ConsumeOptions{ClaimPollRate: 20 * time.Millisecond, DisableManager: true,
		test: &hooks.Hooks{Trace: func(kind hooks.TraceKind, ids []int64) {
			switch kind {
			case hooks.TraceRecorded:
				recorded <- ids[0]
			case hooks.TraceLost:
				lost <- ids[0]
			}
		}}})
	id := within(t, a.id, "the session's instance")
	within(t, entered, "the first run holding the message")
	_, err = e.pool.Exec(ctx, fmt.Sprintf("UPDATE %s SET expires_at = now() - interval '1 second' WHERE owner = $1::uuid",
		e.client.store.StreamTable(c.group.StreamID, "range")), id)
	require.NoError(t, err)
	within(t, recorded, "the reclaimed message's run, committed")
	require.Equal(t, map[string]int{"m-0/2": 1}, fx.counts(), "the second run's effect")
	close(release)
	within(t, lost, "the first run's transaction finding its lease gone")
	require.Equal(t, map[string]int{"m-0/2": 1}, fx.counts(), "the first run's write rolled back with its transaction")
}
