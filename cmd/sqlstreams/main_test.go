package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// unreachableURL names a database nothing listens on: a verb that tried to
// connect would fail with a connection error, not the one a test expects.
const unreachableURL = "postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=1"

// demoArgs make a demo run that ends within about a second.
var demoArgs = []string{"demo", "-duration", "300ms", "-rate", "200", "-backlog", "50", "-linger", "0s"}

func TestUsageAndBadCommands(t *testing.T) {
	var out bytes.Buffer
	require.Error(t, run(nil, &out))
	require.Contains(t, out.String(), "sqlstreams demo")
	out.Reset()
	require.ErrorContains(t, run([]string{"explode"}, &out), `unknown command "explode"`)
	require.NoError(t, run([]string{"help"}, &out))
	require.ErrorContains(t, run([]string{"demo", "-rate", "0"}, &out), "must be positive")
	require.ErrorContains(t, run([]string{"demo", "-backlog", "-1"}, &out), "-backlog must not be negative")
	require.ErrorContains(t, run([]string{"demo", "-nope"}, &out), "demo: flag provided but not defined: -nope")
	t.Setenv("SQLSTREAMS_DATABASE_URL", "")
	require.ErrorContains(t, run([]string{"migrate"}, &out), "SQLSTREAMS_DATABASE_URL")
	require.ErrorContains(t, run([]string{"manager"}, &out), "SQLSTREAMS_DATABASE_URL")
}

// -h, -help and --help print the verb's usage and succeed (exit 0), for
// every verb and for the command itself, and do nothing else: the database
// URL points nowhere, so a verb that tried to connect would fail.
func TestEveryVerbsHelpPrintsUsageAndSucceeds(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", unreachableURL)
	for _, verb := range verbs {
		for _, h := range []string{"-h", "-help", "--help"} {
			var out bytes.Buffer
			require.NoError(t, runCtx(context.Background(), []string{verb, h}, &out), "%s %s", verb, h)
			require.Contains(t, out.String(), "usage: sqlstreams "+verb, "%s %s", verb, h)
		}
		var out bytes.Buffer
		require.NoError(t, runCtx(context.Background(), []string{"help", verb}, &out), "help %s", verb)
		require.Contains(t, out.String(), "usage: sqlstreams "+verb)
	}
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), []string{"demo", "-h"}, &out))
	require.Contains(t, out.String(), "-schema", "a verb's usage lists its flags")
	for _, h := range []string{"-h", "--help", "help"} {
		out.Reset()
		require.NoError(t, runCtx(context.Background(), []string{h}, &out), h)
		for _, verb := range verbs {
			require.Contains(t, out.String(), "sqlstreams "+verb, h)
		}
	}
	require.ErrorContains(t, runCtx(context.Background(), []string{"help", "typo"}, &out), `help: unknown command "typo"`)
}

// A positional argument no verb takes is an error naming it, before the
// verb does anything (the database URL points nowhere).
func TestEveryVerbRejectsUnexpectedArguments(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", unreachableURL)
	for _, args := range [][]string{
		{"demo", "typo"},
		{"demo", "-rate", "10", "typo"},
		{"migrate", "up", "typo"},
		{"migrate", "-schema", "sqlstreams", "status", "typo"},
		{"manager", "typo"},
		{"manager", "-schema", "sqlstreams", "typo"},
		{"explain", "SQL0059", "typo"},
		{"explain", "SQL0059", "-o", "json", "typo"},
		{"help", "demo", "typo"},
	} {
		var out bytes.Buffer
		err := runCtx(context.Background(), args, &out)
		require.EqualError(t, err, args[0]+`: unexpected argument "typo"`, "%q", args)
		require.Empty(t, out.String(), "%q printed output", args)
	}
	err := runCtx(context.Background(), []string{"manager", "a", "b"}, io.Discard)
	require.EqualError(t, err, `manager: unexpected arguments "a" "b"`)
}

