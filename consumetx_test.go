package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

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
