package sqlstreams

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// poolOf returns a pool on the test database holding at most n connections.
func poolOf(t *testing.T, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Every way to produce inside a caller's transaction refuses one that has
// already committed or rolled back, with pgx.ErrTxClosed, and writes
// nothing: a single message, a batch, an idempotent message and a batch
// with idempotent messages, on a handle that has read its stream's row
// already (the insert path) and on a fresh one (the lookup path).
func TestProduceWithAFinishedTransactionIsRefused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	warm := e.stream("orders")
	require.Zero(t, e.count(warm))
	calls := map[string]func(s *StreamHandle[order], tx pgx.Tx) error{
		"produce": func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.Produce(ctx, order{OrderID: "a"}, &ProduceOptions{Tx: tx})
			return err
		},
		"batch": func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "b1"}}, {Msg: order{OrderID: "b2"}}}, &BatchOptions{Tx: tx})
			return err
		},
		"idempotent": func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.Produce(ctx, order{OrderID: "i"}, &ProduceOptions{Tx: tx, IdempotencyKey: "key-" + fmt.Sprint(time.Now().UnixNano())})
			return err
		},
		"idempotent batch": func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "j1"}, IdempotencyKey: "j-" + fmt.Sprint(time.Now().UnixNano())},
				{Msg: order{OrderID: "j2"}}}, &BatchOptions{Tx: tx})
			return err
		},
	}
	for name, call := range calls {
		for _, end := range []string{"commit", "rollback"} {
			for _, fresh := range []bool{false, true} {
				tx, err := e.pool.Begin(ctx)
				require.NoError(t, err)
				if end == "commit" {
					require.NoError(t, tx.Commit(ctx))
				} else {
					require.NoError(t, tx.Rollback(ctx))
				}
				s := warm
				if fresh {
					s = Stream[order](e.client, "orders")
				}
				err = call(s, tx)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "%s after %s (fresh handle %v)", name, end, fresh)
			}
		}
	}
	require.Zero(t, e.count(warm), "nothing was written through a finished transaction")
}

// With a pool of one connection, the caller's transaction ends, another
// goroutine begins its own transaction on that same connection, and a
// produce still naming the finished transaction must not land inside the
// other one: it is refused, and the other transaction commits only its own
// work.
func TestProduceWithAFinishedTransactionNeverWritesIntoAnotherOnTheSameConnection(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	pool := poolOf(t, 1)
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: e.client.Schema(), Logger: e.client.cfg.Logger})
	require.NoError(t, err)
	s1 := Stream[order](client, "orders")
	_, err = s1.Produce(ctx, order{OrderID: "warm-up"}, nil) // the handle has its row: the next produce goes straight to the insert
	require.NoError(t, err)

	mine, err := pool.Begin(ctx)
	require.NoError(t, err)
	var pid uint32 = mine.Conn().PgConn().PID()
	require.NoError(t, mine.Rollback(ctx))

	other, err := pool.Begin(ctx) // the pool's only connection, now in someone else's transaction
	require.NoError(t, err)
	require.Equal(t, pid, other.Conn().PgConn().PID(), "the test needs the same connection")
	_, err = other.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	for _, call := range []func() error{
		func() error {
			_, err := s1.Produce(ctx, order{OrderID: "stale"}, &ProduceOptions{Tx: mine})
			return err
		},
		func() error {
			_, err := s1.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "stale-b"}}}, &BatchOptions{Tx: mine})
			return err
		},
		func() error {
			_, err := s1.Produce(ctx, order{OrderID: "stale-i"}, &ProduceOptions{Tx: mine, IdempotencyKey: "stale"})
			return err
		},
	} {
		require.ErrorIs(t, call(), pgx.ErrTxClosed)
	}
	var inOther int
	require.NoError(t, other.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.stream_1_log", pgx.Identifier{e.client.Schema()}.Sanitize())).Scan(&inOther))
	require.Equal(t, 1, inOther, "only the warm-up message: nothing landed in the other transaction")
	require.NoError(t, other.Commit(ctx))
	require.EqualValues(t, 1, e.count(s))
}

// Everything a produce inside a transaction needs runs on that transaction:
// with a pool of one connection held by the transaction, the first produce
// of a fresh client (whose stream row is not yet known) neither blocks nor
// needs a second connection, for a message, a batch and idempotent ones.
func TestTxProduceNeedsNoSecondConnection(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := e.stream("orders")
	pool := poolOf(t, 1)
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: e.client.Schema(), Logger: e.client.cfg.Logger})
	require.NoError(t, err)

	for i, call := range []func(s *StreamHandle[order], tx pgx.Tx) error{
		func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.Produce(ctx, order{OrderID: "a"}, &ProduceOptions{Tx: tx})
			return err
		},
		func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "b1"}}, {Msg: order{OrderID: "b2"}}}, &BatchOptions{Tx: tx})
			return err
		},
		func(s *StreamHandle[order], tx pgx.Tx) error {
			_, err := s.Produce(ctx, order{OrderID: "c"}, &ProduceOptions{Tx: tx, IdempotencyKey: "c"})
			return err
		},
	} {
		fresh := Stream[order](client, "orders") // never resolved: the lookup must use tx too
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, call(fresh, tx), "call %d", i)
		require.NoError(t, tx.Commit(ctx))
	}
	require.EqualValues(t, 4, e.count(s))
}

