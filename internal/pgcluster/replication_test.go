package pgcluster

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A row committed on a primary with a synchronous standby survives the
// primary's crash: the standby, promoted, serves it to a client on the
// multi-host URL, and takes writes without waiting for a standby of its own.
func TestSynchronousStandbyKeepsACommittedRowAcrossFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own: skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := startCluster(t, Options{Replication: true})
	standby, err := primary.StartStandby(ctx, StandbyOptions{Name: "node2", Synchronous: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, standby.Stop()) })
	assert.NotEqual(t, primary.Port(), standby.Port())
	assert.FileExists(t, filepath.Join(standby.Dir(), ".s.PGSQL."+strconv.Itoa(standby.Port())), "the standby's socket is in its own dir")
	assert.Equal(t, "on", queryString(t, primary.URL(""), "show synchronous_commit"))
	assert.Equal(t, `"node2"`, queryString(t, primary.URL(""), "show synchronous_standby_names"))
	assert.Equal(t, "", queryString(t, standby.URL(""), "show synchronous_standby_names"), "the copy was taken before the primary named its standby")
	assert.Equal(t, "true", queryString(t, standby.URL(""), "select pg_is_in_recovery()::text"))

	multi := MultiHostURL("postgres", primary, standby)
	assert.Contains(t, multi, "127.0.0.1:"+strconv.Itoa(primary.Port())+",127.0.0.1:"+strconv.Itoa(standby.Port()))
	assert.Contains(t, multi, "target_session_attrs=read-write")
	assert.Equal(t, strconv.Itoa(primary.Port()), queryString(t, multi, "show port"), "the multi-host URL finds the primary first")

	execOn(t, multi, "create table kept (v text)")
	execOn(t, multi, "insert into kept values ('acknowledged')")

	killed := time.Now()
	require.NoError(t, primary.Kill(ctx))
	require.NoError(t, standby.Promote(ctx))
	t.Logf("killed the primary and promoted the standby in %s", time.Since(killed).Round(time.Millisecond))

	assert.Equal(t, strconv.Itoa(standby.Port()), queryString(t, multi, "show port"), "the multi-host URL finds the promoted node")
	assert.Equal(t, "acknowledged", queryString(t, multi, "select v from kept"))
	assert.Equal(t, "", queryString(t, multi, "show synchronous_standby_names"))
	execOn(t, multi, "insert into kept values ('after the promotion')")
	assert.Equal(t, "2", queryString(t, multi, "select count(*)::text from kept"))

	require.NoError(t, standby.Stop())
	require.NoError(t, primary.Stop(), "a killed primary stops too")
	assert.NoDirExists(t, standby.Dir())
	assert.NoDirExists(t, primary.Dir())
}

// An asynchronous standby streams without the primary waiting for it: the
// primary names no synchronous standby.
func TestAsynchronousStandbyStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own: skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := startCluster(t, Options{Replication: true})
	standby, err := primary.StartStandby(ctx, StandbyOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, standby.Stop()) })
	assert.Equal(t, "async", queryString(t, primary.URL(""), "select sync_state from pg_stat_replication where application_name = 'standby'"))
	assert.Equal(t, "", queryString(t, primary.URL(""), "show synchronous_standby_names"))
	assert.Equal(t, "standby", queryString(t, primary.URL(""), "select slot_name::text from pg_replication_slots where active"),
		"the standby streams through its slot")
}

func TestStartStandbyNeedsAReplicationPrimary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a standby of its own: skipped with -short")
	}
	t.Parallel()
	c := startCluster(t, Options{})
	_, err := c.StartStandby(context.Background(), StandbyOptions{})
	require.ErrorContains(t, err, "Options.Replication")
	p := &Cluster{replication: true}
	_, err = p.StartStandby(context.Background(), StandbyOptions{Name: "Bad-Name"})
	require.ErrorContains(t, err, "standby name")
}

func TestMultiHostURLParses(t *testing.T) {
	a, b := &Cluster{port: 5001}, &Cluster{port: 5002}
	u := MultiHostURL("", a, b)
	cfg, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	hosts := []string{cfg.Host + ":" + strconv.Itoa(int(cfg.Port))}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host+":"+strconv.Itoa(int(f.Port)))
	}
	assert.Equal(t, "127.0.0.1:5001,127.0.0.1:5002", strings.Join(hosts, ","))
	assert.Equal(t, "postgres", cfg.Database)
	assert.NotNil(t, cfg.ValidateConnect, "target_session_attrs=read-write checks each host")
}

// execOn runs one statement on a connection of its own, bounded: on a
// primary whose synchronous standby is gone a commit never returns.
func execOn(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err)
}
