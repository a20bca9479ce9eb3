package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/console"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestPageTimes measures (and asserts nothing about) the server time of the
// console's pages with 100 groups and 10,000 dead letters, for
// BENCHMARKS.md: SQLSTREAMS_CONSOLE_PAGES=1 go test -run TestPageTimes -v ./console
func TestPageTimes(t *testing.T) {
	if os.Getenv("SQLSTREAMS_CONSOLE_PAGES") == "" {
		t.Skip("a measurement: set SQLSTREAMS_CONSOLE_PAGES=1")
	}
	ctx := context.Background()
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	s := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	dead, err := s.Consumer("dead").Register(ctx, nil)
	require.NoError(t, err)
	for i := range 99 {
		_, err := s.Consumer(fmt.Sprint("g", i)).Register(ctx, nil)
		require.NoError(t, err)
	}
	const n = 10000
	for sent := 0; sent < n; sent += 1000 {
		items := make([]sqlstreams.BatchItem[order], 1000)
		for i := range items {
			items[i] = sqlstreams.BatchItem[order]{Msg: order{ID: fmt.Sprint(sent + i)}}
		}
		_, err := s.ProduceBatch(ctx, items, nil)
		require.NoError(t, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	var seen atomic.Int64
	require.NoError(t, dead.Consume(cctx, func(context.Context, *order) error {
		if seen.Add(1) == n {
			cancel()
		}
		return sqlstreams.Terminal(errors.New("no"))
	}, &sqlstreams.ConsumeOptions{BatchLimit: 1000, MessageConcurrency: 50, DisableManager: true}))
	st, err := dead.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n, st.Dead)

	h := console.New(client, &console.Options{Authorize: func(*http.Request) console.Access { return console.Access{Read: true} }})
	for _, page := range []string{"/", "/streams/orders/groups/dead", "/streams/orders/groups/dead?after=9000", "/streams/orders/groups/dead/dead/5000"} {
		var best time.Duration
		for range 5 {
			start := time.Now()
			rec := &discard{header: http.Header{}}
			req, err := http.NewRequest(http.MethodGet, page, nil)
			require.NoError(t, err)
			h.ServeHTTP(rec, req)
			d := time.Since(start)
			require.Zero(t, rec.code, "status %d (0: 200 OK)", rec.code)
			if best == 0 || d < best {
				best = d
			}
		}
		t.Logf("page %s: best of 5 %s", page, best.Round(100*time.Microsecond))
	}
}

type discard struct {
	header http.Header
	code   int
}

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(code int) {
	if code != http.StatusOK {
		d.code = code
	}
}
