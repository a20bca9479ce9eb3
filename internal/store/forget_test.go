package store

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// firstLines counts the statements a pool sends by their first line.
type firstLines struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *firstLines) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	line, _, _ := strings.Cut(d.SQL, "\n")
	f.mu.Lock()
	f.n[line]++
	f.mu.Unlock()
	return ctx
}

func (f *firstLines) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (f *firstLines) count(line string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[line]
}

// A reconcile tick that finds nothing to let go only looks: the statement
// that lets go (locks, writes, and 1–2 ms to plan for a stream new to the
// backend) runs only when the look finds a lease the claimer does not know.
func TestAReconcileThatFindsNothingToLetGoOnlyLooks(t *testing.T) {
	ctx := context.Background()
	lines := &firstLines{n: map[string]int{}}
	pool := ownPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = lines })
	st, streamID, groupID := planSetupOn(t, pool)
	var err error
	g := st.Group(streamID, groupID)
	const owner = "00000000-0000-4000-8000-000000000001"
	_, err = st.Produce(ctx, nil, StreamRef{ID: streamID}, []NewMessage{{Version: 1, Payload: []byte(`{"a":1}`)}}, nil)
	require.NoError(t, err)
	r, ok, err := g.ClaimRange(ctx, ClaimParams{Owner: owner, Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, ok)

	const look, letGo = "-- store.ForgetUnknownRanges: anything to let go", "-- store.ForgetUnknownRanges"
	ranges, leases, err := g.ForgetUnknownRanges(ctx, ForgetRanges{Owner: owner, Ranges: []int64{r.ID}})
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 0}, [2]int64{ranges, leases})
	require.Equal(t, [2]int{1, 0}, [2]int{lines.count(look), lines.count(letGo)}, "the range is known: looked, nothing let go")

	ranges, _, err = g.ForgetUnknownRanges(ctx, ForgetRanges{Owner: owner})
	require.NoError(t, err)
	require.Equal(t, int64(1), ranges, "a range the claimer does not know is let go")
	require.Equal(t, [2]int{2, 1}, [2]int{lines.count(look), lines.count(letGo)})

	ranges, _, err = g.ForgetUnknownRanges(ctx, ForgetRanges{Owner: owner})
	require.NoError(t, err)
	require.Zero(t, ranges, "expired now: nothing left to let go")
	require.Equal(t, [2]int{3, 1}, [2]int{lines.count(look), lines.count(letGo)})
}