// A schema dropped and recreated under running clients restarts stream ids:
// a stale handle's cached id may now name another stream. Its produce must
// fail with ErrStreamChanged and write nothing anywhere.
func TestSchemaRecreatedUnderAStaleHandleWritesNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a, b := e.stream("a"), e.stream("b")
	// Stale handles, each of which has read its stream's row: one per kind
	// of produce, since a handle that failed reads its row again.
	handles := func(name string) []*StreamHandle[order] {
		var out []*StreamHandle[order]
		for range 4 {
			h := Stream[order](e.client, name)
			_, _, err := h.resolve(ctx, nil)
			require.NoError(t, err)
			out = append(out, h)
		}
		return out
	}
	staleA, staleB := handles("a"), handles("b")
	rowA, _, err := a.resolve(ctx, nil)
	require.NoError(t, err)
	schema := pgx.Identifier{e.client.Schema()}.Sanitize()
	_, err = e.pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	require.NoError(t, err)

	// Recreated, the streams registered the other way round: "b" takes the
	// id "a" had, and "a" the id "b" had.
	fresh, err := NewClient(ctx, e.pool, &ClientConfig{Schema: e.client.Schema(), Logger: e.client.cfg.Logger})
	require.NoError(t, err)
	nb, na := Stream[order](fresh, "b"), Stream[order](fresh, "a")
	require.NoError(t, nb.Register(ctx, nil))
	require.NoError(t, na.Register(ctx, nil))
	rowB, _, err := nb.resolve(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, rowA.ID, rowB.ID, "the test needs b to take a's old id")

	for _, stale := range [][]*StreamHandle[order]{staleA, staleB} {
		_, err = stale[0].Produce(ctx, order{OrderID: "stale"}, nil)
		require.ErrorIs(t, err, ErrStreamChanged)
		_, err = stale[1].ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "stale-1"}}, {Msg: order{OrderID: "stale-2"}}}, nil)
		require.ErrorIs(t, err, ErrStreamChanged)
		_, err = stale[2].ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "x"}, IdempotencyKey: "k2"}, {Msg: order{OrderID: "y"}}}, nil)
		require.ErrorIs(t, err, ErrStreamChanged)
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = stale[3].Produce(ctx, order{OrderID: "stale-tx"}, &ProduceOptions{Tx: tx, IdempotencyKey: "k3"})
		require.ErrorIs(t, err, ErrStreamChanged)
		require.NoError(t, tx.Commit(ctx))
	}
	for _, s := range []*StreamHandle[order]{na, nb} {
		require.Zero(t, e.count(s), "no row appeared in either stream's log")
	}
	var keys int
	require.NoError(t, e.pool.QueryRow(ctx, fmt.Sprintf("SELECT (SELECT count(*) FROM %[1]s.stream_1_idempotency) + (SELECT count(*) FROM %[1]s.stream_2_idempotency)", schema)).Scan(&keys))
	require.Zero(t, keys, "no idempotency key was taken either")

	// A handle that failed reads its stream again by name: its next produce
	// goes to the recreated stream of that name.
	_, err = staleA[0].Produce(ctx, order{OrderID: "after"}, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, e.count(na))
	require.Zero(t, e.count(nb))
	_ = b
}

// A stream new to a connection is produced to with an unnamed statement,
// parsed, bound and run in one round trip, and so is its second produce
// there; the connection prepares the insert when it meets the stream a third
// time. Either way the ids come back in item order.
func TestAProduceNewToItsConnectionPreparesNothing(t *testing.T) {
	ctx := context.Background()
	pool := poolOf(t, 1) // every call on the same connection
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: pgtest.Schema(t), Logger: slog.New(actortest.NewLogs(t))})
	require.NoError(t, err)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	prepared := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '-- store.Produce%'`).Scan(&n))
		return n
	}
	items := []BatchItem[order]{{Msg: order{OrderID: "a"}}, {Msg: order{OrderID: "b"}}, {Msg: order{OrderID: "c"}}}
	var last int64
	for call, want := range []int{0, 0, 1, 1} {
		res, err := s.ProduceBatch(ctx, items, nil)
		require.NoError(t, err)
		require.Len(t, res, len(items))
		for i, r := range res {
			require.Greater(t, r.ID, last, "call %d, item %d: ids ascend in item order", call, i)
			last = r.ID
		}
		require.Equal(t, want, prepared(), "call %d: prepared inserts on the connection", call)
	}
}