// The demo validates -schema before anything runs: an injected statement in
// the name is refused, nothing connects or prints, and the statement never
// executes. migrate and manager validate theirs the same way.
func TestInjectedSchemaNameIsRefusedBeforeAnythingRuns(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	const injected = "x; CREATE TABLE injected(i int); --"
	for _, verb := range []string{"demo", "migrate", "manager"} {
		var out bytes.Buffer
		err := runCtx(context.Background(), []string{verb, "-schema", injected}, &out)
		require.ErrorContains(t, err, verb+": -schema: ")
		require.ErrorContains(t, err, "must be a lower-case SQL identifier", "the error names the rule")
		require.Empty(t, out.String(), "%s printed before refusing", verb)
	}
	pool := pgtest.Pool(t)
	var tables, schemas int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename = $1", "injected").Scan(&tables))
	require.Zero(t, tables, "the injected CREATE TABLE ran")
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = $1 OR nspname = $2", "x", injected).Scan(&schemas))
	require.Zero(t, schemas)
}

// A -schema that already exists is refused, and the demo drops nothing: the
// schema and its table are still there afterwards.
func TestDemoRefusesAnExistingSchemaAndLeavesItIntact(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "precious"}.Sanitize()+" (i int)")
	require.NoError(t, err)

	var out bytes.Buffer
	err = runCtx(ctx, append(demoArgs, "-schema", schema), &out)
	require.ErrorContains(t, err, `demo: -schema: schema "`+schema+`" already exists`)
	require.NotContains(t, err.Error(), "\n", "the CLI's error is one line")
	require.True(t, schemaExists(t, pool, schema), "the demo dropped a schema it did not create")
	var tables int
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = 'precious'", schema).Scan(&tables))
	require.Equal(t, 1, tables, "the demo touched the existing schema's table")
	require.NotContains(t, out.String(), "dropped schema")
}

// Without -schema the demo runs in a fresh sqlstreams_demo_<8 hex> schema,
// says which (and which database, password masked), and drops it at the
// end: no such schema is left behind.
func TestDemoRunsInAFreshSchemaAndLeavesNoneBehind(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	pool := pgtest.Pool(t)
	before := demoSchemas(t, pool)
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), demoArgs, &out))
	schema := announcedSchema(t, out.String())
	require.Regexp(t, `^sqlstreams_demo_[0-9a-f]{8}$`, schema)
	require.Contains(t, out.String(), "database "+redactURL(pgtest.URL())+"\n")
	require.Contains(t, out.String(), "\ndone: produced ")
	require.Contains(t, out.String(), "dropped schema "+schema+"\n")
	require.False(t, schemaExists(t, pool, schema))
	require.Equal(t, before, demoSchemas(t, pool), "a sqlstreams_demo_ schema was left behind")
}

// A -schema that does not exist yet is the demo's own: it creates it and
// drops it at the end.
func TestDemoCreatesANamedNewSchemaAndDropsIt(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	schema := pgtest.Schema(t)
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), append(demoArgs, "-schema", schema), &out))
	require.Equal(t, schema, announcedSchema(t, out.String()))
	require.Contains(t, out.String(), "dropped schema "+schema+"\n")
	require.False(t, schemaExists(t, pgtest.Pool(t), schema))
}

// An interrupted demo still drops the schema it created.
func TestDemoDropsItsSchemaWhenInterrupted(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runCtx(ctx, []string{"demo", "-duration", "1h", "-rate", "100", "-backlog", "10"}, pw)
		_ = pw.Close()
		done <- err
	}()
	r := bufio.NewReader(pr)
	var seen strings.Builder
	for !strings.HasPrefix(lastLine(seen.String()), "producing ") {
		line, err := r.ReadString('\n')
		seen.WriteString(line)
		require.NoError(t, err, "the demo ended before producing:\n%s", seen.String())
	}
	schema := announcedSchema(t, seen.String())
	require.True(t, schemaExists(t, pool, schema), "the demo runs in the schema it announced")
	// The console is up while the demo runs.
	m := regexp.MustCompile(`console \(read-only\) on (http://127\.0\.0\.1:\d+/)`).FindStringSubmatch(seen.String())
	require.NotNil(t, m, seen.String())
	res, err := http.Get(m[1])
	require.NoError(t, err)
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(page), "orders.placed")
	cancel()
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	require.ErrorIs(t, <-done, context.Canceled)
	require.Contains(t, string(rest), "dropped schema "+schema+"\n")
	require.False(t, schemaExists(t, pool, schema), "the interrupted demo left its schema behind")
}

