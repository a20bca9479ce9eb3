package store

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A counting handle counts each statement the database answered, and none
// it did not: an outage reporter tells a step that reached the database
// from one that made no store call by it.
func TestCountingCountsWhatTheDatabaseAnswered(t *testing.T) {
	ctx := context.Background()
	var n atomic.Uint64
	q := counted{q: pgtest.Pool(t), n: &n}

	_, err := q.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	require.EqualValues(t, 1, n.Load(), "an Exec")

	var one int
	require.NoError(t, q.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.ErrorIs(t, q.QueryRow(ctx, "SELECT 1 WHERE false").Scan(&one), pgx.ErrNoRows)
	require.EqualValues(t, 3, n.Load(), "a row, and no row: both answers")

	rows, err := q.Query(ctx, "SELECT generate_series(1, 3)")
	require.NoError(t, err)
	for rows.Next() {
	}
	rows.Close()
	require.EqualValues(t, 4, n.Load(), "rows read to their end, once")

	var b pgx.Batch
	b.Queue("SELECT 1")
	require.NoError(t, q.SendBatch(ctx, &b).Close())
	require.EqualValues(t, 5, n.Load(), "a batch")

	_, err = q.Exec(ctx, "SELECT * FROM no_such_table")
	require.Error(t, err)
	require.EqualValues(t, 5, n.Load(), "a failed statement is not counted")
}
