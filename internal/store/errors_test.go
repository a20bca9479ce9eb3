package store

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestDisruptedNamesDroppedConnectionsOnly(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "57P02"}, true},
		{fmt.Errorf("claim range: %w", &pgconn.PgError{Code: "08006"}), true},
		{errors.New("claim range: unexpected EOF"), true},
		{errors.New("conn closed"), true},
		{&pgconn.PgError{Code: "57P03"}, false}, // not yet accepting connections: none was dropped
		{&pgconn.PgError{Code: "40P01"}, false},
		{&pgconn.PgError{Code: "42501"}, false},
		{&pgconn.ConnectError{}, false},
		{context.DeadlineExceeded, false},
		{nil, false},
	} {
		require.Equal(t, c.want, Disrupted(c.err), "%v", c.err)
	}
}

func TestUnreachableNamesAServerOutOfReachNotABusyOne(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "57P03"}, true}, // starting up
		{fmt.Errorf("claim range: %w", &pgconn.PgError{Code: "08006"}), true},
		{errors.New("claim range: unexpected EOF"), true},
		{&pgconn.ConnectError{}, true},
		{&pgconn.PgError{Code: "53300"}, false}, // too many connections: busy
		{&pgconn.PgError{Code: "40P01"}, false},
		{&pgconn.PgError{Code: "42501"}, false},
		{context.DeadlineExceeded, false},
		{nil, false},
	} {
		require.Equal(t, c.want, Unreachable(c.err), "%v", c.err)
	}
}

// When the server drops every backend, each idle connection of the pool is
// dead and fails once when next used; one reset after the first such
// failure and every later statement runs on a fresh connection.
func TestResetIfDisruptedClearsTheDeadConnections(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 6
	cfg.ConnConfig.RuntimeParams["application_name"] = "reset-test"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	st, err := New(pool, pgtest.Schema(t))
	require.NoError(t, err)
	var conns []*pgxpool.Conn // six idle connections
	for range 6 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	var cut int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'reset-test'").Scan(&cut))
	require.Equal(t, 6, cut)

	// The first statement finds a dead connection (unless the pool pinged
	// it first: pgx pings connections idle for over a second).
	_, err = pool.Exec(ctx, "SELECT 1")
	if err != nil {
		require.True(t, Disrupted(err), "%v", err)
		st.ResetIfDisrupted(err)
	}
	for i := range 6 {
		_, err := pool.Exec(ctx, "SELECT 1")
		require.NoError(t, err, "statement %d after the reset", i)
	}
}

// A statement the server refuses every time is returned, not retried: a
// claimer whose statement had a syntax error retried it for as long as it
// ran (15 minutes of a benchmark), delivering nothing and saying nothing.
func TestAStatementTheServerRefusesIsPermanent(t *testing.T) {
	for _, code := range []string{"42601", "42804", "42P18", "42702"} {
		pe := Permanent(fmt.Errorf("range keys: %w", &pgconn.PgError{Code: code}))
		require.NotNil(t, pe, code)
		require.ErrorIs(t, pe, ErrPermanent)
	}
	for _, code := range []string{"40P01", "40001", "55P03", "57014", "53300"} {
		require.Nil(t, Permanent(&pgconn.PgError{Code: code}), "%s passes by itself", code)
	}
}
