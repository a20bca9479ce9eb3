package sqlstreams

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/pgcluster"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statementLog is a pgx tracer that records the text of every statement a
// pool runs (queries, batches, prepares, copies) and every connection it
// opens, so a test can say what reached that pool and what never did.
type statementLog struct {
	mu       sync.Mutex
	sqls     []string
	connects int
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sqls = append(l.sqls, sql)
}

func (l *statementLog) snapshot() (sqls []string, connects int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.sqls...), l.connects
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (l *statementLog) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	l.add(d.SQL)
	return ctx
}
func (l *statementLog) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}
func (l *statementLog) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	l.add("COPY " + d.TableName.Sanitize())
	return ctx
}
func (l *statementLog) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
func (l *statementLog) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.connects++
	return ctx
}
func (l *statementLog) TraceConnectEnd(context.Context, pgx.TraceConnectEndData) {}

// callerComment is the caller's name every store statement starts with.
var callerComment = regexp.MustCompile(`-- (store\.[A-Za-z.]+)`)

// callers returns the caller names of the statements sqls ran, counted.
func callers(sqls []string) map[string]int {
	out := map[string]int{}
	for _, s := range sqls {
		if m := callerComment.FindStringSubmatch(s); m != nil {
			out[m[1]]++
		} else {
			out[strings.ToLower(strings.Fields(s + " ?")[0])]++ // begin, commit, rollback…
		}
	}
	return out
}

// writePathCallers are the caller names of every statement of the store's
// files that claim, commit, record progress, renew and register instances,
// lease keys, run exceptions, produce, listen and maintain: read from the
// source, so a statement added there later is covered too.
func writePathCallers(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range []string{"claim", "commit", "progress", "instance", "keys", "exception", "produce", "wire",
		"listen", "locks", "manager", "chunks", "schedule", "seek", "destroy", "migrate"} {
		src, err := os.ReadFile(filepath.Join("internal", "store", f+".go"))
		require.NoError(t, err)
		for _, m := range callerComment.FindAllStringSubmatch(string(src), -1) {
			out[m[1]] = true
		}
	}
	for _, must := range []string{"store.ClaimRange", "store.ReclaimRange", "store.CommitRange", "store.ReleaseRange",
		"store.RecordProgress", "store.RenewInstance", "store.InsertInstance", "store.Produce", "store.ClaimExceptions"} {
		require.True(t, out[must], "the write path's statements were read from the source: %s is missing", must)
	}
	return out
}

// operatorReadCallers are the statements ClientConfig.ReadPool may serve.
var operatorReadCallers = map[string]bool{
	"store.Reader.Read": true, "store.Status": true, "store.Committed": true, "store.ListStreams": true, "store.ListGroups": true,
	"store.LookupStream": true, "store.ReadGroupConfig": true, "store.GroupConfigLog": true, "store.GroupDeclarations": true, "store.GroupInstances": true,
	"store.DeadLetter": true, "store.ListDead": true, "store.BindingsInForce": true, "store.BindingLedger": true,
	"begin": true, "commit": true, "rollback": true,
}

// TestTheClaimPathNeverReadsFromTheReadPool gives a client a ReadPool that
// records every statement it runs (on the same database: no standby is
// needed to tell which pool a statement went to), runs a whole produce and
// consume cycle, and checks that the read pool received nothing at all
// meanwhile — no claim, reclaim, commit, progress, renewal, produce or
// config refresh, not even a connection — and then that the operator's
// reads went to it and only they did, each reporting the primary it was
// (FromReplica false, no lag).
func TestTheClaimPathNeverReadsFromTheReadPool(t *testing.T) {
	ctx := context.Background()
	log := &statementLog{}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = log
	readPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(readPool.Close)

	e, s, c := setup(t, &ClientConfig{ReadPool: readPool}, "g", 200)
	col := newCollector(200)
	sess := consume(t, c, func(_ context.Context, o *order) error {
		col.add(o.OrderID)
		return nil
	}, fast())
	within(t, col.done, "200 messages consumed")
	e.produceN(s, "n", 20) // and produced while consuming
	require.NoError(t, sess.stop(t))

	sqls, connects := log.snapshot()
	require.Empty(t, sqls, "a produce and consume cycle ran statements on the read pool")
	require.Zero(t, connects, "a produce and consume cycle opened connections on the read pool")

	st, err := c.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, ReadFrom{}, st.ReadFrom, "the read pool here is the primary")
	assert.EqualValues(t, 220, st.Head.ID)
	streams, err := e.client.Streams(ctx)
	require.NoError(t, err)
	require.Len(t, streams, 1)
	assert.False(t, streams[0].FromReplica)
	groups, err := e.client.Groups(ctx, "orders")
	require.NoError(t, err)
	require.Len(t, groups, 1)
	insp, err := c.Inspect(ctx)
	require.NoError(t, err)
	assert.False(t, insp.FromReplica)
	_, err = c.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	_, err = c.Bindings(ctx, 0)
	require.NoError(t, err)

	sqls, _ = log.snapshot()
	got := callers(sqls)
	forbidden := writePathCallers(t)
	for name, n := range got {
		assert.False(t, forbidden[name], "%s ran %d times on the read pool", name, n)
		assert.True(t, operatorReadCallers[name], "%s ran %d times on the read pool, which serves operator reads only", name, n)
	}
	for _, want := range []string{"store.Reader.Read", "store.Status", "store.ListStreams", "store.ListGroups",
		"store.ReadGroupConfig", "store.ListDead", "store.BindingLedger"} {
		assert.Positive(t, got[want], "the operator read %s went to the read pool", want)
	}
	names := make([]string, 0, len(got))
	for name := range got {
		names = append(names, name)
	}
	sort.Strings(names)
	t.Logf("read pool: %d statements, by caller: %s", len(sqls), strings.Join(names, " "))
}

