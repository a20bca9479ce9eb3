package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

type order struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

type orderV2 struct {
	OrderID string `json:"order_id"`
}

func (orderV2) SchemaVersion() int { return 2 }

func (e *env) stream(name string) *StreamHandle[order] {
	e.t.Helper()
	s := Stream[order](e.client, name)
	require.NoError(e.t, s.Register(context.Background(), nil))
	return s
}

func (e *env) count(s *StreamHandle[order]) int64 {
	e.t.Helper()
	row, _, err := s.resolve(context.Background(), nil)
	require.NoError(e.t, err)
	n, err := storetest.CountLog(context.Background(), e.client.store, row.ID)
	require.NoError(e.t, err)
	return n
}

func TestNewClientRejectsBadSchema(t *testing.T) {
	for _, schema := range []string{"Bad", "a-b", "1abc", `x"; drop table y; --`, strings.Repeat("a", 64)} {
		_, err := NewClient(context.Background(), (*pgxpool.Pool)(nil), &ClientConfig{Schema: schema})
		require.ErrorIs(t, err, ErrInvalidSchema, schema)
		require.Contains(t, err.Error(), strconv.Quote(schema))
	}
}

func TestConcurrentMigrationsAreIdempotent(t *testing.T) {
	e := newEnv(t, nil) // migrates once
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = NewClient(context.Background(), e.pool, &ClientConfig{Schema: e.client.Schema()})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	// A fresh schema migrated by many at once: every migration is applied once.
	fresh := e.client.Schema() + "_b"
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+fresh+" CASCADE") })
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = NewClient(context.Background(), e.pool, &ClientConfig{Schema: fresh})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var n, max int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT count(*), max(version) FROM "+fresh+".schema_migration").Scan(&n, &max))
	require.Equal(t, max, n, "each version recorded exactly once")
	require.GreaterOrEqual(t, n, 1)
}

func TestStreamRegisterIsIdempotentAndValidatesNames(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders.created")
	require.NoError(t, s.Register(ctx, nil))
	other := Stream[order](e.client, "orders.created")
	require.NoError(t, other.Register(ctx, nil))
	r1, _, _ := s.resolve(ctx, nil)
	r2, _, _ := other.resolve(ctx, nil)
	require.Equal(t, r1.ID, r2.ID)

	for _, bad := range []string{"", "has space", "-lead", "semi;colon", strings.Repeat("x", 129), "quote'"} {
		err := Stream[order](e.client, bad).Register(ctx, nil)
		require.ErrorIs(t, err, ErrInvalidName, bad)
		require.Contains(t, err.Error(), bad)
	}
	err := Stream[order](e.client, "big").Register(ctx, &StreamConfig{MaxMessageBytes: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)

	_, err = Stream[order](e.client, "never.registered").Produce(ctx, order{}, nil)
	require.ErrorIs(t, err, ErrNotRegistered)
}

func TestProduceRejectsBadInputAndWritesNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")

	for _, key := range conformance(t, "invalid-routing-keys.txt") {
		_, err := s.Produce(ctx, order{OrderID: "1"}, &ProduceOptions{RoutingKey: key})
		require.ErrorIs(t, err, ErrInvalidRoutingKey, "routing key %q", key)
		require.Contains(t, err.Error(), key)
		// A batch with one bad key writes none of its messages.
		_, err = s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "ok"}}, {Msg: order{}, RoutingKey: key}}, nil)
		require.ErrorIs(t, err, ErrInvalidRoutingKey)
	}
	_, err := s.Produce(ctx, order{}, &ProduceOptions{Key: "bad\x00key"})
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = s.Produce(ctx, order{}, &ProduceOptions{IdempotencyKey: strings.Repeat("k", 300)})
	require.ErrorIs(t, err, ErrInvalidKey)

	small := Stream[order](e.client, "small")
	require.NoError(t, small.Register(ctx, &StreamConfig{MaxMessageBytes: 64}))
	_, err = small.Produce(ctx, order{OrderID: strings.Repeat("x", 100)}, nil)
	require.ErrorIs(t, err, ErrMessageTooLarge)
	require.NotContains(t, err.Error(), "xxxx", "no payload in errors")

	type unencodable struct{ C chan int }
	bad := Stream[unencodable](e.client, "orders")
	_, err = bad.Produce(ctx, unencodable{C: make(chan int)}, nil)
	require.ErrorIs(t, err, ErrEncode)

	_, err = s.Produce(ctx, order{}, &ProduceOptions{Message: &MessageOptions{Timeout: -1}})
	require.ErrorIs(t, err, ErrInvalidConfig)

	require.Zero(t, e.count(s))
	require.Zero(t, e.count(small))

	_, err = s.Produce(ctx, order{OrderID: "fine"}, &ProduceOptions{RoutingKey: "payments.card.eu"})
	require.NoError(t, err)
	require.EqualValues(t, 1, e.count(s))
}

