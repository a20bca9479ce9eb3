package store

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A stream's log partitions, the default one and each chunk the manager
// adds, are analyzed only after LogAnalyzeThreshold changed rows (decision
// 0056): every analyze that moves a partition's statistics makes each
// backend replan the stream's claim path, and autovacuum's default (50 rows)
// analyzed a small growing stream again and again.
func TestLogPartitionsAreAnalyzedOnlyAfterTheirThreshold(t *testing.T) {
	ctx := context.Background()
	st, streamID, _ := planSetup(t)
	want := fmt.Sprintf("autovacuum_analyze_threshold=%d", LogAnalyzeThreshold)
	reloptions := func(table string) []string {
		t.Helper()
		var opts []string
		require.NoError(t, st.Pool().QueryRow(ctx, `SELECT coalesce(c.reloptions, '{}') FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, st.schema, table).Scan(&opts))
		return opts
	}
	require.Contains(t, reloptions(tablePrefix(streamID)+"_log_default"), want, "the default partition")

	var xid int64
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid))
	require.NoError(t, st.AddChunk(ctx, streamID, xid+1000, xid+2000, nil))
	chunk := reloptions(chunkTable(streamID, xid+1000))
	require.Contains(t, chunk, want, "a chunk the manager adds")
	require.Contains(t, chunk, "fillfactor=100", "a chunk keeps its fill factor")
}
