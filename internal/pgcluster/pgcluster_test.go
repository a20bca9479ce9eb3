package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func startCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Stop()) })
	return c
}

func queryString(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var s string
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&s))
	return s
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	c := startCluster(t, Options{Log: &log})

	assert.NotEqual(t, 5432, c.Port())
	assert.Contains(t, c.URL("postgres"), "127.0.0.1:"+strconv.Itoa(c.Port()))
	assert.FileExists(t, filepath.Join(c.Dir(), ownerFile))
	assert.FileExists(t, filepath.Join(c.Dir(), ".s.PGSQL."+strconv.Itoa(c.Port())), "unix socket in the cluster dir")

	assert.Equal(t, "1", queryString(t, c.URL("postgres"), "select 1::text"))
	assert.Equal(t, "off", queryString(t, c.URL(""), "show fsync"))
	assert.Equal(t, "off", queryString(t, c.URL(""), "show synchronous_commit"))
	assert.Equal(t, "off", queryString(t, c.URL(""), "show full_page_writes"))
	assert.Equal(t, "300", queryString(t, c.URL(""), "show max_connections"))
	assert.Equal(t, "256MB", queryString(t, c.URL(""), "show shared_buffers"))
	assert.Equal(t, "127.0.0.1", queryString(t, c.URL(""), "show listen_addresses"))

	require.NoError(t, c.Stop())
	assert.NoDirExists(t, c.Dir())
	assert.NoError(t, c.Stop(), "Stop is idempotent")
	assert.Contains(t, log.String(), "database system is shut down", "server log is copied to Options.Log")
}

func TestDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own: skipped with -short")
	}
	t.Parallel()
	c := startCluster(t, Options{Durable: true})
	assert.Equal(t, "on", queryString(t, c.URL(""), "show fsync"))
	assert.Equal(t, "on", queryString(t, c.URL(""), "show synchronous_commit"))
	assert.Equal(t, "on", queryString(t, c.URL(""), "show full_page_writes"))
}

func TestSweepRemovesOrphanedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and orphans a cluster of its own: skipped with -short")
	}
	t.Parallel()
	orphan := startCluster(t, Options{})
	postmaster := readPostmasterPID(filepath.Join(orphan.Dir(), dataSubdir, "postmaster.pid"))
	require.Positive(t, postmaster)

	// Pretend the owner died: a finished child's pid is (almost surely) free.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	require.NoError(t, os.WriteFile(filepath.Join(orphan.Dir(), ownerFile), []byte(strconv.Itoa(dead.Process.Pid)), 0o644))

	// A directory whose owner is alive must survive the sweep.
	keep, err := os.MkdirTemp(filepath.Dir(orphan.Dir()), dirPattern)
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(keep) })
	require.NoError(t, os.WriteFile(filepath.Join(keep, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644))

	startCluster(t, Options{})

	assert.NoDirExists(t, orphan.Dir())
	assert.False(t, alive(postmaster), "orphaned postmaster stopped")
	assert.DirExists(t, keep)
	assert.NoError(t, orphan.Stop(), "Stop after the sweep removed the cluster")
}

func TestFindBinaries(t *testing.T) {
	dir, err := FindBinaries()
	require.NoError(t, err)
	assert.True(t, hasServerBinaries(dir), dir)
}

func TestFindBinariesMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := findBinaries(filepath.Join(t.TempDir(), "*", "bin"))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoBinaries))
	assert.Contains(t, err.Error(), "install them with: apt-get update && apt-get install -y postgresql")
}

func TestCompareVersions(t *testing.T) {
	assert.Positive(t, compareVersions("15", "9.6"))
	assert.Negative(t, compareVersions("9.6", "10"))
	assert.Zero(t, compareVersions("16", "16"))
}

func TestTail(t *testing.T) {
	var b bytes.Buffer
	for i := range 100 {
		b.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	got := tail(b.Bytes())
	assert.Contains(t, got, "line 99")
	assert.NotContains(t, got, "line 79\n")
}

func TestStopServerKeepsTheDatabaseForStartServer(t *testing.T) {
	t.Parallel()
	c := startCluster(t, Options{})
	ctx := context.Background()
	queryString(t, c.URL(""), "with t as (select 1) select 'ok'")
	conn, err := pgx.Connect(ctx, c.URL(""))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "create table kept as select 'still here'::text as v")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, c.StopServer(ctx, "fast"))
	_, err = pgx.Connect(ctx, c.URL(""))
	require.Error(t, err, "the server is down between StopServer and StartServer")
	require.NoError(t, c.StartServer(ctx))
	assert.Equal(t, "still here", queryString(t, c.URL(""), "select v from kept"))
	require.Error(t, c.StopServer(ctx, "bogus"))
}
