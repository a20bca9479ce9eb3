package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/stretchr/testify/require"
)

// The unkeyed insert sends parameters encoded by internal/store/wire.go, not
// by pgx. Every column it writes is read back here, on the three paths that
// reach it: the pool, a caller's transaction, and a batch mixing idempotent
// messages (which pgx encodes).
func TestProduceWritesEveryColumnAsGiven(t *testing.T) {
	mock := clocks.NewMock()
	at := time.Date(2026, 11, 30, 12, 34, 56, 123456000, time.UTC)
	mock.Set(at)
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	s := e.stream("wire")
	row, _, err := s.resolve(ctx, nil)
	require.NoError(t, err)

	items := func(prefix string) []BatchItem[order] {
		return []BatchItem[order]{
			{Msg: order{OrderID: prefix + "-plain", Amount: 1}},
			{Msg: order{OrderID: prefix + "-keyed", Amount: 2}, RoutingKey: "orders.eu.paid", Key: "customer-7",
				Message: &MessageOptions{Concurrency: Exclusive, Timeout: 3 * time.Second}},
			{Msg: order{OrderID: prefix + `-quotes "\ é 🙂`, Amount: -3}, RoutingKey: "orders.us"},
		}
	}
	type want struct {
		id               int64
		rk, key, payload string
		options          string
		version          int
		producedAt       time.Time
	}
	var wants []want
	record := func(its []BatchItem[order], res []Produced) {
		require.Len(t, res, len(its))
		for i, it := range its {
			p, err := json.Marshal(it.Msg)
			require.NoError(t, err)
			opts, err := it.Message.encode()
			require.NoError(t, err)
			wants = append(wants, want{id: res[i].ID, rk: it.RoutingKey, key: it.Key, payload: string(p), options: string(opts), version: 1, producedAt: at})
		}
	}

	pool := items("pool")
	res, err := s.ProduceBatch(ctx, pool, nil)
	require.NoError(t, err)
	record(pool, res)

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	inTx := items("tx")
	res, err = s.ProduceBatch(ctx, inTx, &BatchOptions{Tx: tx})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	record(inTx, res)

	mixed := items("mixed")
	mixed[1].IdempotencyKey = "once"
	res, err = s.ProduceBatch(ctx, mixed, nil)
	require.NoError(t, err)
	record(mixed, res)

	for i := 1; i < len(wants); i++ {
		require.Greater(t, wants[i].id, wants[i-1].id, "ids follow item order, call after call")
	}

	rows, err := e.pool.Query(ctx, fmt.Sprintf(`SELECT id, coalesce(routing_key, '<null>'), coalesce(message_key, '<null>'),
  payload::text, coalesce(options::text, ''), version, produced_at
FROM %s.stream_%d_log ORDER BY xid, id`, e.client.Schema(), row.ID))
	require.NoError(t, err)
	var got []want
	for rows.Next() {
		var w want
		require.NoError(t, rows.Scan(&w.id, &w.rk, &w.key, &w.payload, &w.options, &w.version, &w.producedAt))
		if w.rk == "<null>" {
			w.rk = ""
		}
		if w.key == "<null>" {
			w.key = ""
		}
		w.producedAt = w.producedAt.UTC()
		got = append(got, w)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, len(wants))
	for i := range wants {
		if wants[i].options != "" {
			// stored as jsonb: compare as documents
			require.JSONEq(t, wants[i].options, got[i].options, "message %d", i)
			got[i].options = wants[i].options
		}
		require.Equal(t, wants[i], got[i], "message %d", i)
	}
}
