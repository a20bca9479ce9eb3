// Package pgtest gives tests a PostgreSQL database without any setup: each
// test binary gets its own throwaway cluster (see pgcluster), and each test
// its own schema, so tests can run in parallel without seeing each other's
// tables.
//
// Its few statements (dropping a test's schema, the examples' schemas) are
// here rather than in internal/store because store's own tests import
// pgtest: pgtest importing store would be an import cycle.
//
// It is a test helper, not an API for users.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgcluster"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL names the variable that points tests at an existing database
// instead, for environments that provide one (or to debug against a server
// that outlives the test run).
const EnvURL = "SQLSTREAMS_TEST_DATABASE_URL"

var (
	dbURL   string
	cluster *pgcluster.Cluster // nil when the database is external
)

// Main is meant to be the whole body of TestMain. It starts the cluster
// before any test runs and stops it afterwards even when tests fail, so the
// server's lifetime is exactly the test binary's.
func Main(m *testing.M) {
	os.Exit(run(m, ""))
}

// MainExporting is Main that also sets the environment variable env to the
// database's URL (unless it is set already) before the tests run: for
// runnable examples, which read it as a user's program would
// (SQLSTREAMS_DATABASE_URL) and import no test helper. After the tests it
// drops every schema whose name starts with dropPrefix (the examples'), so
// that an external database is left as it was.
func MainExporting(m *testing.M, env, dropPrefix string) {
	os.Exit(run(m, env, dropPrefix))
}

func run(m *testing.M, export ...string) int {
	if len(export) == 2 {
		defer exportURL(export[0], export[1])()
	}
	if u := os.Getenv(EnvURL); u != "" {
		dbURL = u
		exportHook()
		return m.Run()
	}
	// Fail loudly and at once: skipping every test when PostgreSQL is not
	// installed would make a broken environment look green.
	if _, err := pgcluster.FindBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: start PostgreSQL:", err)
		return 1
	}
	defer func() {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop PostgreSQL:", err)
		}
	}()

	// The postmaster runs in its own session, so Ctrl-C or a CI
	// cancellation would not reach it; stop it ourselves rather than leave
	// it for the next run's sweep.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "pgtest: %v: stopping PostgreSQL\n", s)
		_ = c.Stop()
		os.Exit(1)
	}()

	dbURL = c.URL("postgres")
	cluster = c
	exportHook()
	return m.Run()
}

// exportURL arranges for env to hold dbURL once it is known (m.Run reads
// it lazily through os.Getenv) and returns the cleanup that drops the
// schemas starting with prefix.
func exportURL(env, prefix string) func() {
	exported := false
	exportHook = func() {
		if os.Getenv(env) == "" {
			_ = os.Setenv(env, dbURL)
			exported = true
		}
	}
	return func() {
		if exported {
			_ = os.Unsetenv(env)
		}
		if prefix == "" || dbURL == "" || cluster != nil {
			return // a private cluster goes whole
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: drop example schemas:", err)
			return
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, "-- pgtest.exportURL\nSELECT nspname FROM pg_catalog.pg_namespace WHERE starts_with(nspname, $1)", prefix)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: drop example schemas:", err)
			return
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: drop example schemas:", err)
			return
		}
		for _, n := range names {
			if _, err := conn.Exec(ctx, "-- pgtest.exportURL\nDROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE"); err != nil {
				fmt.Fprintln(os.Stderr, "pgtest: drop example schemas:", err)
			}
		}
	}
}

// exportHook, when set, runs once dbURL is known, before the tests.
var exportHook = func() {}

// ErrExternal reports that the tests run on a server the harness did not
// start (SQLSTREAMS_TEST_DATABASE_URL), which it must not restart.
var ErrExternal = errors.New("pgtest: the database is external; it is not restarted")

// Restart restarts the private cluster, cutting every session.
func Restart(ctx context.Context) error {
	if cluster == nil {
		return ErrExternal
	}
	return cluster.Restart(ctx)
}

// Stop stops the private cluster's server, cutting every session, until
// Start; mode is pg_ctl's ("fast", or "immediate" for a crash). A test that
// stops it must start it again (t.Cleanup), or every later test of the
// binary fails.
func Stop(ctx context.Context, mode string) error {
	if cluster == nil {
		return ErrExternal
	}
	return cluster.StopServer(ctx, mode)
}

// Start starts the server Stop stopped.
func Start(ctx context.Context) error {
	if cluster == nil {
		return ErrExternal
	}
	return cluster.StartServer(ctx)
}

// StopFor stops the server for the rest of t, or until the returned start
// function is called: t's cleanup starts it again in any case. It skips t
// when the database is external.
func StopFor(t testing.TB, mode string) (start func()) {
	t.Helper()
	ctx := context.Background()
	if err := Stop(ctx, mode); errors.Is(err, ErrExternal) {
		t.Skip("the database is external (SQLSTREAMS_TEST_DATABASE_URL); this test stops and starts its server")
	} else if err != nil {
		t.Fatalf("pgtest: stop PostgreSQL: %v", err)
	}
	var started bool
	start = func() {
		t.Helper()
		if started {
			return
		}
		started = true
		if err := Start(ctx); err != nil {
			t.Fatalf("pgtest: start PostgreSQL: %v", err)
		}
	}
	t.Cleanup(start)
	return start
}

// URL returns the URL of the database the tests use.
func URL() string {
	if dbURL == "" {
		panic("pgtest: no database; call pgtest.Main(m) from TestMain")
	}
	return dbURL
}

// maxIdent is PostgreSQL's NAMEDATALEN-1; longer names are silently
// truncated, which could make two "unique" names collide.
const maxIdent = 63

// Schema returns a new schema name for t and drops that schema when t ends.
// The name starts with the test's name so leftovers are easy to attribute,
// and ends with a random suffix so that reruns and parallel tests never
// collide. The schema is not created, because the code under test creates
// its own schema through its migrations.
func Schema(t testing.TB) string {
	t.Helper()
	name := schemaName(t.Name())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "drop schema if exists "+pgx.Identifier{name}.Sanitize()+" cascade"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}

func schemaName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case !strings.HasSuffix(b.String(), "_"):
			b.WriteByte('_')
		}
	}
	base := strings.Trim(b.String(), "_")
	// Identifiers must start with a letter, and pg_ is reserved for
	// system schemas.
	switch {
	case base == "":
		base = "t"
	case base[0] < 'a' || base[0] > 'z' || strings.HasPrefix(base, "pg_"):
		base = "t_" + base
	}
	var rnd [5]byte
	_, _ = rand.Read(rnd[:]) // never fails, see crypto/rand.Read
	suffix := "_" + hex.EncodeToString(rnd[:])
	if len(base) > maxIdent-len(suffix) {
		base = strings.TrimRight(base[:maxIdent-len(suffix)], "_")
	}
	return base + suffix
}

// Pool returns a connection pool on URL() that is closed when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL())
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// External reports whether the tests run on a server the harness did not
// start (SQLSTREAMS_TEST_DATABASE_URL): there a test may lack privileges
// the private cluster's superuser has.
func External() bool { return cluster == nil }
