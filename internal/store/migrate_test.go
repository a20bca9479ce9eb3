package store

import (
	"context"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// The DDL `sqlstreams migrate sql` prints builds the schema Migrate builds:
// a client that may not migrate accepts it, running it again changes
// nothing, and Migrate then finds nothing to do.
func TestSchemaSQLBuildsWhatMigrateBuilds(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	st, err := New(pool, pgtest.Schema(t))
	require.NoError(t, err)
	before, err := st.MigrationStatus(ctx)
	require.NoError(t, err)
	require.True(t, before.SchemaMissing)
	require.Zero(t, before.Applied)
	require.Positive(t, before.Latest)

	sql, err := st.SchemaSQL()
	require.NoError(t, err)
	for range 2 {
		_, err = pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, st.CheckSchema(ctx))
	applied, err := st.Migrate(ctx)
	require.NoError(t, err)
	require.Zero(t, applied, "the script recorded every version")

	_, _, _, _, err = st.RegisterStream(ctx, "orders", []byte(`{}`), "test", nil)
	require.NoError(t, err)
	after, err := st.MigrationStatus(ctx)
	require.NoError(t, err)
	require.False(t, after.SchemaMissing)
	require.Equal(t, after.Latest, after.Applied)
	require.Equal(t, []StreamMigration{{Name: "orders", Applied: after.StreamLatest}}, after.Streams)
}
