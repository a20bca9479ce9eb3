package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestUsageAndBadCommands(t *testing.T) {
	var out bytes.Buffer
	require.Error(t, run(nil, &out))
	require.Contains(t, out.String(), "sqlstreams demo")
	out.Reset()
	require.ErrorContains(t, run([]string{"explode"}, &out), `unknown command "explode"`)
	require.NoError(t, run([]string{"help"}, &out))
	require.ErrorContains(t, run([]string{"demo", "-rate", "0"}, &out), "must be positive")
	t.Setenv("SQLSTREAMS_DATABASE_URL", "")
	require.ErrorContains(t, run([]string{"migrate"}, &out), "SQLSTREAMS_DATABASE_URL")
	require.ErrorContains(t, run([]string{"manager"}, &out), "SQLSTREAMS_DATABASE_URL")
}

// The manager verb migrates the schema, runs until its context ends, and
// then returns cleanly.
func TestManagerVerbRunsUntilStopped(t *testing.T) {
	schema := pgtest.Schema(t)
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	var out bytes.Buffer
	require.ErrorContains(t, runCtx(context.Background(), []string{"manager", "-schema", "no; drop"}, &out), "schema")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runCtx(ctx, []string{"manager", "-schema", schema, "-instance-ttl", "3s"}, pw)
		_ = pw.Close()
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "manager running on schema "+schema+" (stop with Ctrl-C)\n", line)
	var tables int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'worker_config'", schema).Scan(&tables))
	require.Equal(t, 1, tables, "the schema was migrated before the manager ran")
	cancel()
	rest, err := io.ReadAll(pr)
	require.NoError(t, err)
	require.Equal(t, "manager stopped\n", string(rest))
	require.NoError(t, <-done)
}