// manager runs no DDL: a schema migrate has not set up (a misspelled
// -schema) is a one-line error naming sqlstreams migrate, and no schema is
// created.
func TestManagerRefusesAnUnmigratedSchemaAndCreatesNothing(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	schema := pgtest.Schema(t)
	err := runCtx(context.Background(), []string{"manager", "-schema", schema}, io.Discard)
	require.ErrorContains(t, err, `schema "`+schema+`" has no sqlstreams tables`)
	require.ErrorContains(t, err, "sqlstreams migrate -schema "+schema)
	require.NotContains(t, err.Error(), "\n", "the CLI's error is one line")
	require.False(t, schemaExists(t, pgtest.Pool(t), schema), "manager created the schema")
}

// migrate validates -schema before it connects: the URL points nowhere, and
// the error is about the flag, not the connection.
func TestMigrateValidatesSchemaBeforeConnecting(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", unreachableURL)
	for _, bad := range []string{"Sqlstreams", "pg_catalog", ""} {
		err := runCtx(context.Background(), []string{"migrate", "-schema", bad}, io.Discard)
		require.ErrorContains(t, err, "migrate: -schema: ", "%q", bad)
	}
}

// The manager verb runs on a schema migrate set up, runs until its context
// ends, and then returns cleanly.
func TestManagerVerbRunsUntilStopped(t *testing.T) {
	schema := pgtest.Schema(t)
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	var out bytes.Buffer
	require.ErrorContains(t, runCtx(context.Background(), []string{"manager", "-schema", "no; drop"}, &out), "schema")
	require.NoError(t, runCtx(context.Background(), []string{"migrate", "-schema", schema}, &out))
	require.Equal(t, "schema "+schema+" is up to date\n", out.String())
	var tables int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'worker_config'", schema).Scan(&tables))
	require.Equal(t, 1, tables, "migrate created the schema's tables")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runCtx(ctx, []string{"manager", "-schema", schema, "-instance-ttl", "3s"}, pw)
		_ = pw.Close()
		done <- err
	}()
	r := bufio.NewReader(pr)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "manager running on schema "+schema+" (stop with Ctrl-C)\n", line)
	cancel()
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, "manager stopped\n", string(rest))
	require.NoError(t, <-done)
}

// explain finds a code however it is spelled and prints all it knows.
func TestExplainFindsACodeByAnySpelling(t *testing.T) {
	c, ok := codes.Lookup("SQL0059")
	require.True(t, ok)
	for _, id := range []string{"SQL0059", "sql0059", "59"} {
		var out bytes.Buffer
		require.NoError(t, runCtx(context.Background(), []string{"explain", id}, &out), id)
		text := out.String()
		require.True(t, strings.HasPrefix(text, "SQL0059  WARN  "+c.Title+"\n"), "%s:\n%s", id, text)
		flat := strings.Join(strings.Fields(text), " ")
		require.Contains(t, flat, c.Meaning, id)
		require.Contains(t, flat, "What to do: "+c.Remedy, id)
	}
}

// An unknown code is an error naming it.
func TestExplainRefusesAnUnknownCode(t *testing.T) {
	var out bytes.Buffer
	require.ErrorContains(t, runCtx(context.Background(), []string{"explain", "SQL9999"}, &out), `explain: unknown code "SQL9999"`)
	require.Empty(t, out.String())
	require.ErrorContains(t, runCtx(context.Background(), []string{"explain", "-o", "yaml"}, &out), "explain: -o must be text or json")
}

