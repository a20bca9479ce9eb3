package sqlstreams

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// configuredPool is a pool on the tests' server built from a config that
// went through ConfigurePool (twice: a second call must change nothing),
// after a BuildFrontend of the test's own. That one counts the frontends it
// builds, and those whose reader is not one buffer of PoolReadBuffer bytes
// over the connection's.
func configuredPool(t *testing.T, maxConns int32, params map[string]string) (pool *pgxpool.Pool, built, unbuffered *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	built, unbuffered = new(atomic.Int64), new(atomic.Int64)
	cfg.ConnConfig.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		built.Add(1)
		if b, ok := r.(*bufio.Reader); !ok || b.Size() != PoolReadBuffer {
			unbuffered.Add(1)
		}
		return pgproto3.NewFrontend(r, w)
	}
	ConfigurePool(cfg)
	ConfigurePool(cfg)
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, built, unbuffered
}

func TestConfigurePoolTurnsJITOffUnlessSet(t *testing.T) {
	ctx := context.Background()
	pool, built, unbuffered := configuredPool(t, 2, nil)
	var jit string
	require.NoError(t, pool.QueryRow(ctx, "SHOW jit").Scan(&jit))
	require.Equal(t, "off", jit)
	require.Positive(t, built.Load(), "the BuildFrontend set before ConfigurePool still builds each connection's frontend")
	require.Zero(t, unbuffered.Load(), "every connection reads through one buffer of PoolReadBuffer bytes")

	kept, _, _ := configuredPool(t, 2, map[string]string{"jit": "on"})
	require.NoError(t, kept.QueryRow(ctx, "SHOW jit").Scan(&jit))
	require.Equal(t, "on", jit, "a jit the config sets already is kept")

	ConfigurePool(nil) // no config, nothing to do
	ConfigurePool(&pgxpool.Config{})
}

// Replies far larger than the buffer, a result closed after a few of its
// rows, a statement the server cancels and a call whose context is over
// leave the one connection in step with the server: each next statement
// reads its own reply.
func TestConfigurePoolKeepsAConnectionInStep(t *testing.T) {
	ctx := context.Background()
	pool, _, _ := configuredPool(t, 1, nil)

	const rows, width = 3000, 1000 // about 3 MB, 12 buffers
	var n, total int64
	r, err := pool.Query(ctx, "SELECT i, repeat('x', $2::int) FROM generate_series(1, $1::int) AS i", rows, width)
	require.NoError(t, err)
	for r.Next() {
		var i int64
		var s string
		require.NoError(t, r.Scan(&i, &s))
		n, total = n+1, total+i
		require.Len(t, s, width)
	}
	require.NoError(t, r.Err())
	require.EqualValues(t, rows, n)
	require.EqualValues(t, rows*(rows+1)/2, total)

	r, err = pool.Query(ctx, "SELECT i, repeat('y', 1000) FROM generate_series(1, 3000) AS i")
	require.NoError(t, err)
	for range 5 {
		require.True(t, r.Next())
	}
	r.Close() // the rest of the reply is read and dropped
	require.NoError(t, r.Err())

	// A statement the server cancels: its error reply comes through the
	// buffer, and the connection goes on.
	_, err = pool.Exec(ctx, "SET statement_timeout = '20ms'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT pg_sleep(10)")
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "57014", pe.Code, "query_canceled")
	_, err = pool.Exec(ctx, "RESET statement_timeout")
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pool.Exec(cctx, "SELECT 1")
	require.ErrorIs(t, err, context.Canceled)

	var got string
	require.NoError(t, pool.QueryRow(ctx, "SELECT 'in step'").Scan(&got))
	require.Equal(t, "in step", got)
}

// A client on a configured pool produces and consumes ranges of about half
// a megabyte each: every message arrives once.
func TestConfigurePoolCarriesABurnDown(t *testing.T) {
	ctx := context.Background()
	pool, _, _ := configuredPool(t, 8, nil)
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: pgtest.Schema(t), Logger: slog.New(actortest.NewLogs(t))})
	require.NoError(t, err)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)

	const n = 2000
	pad := strings.Repeat("p", 1000)
	items := make([]BatchItem[order], n)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("%d-%s", i, pad), Amount: i}}
	}
	_, err = s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)

	col := newCollector(n)
	bad := actortest.NewFailures(t)
	opts := fast()
	opts.BatchLimit = 500
	sess := consume(t, c, func(_ context.Context, o *order) error {
		if !strings.HasSuffix(o.OrderID, pad) {
			bad.Add("message %d arrived with a payload of %d bytes", o.Amount, len(o.OrderID))
		}
		col.add(o.OrderID)
		return nil
	}, opts)
	within(t, col.done, "all messages")
	require.NoError(t, sess.stop(t))
	bad.Check(t)
	require.Zero(t, col.duplicates())
}
