package pgtest_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ident = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

func TestPoolSelect1(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var one int
	require.NoError(t, pool.QueryRow(context.Background(), "select 1").Scan(&one))
	assert.Equal(t, 1, one)
}

func schemaExists(t *testing.T, name string) bool {
	t.Helper()
	var exists bool
	err := pgtest.Pool(t).QueryRow(context.Background(),
		"select exists (select from pg_namespace where nspname = $1)", name).Scan(&exists)
	require.NoError(t, err)
	return exists
}

func TestSchema(t *testing.T) {
	t.Parallel()
	var names []string
	for _, sub := range []string{"a", "a", "Weird Name/ünïcode--x", strings.Repeat("long", 40)} {
		t.Run(sub, func(t *testing.T) {
			name := pgtest.Schema(t)
			assert.Regexp(t, ident, name)
			assert.LessOrEqual(t, len(name), 63)
			assert.True(t, strings.HasPrefix(name, "testschema_"), name)
			names = append(names, name)

			ctx := context.Background()
			conn, err := pgx.Connect(ctx, pgtest.URL())
			require.NoError(t, err)
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "create schema "+pgx.Identifier{name}.Sanitize()+
				"; create table "+pgx.Identifier{name, "t"}.Sanitize()+" (id int)")
			require.NoError(t, err)
		})
	}
	require.Len(t, names, 4)
	for i, n := range names {
		for _, m := range names[:i] {
			assert.NotEqual(t, m, n)
		}
		assert.False(t, schemaExists(t, n), "schema %s dropped at the end of its test", n)
	}
}

func TestSchemaNotCreated(t *testing.T) {
	t.Parallel()
	name := pgtest.Schema(t)
	assert.False(t, schemaExists(t, name), "Schema only names the schema; migrations create it")
}
