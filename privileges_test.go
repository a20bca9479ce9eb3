package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// rolePool connects as role (the test cluster trusts local connections).
func rolePool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// The split README's Privileges section documents: an owner role migrates,
// registers streams and runs the manager; an application role with only
// the GRANTs listed there produces, consumes, redrives and reads status,
// and what needs more fails with an error naming the privilege and the
// remedy.
func TestTwoRoles(t *testing.T) {
	ctx := context.Background()
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	owner, app := schema+"_owner", schema+"_app"
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	var db string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	for _, r := range []string{owner, app} {
		if _, err := admin.Exec(ctx, "CREATE ROLE "+q(r)+" LOGIN"); err != nil {
			if pgtest.External() {
				t.Skipf("the test database user cannot create roles (%v): skipped on this external database", err)
			}
			require.NoError(t, err, "the private cluster's user is a superuser")
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+q(schema)+" CASCADE")
		for _, r := range []string{app, owner} {
			_, _ = admin.Exec(ctx, "DROP OWNED BY "+q(r))
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+q(r))
		}
	})
	_, err := admin.Exec(ctx, "GRANT CREATE ON DATABASE "+q(db)+" TO "+q(owner))
	require.NoError(t, err)

	// The owner: migrates (NewClient), grants, registers the stream.
	ownerPool := rolePool(t, owner)
	ownerClient, err := NewClient(ctx, ownerPool, &ClientConfig{Schema: schema})
	require.NoError(t, err)
	for _, g := range []string{
		"GRANT USAGE ON SCHEMA %[1]s TO %[2]s",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %[1]s TO %[2]s",
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %[1]s TO %[2]s",
		"ALTER DEFAULT PRIVILEGES IN SCHEMA %[1]s GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %[2]s",
		"ALTER DEFAULT PRIVILEGES IN SCHEMA %[1]s GRANT USAGE, SELECT ON SEQUENCES TO %[2]s",
	} {
		_, err := ownerPool.Exec(ctx, fmt.Sprintf(g, q(schema), q(app)))
		require.NoError(t, err, g)
	}
	require.NoError(t, Stream[order](ownerClient, "orders").Register(ctx, nil))

	// The application: DisableMigrate, and only those grants.
	appClient, err := NewClient(ctx, rolePool(t, app), &ClientConfig{Schema: schema, DisableMigrate: true})
	require.NoError(t, err)
	orders := Stream[order](appClient, "orders")
	c, err := orders.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err, "registering a group needs no DDL")
	for _, id := range []string{"ok-1", "bad", "ok-2"} {
		_, err := orders.Produce(ctx, order{OrderID: id}, nil)
		require.NoError(t, err)
	}
	_, err = orders.Produce(ctx, order{OrderID: "once"}, &ProduceOptions{IdempotencyKey: "k-1"})
	require.NoError(t, err)
	handled := make(chan string, 16)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, func(_ context.Context, o *order) error {
			handled <- o.OrderID
			if o.OrderID == "bad" {
				return Terminal(errors.New("refused"))
			}
			return nil
		}, &ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	seen := map[string]bool{}
	for len(seen) < 4 {
		select {
		case id := <-handled:
			seen[id] = true
		case err := <-done:
			t.Fatalf("Consume as the application role returned: %v", err)
		}
	}
	cancel()
	require.NoError(t, <-done)

	g, err := appClient.Group(ctx, "orders", "billing")
	require.NoError(t, err)
	st, err := g.Status(ctx)
	require.NoError(t, err, "status as the application role")
	require.EqualValues(t, 1, st.Dead)
	require.Zero(t, st.Lag)
	dead, err := g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	ok, err := g.Redrive(ctx, dead[0].MessageID)
	require.NoError(t, err, "redrive as the application role")
	require.True(t, ok)

	// What needs more than the application's grants: creating a stream's
	// tables. The error names the privilege and what to do.
	err = Stream[order](appClient, "refunds").Register(ctx, nil)
	require.ErrorIs(t, err, ErrPermanent)
	require.ErrorContains(t, err, "permission denied")
	require.ErrorContains(t, err, "42501")
	require.ErrorContains(t, err, "schema's owner")
	// And destroying, which drops tables, even when the client allows it.
	appClient.cfg.AllowDestroy = true
	_, err = appClient.DestroyStream(ctx, "orders", nil)
	require.ErrorIs(t, err, ErrPermanent)
	require.ErrorContains(t, err, "42501")
}