func TestProduceBatchIdempotentAndOptions(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")

	items := []BatchItem[order]{
		{Msg: order{OrderID: "a"}, RoutingKey: "orders.eu", Key: "cust-1"},
		{Msg: order{OrderID: "b"}, IdempotencyKey: "idem-b"},
		{Msg: order{OrderID: "c"}, Message: &MessageOptions{Timeout: 5e9}},
	}
	res, err := s.ProduceBatch(ctx, items, &BatchOptions{Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 3}}})
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Less(t, res[0].ID, res[2].ID, "ids follow the batch order")
	for _, r := range res {
		require.False(t, r.Duplicate)
	}

	again, err := s.Produce(ctx, order{OrderID: "b2"}, &ProduceOptions{IdempotencyKey: "idem-b"})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, res[1].ID, again.ID)
	require.EqualValues(t, 3, e.count(s))

	row, _, _ := s.resolve(ctx, nil)
	var opts string
	require.NoError(t, e.pool.QueryRow(ctx,
		"SELECT options::text FROM "+e.client.Schema()+".stream_"+strconv.FormatInt(row.ID, 10)+"_log WHERE id = $1", res[2].ID).Scan(&opts))
	require.JSONEq(t, `{"timeout":"5s","retry":{"max_retries":3}}`, opts, "producer defaults merged under the message's own, sparse")
}

func TestProduceInCallerTransaction(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "rolled-back"}, &ProduceOptions{Tx: tx})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, e.count(s))

	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "x"}}, {Msg: order{OrderID: "y"}, IdempotencyKey: "k"}}, &BatchOptions{Tx: tx})
		if err != nil {
			return err
		}
		if n := e.count(s); n != 0 {
			return errors.New("messages visible before commit")
		}
		return nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 2, e.count(s))
}

// A JSON null is not a message: Produce refuses it with ErrEncode, whatever
// the stream's type lets through (a nil pointer, a nil or "null"
// RawMessage, a nil any), and writes nothing of its batch. A consumer of a
// struct type would otherwise be handed a zero value.
func TestANullPayloadIsRefused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	counted := e.stream("orders")
	ptr := Stream[*order](e.client, "orders")
	raw := Stream[json.RawMessage](e.client, "orders")
	anything := Stream[any](e.client, "orders")
	for name, produce := range map[string]func() error{
		"nil pointer":   func() error { _, err := ptr.Produce(ctx, nil, nil); return err },
		"nil raw":       func() error { _, err := raw.Produce(ctx, nil, nil); return err },
		"raw null":      func() error { _, err := raw.Produce(ctx, json.RawMessage(" null "), nil); return err },
		"nil any":       func() error { _, err := anything.Produce(ctx, nil, nil); return err },
		"typed nil any": func() error { _, err := anything.Produce(ctx, (*order)(nil), nil); return err },
		"a schedule's payload": func() error {
			return e.client.Scheduler("nightly").Register(ctx, "orders", "@daily", (*order)(nil), nil)
		},
		"a batch's second item": func() error {
			_, err := ptr.ProduceBatch(ctx, []BatchItem[*order]{{Msg: &order{OrderID: "a"}}, {Msg: nil}}, nil)
			return err
		},
	} {
		err := produce()
		require.ErrorIs(t, err, ErrEncode, name)
		require.ErrorContains(t, err, "JSON null", name)
	}
	require.Zero(t, e.count(counted), "nothing written")
	_, err := ptr.Produce(ctx, &order{OrderID: "a"}, nil)
	require.NoError(t, err, "a pointer to a message is one")
	_, err = raw.Produce(ctx, json.RawMessage(`{"order_id":"b"}`), nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, e.count(counted))
}
