package sqlstreamstest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/sqlstreamstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestMain starts the private PostgreSQL the tests use; a user's tests
// would read their own URL instead.
func TestMain(m *testing.M) { pgtest.Main(m) }

type invoice struct {
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

// setup is what a user's test does: its own schema, a client, a stream.
func setup(t *testing.T) (*pgxpool.Pool, *sqlstreams.StreamHandle[invoice]) {
	t.Helper()
	url := pgtest.URL()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	client, err := sqlstreams.NewClient(context.Background(), pool, &sqlstreams.ClientConfig{Schema: sqlstreamstest.Schema(t, url)})
	require.NoError(t, err)
	s := sqlstreams.Stream[invoice](client, "invoices")
	require.NoError(t, s.Register(context.Background(), nil))
	return pool, s
}

// recorder is a testing.TB that records a failure instead of ending the
// test, so that a test can check that a helper fails when it should.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}
func (r *recorder) Errorf(format string, args ...any) { r.Fatalf(format, args...) }
func (r *recorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.failed...)
}

func TestRequireProduced(t *testing.T) {
	pool, s := setup(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	r := &recorder{TB: t}
	sqlstreamstest.RequireProduced(r, tx, s, nil)
	require.Len(t, r.failures(), 1, "nothing produced yet")
	require.Contains(t, r.failures()[0], "produced 0 message(s)")

	_, err = s.Produce(ctx, invoice{Customer: "acme", Cents: 1200}, &sqlstreams.ProduceOptions{Tx: tx})
	require.NoError(t, err)
	sqlstreamstest.RequireProduced(t, tx, s, func(i invoice) bool { return i.Customer == "acme" && i.Cents == 1200 })

	r = &recorder{TB: t}
	sqlstreamstest.RequireProduced(r, tx, s, func(i invoice) bool { return i.Customer == "globex" })
	require.Len(t, r.failures(), 1, "no message matches")
	require.Contains(t, r.failures()[0], "produced 1 message(s)")

	// Another transaction does not see it: it is this transaction's.
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	r = &recorder{TB: t}
	sqlstreamstest.RequireProduced(r, other, s, nil)
	require.Len(t, r.failures(), 1)
}

func TestDrainReturnsOnceTheBacklogIsEmpty(t *testing.T) {
	_, s := setup(t)
	ctx := context.Background()
	c, err := s.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	items := make([]sqlstreams.BatchItem[invoice], 50)
	for i := range items {
		items[i] = sqlstreams.BatchItem[invoice]{Msg: invoice{Customer: fmt.Sprint("c", i), Cents: int64(i)}}
	}
	_, err = s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)
	var total, handled atomic.Int64
	sqlstreamstest.Drain(ctx, t, c, func(_ context.Context, i *invoice) error {
		if i.Customer == "c7" {
			return sqlstreams.Terminal(errors.New("bad customer")) // a dead letter also empties the backlog
		}
		total.Add(i.Cents)
		handled.Add(1)
		return nil
	})
	require.EqualValues(t, 49, handled.Load())
	require.EqualValues(t, 49*50/2-7, total.Load())
	st, err := c.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Lag)
	require.EqualValues(t, 1, st.Dead)
}

func TestDrainFailsWhenTheBacklogDoesNotEmpty(t *testing.T) {
	_, s := setup(t)
	c, err := s.Consumer("billing").Register(context.Background(), nil)
	require.NoError(t, err)
	_, err = s.Produce(context.Background(), invoice{Customer: "stuck"}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	entered := make(chan struct{})
	var once sync.Once
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sqlstreamstest.DrainWith(ctx, r, c, func(hctx context.Context, _ *invoice) error {
			once.Do(func() { close(entered) })
			<-hctx.Done() // never finishes on its own
			return hctx.Err()
		}, &sqlstreamstest.DrainOptions{Consume: &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond,
			DisableManager: true, ShutdownTimeout: time.Millisecond}})
	}()
	<-entered
	cancel()
	<-done
	require.Len(t, r.failures(), 1)
	require.Contains(t, r.failures()[0], `the backlog of "billing" was not empty`)
	require.Contains(t, r.failures()[0], "lag 1")
}