// TestReadPoolOnAStandbyReportsItsLag points a client's ReadPool at a
// streaming standby of the primary it writes to: once the standby has
// replayed the primary's WAL, the group's status, inspection and the
// listings are read there, see what was produced, and say so: FromReplica
// with a known replay lag.
func TestReadPoolOnAStandbyReportsItsLag(t *testing.T) {
	ctx := context.Background()
	primary, standby := replicatedPair(t, "read pool", pgcluster.StandbyOptions{Name: "reader"})

	pool, err := pgxpool.New(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close) // before the clusters stop: cleanups run last first
	readPool, err := pgxpool.New(ctx, standby.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(readPool.Close)

	client, err := NewClient(ctx, pool, &ClientConfig{Schema: "readpool", ReadPool: readPool, Logger: slog.New(actortest.NewLogs(t))})
	require.NoError(t, err)
	s := Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	_, err = s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	items := make([]BatchItem[order], 10)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: "r-" + string(rune('a'+i))}}
	}
	_, err = s.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)
	waitReplayed(t, pool, readPool)

	g, err := client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	st, err := g.Status(ctx)
	require.NoError(t, err)
	assert.True(t, st.FromReplica, "the status was read on the standby")
	assert.False(t, st.ReplicaLagUnknown, "the standby has replayed transactions, so its lag is known")
	assert.GreaterOrEqual(t, st.ReplicaLag, time.Duration(0))
	assert.EqualValues(t, 10, st.Head.ID, "the standby replayed the produce")
	assert.EqualValues(t, 10, st.Lag)
	insp, err := g.Inspect(ctx)
	require.NoError(t, err)
	assert.True(t, insp.FromReplica)
	streams, err := client.Streams(ctx)
	require.NoError(t, err)
	require.Len(t, streams, 1)
	assert.True(t, streams[0].FromReplica)
	groups, err := client.Groups(ctx, "orders")
	require.NoError(t, err)
	require.Len(t, groups, 1)
	assert.True(t, groups[0].FromReplica)
	dead, err := g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	assert.Empty(t, dead)
	t.Logf("read pool on a standby: status read there with replay lag %s (%s after the replay wait)",
		st.ReplicaLag, st.At.Format(time.RFC3339Nano))

	// Writes still go to the primary: a produce succeeds although the read
	// pool is a standby, where it would fail (read-only transaction).
	_, err = s.Produce(ctx, order{OrderID: "after"}, nil)
	require.NoError(t, err)
}

// waitReplayed waits, polling the standby, until it has replayed the
// primary's WAL up to the primary's current insert position, bounded. Not
// pg_current_wal_lsn: that is the position written out, and with
// synchronous_commit off (the private cluster's setting) a commit that
// returned may still be in the WAL buffers, beyond it.
func waitReplayed(t *testing.T, primary, standby *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var target string
	require.NoError(t, primary.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&target))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var replayed bool
		err := standby.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", target).Scan(&replayed)
		require.NoError(t, err, "standby replay position (waiting for %s)", target)
		if replayed {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("read pool: the standby did not replay the primary's WAL up to %s within a minute", target)
		case <-tick.C:
		}
	}
}