// Without a code explain lists every code with its level and title.
func TestExplainListsEveryCode(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), []string{"explain"}, &out))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Regexp(t, `^CODE\s+LEVEL\s+TITLE$`, lines[0])
	all := codes.All()
	require.Len(t, lines, 1+len(all))
	for i, c := range all {
		require.Regexp(t, `^`+c.ID+`\s+`+regexp.QuoteMeta(c.Level.String())+`\s+`+regexp.QuoteMeta(c.Title)+`$`, lines[1+i])
	}
}

// -o json prints an object for one code and an array for all, both valid
// JSON; the flag may come before or after the code.
func TestExplainPrintsJSON(t *testing.T) {
	for _, args := range [][]string{{"explain", "-o", "json", "sql0059"}, {"explain", "59", "-o", "json"}} {
		var out bytes.Buffer
		require.NoError(t, runCtx(context.Background(), args, &out))
		var one codeJSON
		require.NoError(t, json.Unmarshal(out.Bytes(), &one), out.String())
		require.Equal(t, "SQL0059", one.Code)
		require.Equal(t, "WARN", one.Level)
		require.NotEmpty(t, one.Title)
		require.NotEmpty(t, one.Meaning)
		require.NotEmpty(t, one.Remedy)
	}
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), []string{"explain", "-o", "json"}, &out))
	var all []codeJSON
	require.NoError(t, json.Unmarshal(out.Bytes(), &all), out.String())
	require.Len(t, all, len(codes.All()))
	for i, c := range codes.All() {
		require.Equal(t, c.ID, all[i].Code)
	}
}

// The demo prints the database it uses with any password masked.
func TestRedactURLMasksPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@db.example:5432/app?sslmode=require": "postgres://u:xxxxx@db.example:5432/app?sslmode=require",
		"postgresql://u@db/app?password=secret":                   "postgresql://u@db/app?password=xxxxx",
		"postgres://u@127.0.0.1:5432/postgres":                    "postgres://u@127.0.0.1:5432/postgres",
		"host=db user=u password=secret dbname=app":               "host=db user=u password=xxxxx dbname=app",
		"host=db password = 'se cret' sslpassword=k dbname=app":   "host=db password = xxxxx sslpassword=xxxxx dbname=app",
	} {
		got := redactURL(in)
		require.Equal(t, want, got, in)
		require.NotContains(t, got, "secret")
		require.NotContains(t, got, "se cret")
	}
}

func schemaExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", name).Scan(&exists))
	return exists
}

// demoSchemas lists the schemas named like the demo's fresh ones.
func demoSchemas(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT nspname FROM pg_catalog.pg_namespace WHERE starts_with(nspname, $1) ORDER BY nspname", demoSchemaPrefix)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

var announced = regexp.MustCompile(`(?m)^schema (\S+) \(created by this run, dropped when it ends\)$`)

// announcedSchema returns the schema the demo's output says it uses.
func announcedSchema(t *testing.T, out string) string {
	t.Helper()
	m := announced.FindStringSubmatch(out)
	require.NotNil(t, m, "the demo did not announce its schema:\n%s", out)
	return m[1]
}

func lastLine(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}

// The command the demo tells the user to run from another terminal is one
// that runs: `go run ./cmd/sqlstreams` under `go run` (make demo), the bare
// name when the shell found the binary on the PATH, else the binary's own
// path (issue 60: it printed `sqlstreams`, which make demo does not
// install).
func TestDemoPrintsACommandThatRuns(t *testing.T) {
	for _, c := range []struct{ exe, arg0, want string }{
		{"/tmp/go-build2471/b001/exe/sqlstreams", "/tmp/go-build2471/b001/exe/sqlstreams", "go run ./cmd/sqlstreams"},
		{"/usr/local/bin/sqlstreams", "sqlstreams", "sqlstreams"},
		{"/home/u/bin/sqlstreams", "./sqlstreams", "/home/u/bin/sqlstreams"},
	} {
		require.Equal(t, c.want, selfCommand(c.exe, c.arg0), "%+v", c)
	}
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), demoArgs, &out))
	require.Contains(t, out.String(), "' go run ./cmd/sqlstreams groups describe orders.placed -schema sqlstreams_demo_",
		"run in a test binary, as under go run")
}
