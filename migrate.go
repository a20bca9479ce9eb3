package sqlstreams

import (
	"context"
	"fmt"

	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaMigrations is what a schema holds next to what this version of the
// library needs.
type SchemaMigrations struct {
	Schema string `json:"schema"`
	// Exists is false for a schema without sqlstreams tables (or none at all).
	Exists bool `json:"exists"`
	// Applied is the newest shared-table version applied, Latest the newest
	// this library carries; Applied < Latest means `sqlstreams migrate` has
	// work to do (and a client with DisableMigrate refuses to start).
	Applied int `json:"applied"`
	Latest  int `json:"latest"`
	// Streams are the registered streams' own table versions; StreamLatest
	// is this library's. A stream's tables are brought up to date when a
	// client registers it.
	Streams      []StreamMigration `json:"streams"`
	StreamLatest int               `json:"stream_latest"`
}

// StreamMigration is one stream's applied table version.
type StreamMigration struct {
	Stream  string `json:"stream"`
	Applied int    `json:"applied"`
}

// MigrationStatus reads a schema's applied versions without changing
// anything (a READ ONLY transaction); the schema need not exist.
func MigrationStatus(ctx context.Context, pool *pgxpool.Pool, schema string) (*SchemaMigrations, error) {
	st, err := store.New(pool, schema)
	if err != nil {
		return nil, err
	}
	s, err := st.MigrationStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema %s: %w", schema, err)
	}
	out := &SchemaMigrations{Schema: schema, Exists: !s.SchemaMissing, Applied: s.Applied, Latest: s.Latest, StreamLatest: s.StreamLatest}
	for _, m := range s.Streams {
		out.Streams = append(out.Streams, StreamMigration{Stream: m.Name, Applied: m.Applied})
	}
	return out, nil
}

// SchemaSQL returns the DDL of schema's shared tables as one script, for
// applications that run their migrations with their own tool (goose,
// golang-migrate, Atlas) and start their clients with DisableMigrate. Each
// version is guarded, so the script may run again after an upgrade. What
// it does not hold, the library still runs at run time: a stream's own
// tables are created when a stream is first registered, and the manager
// adds and drops a stream's log partitions.
func SchemaSQL(schema string) (string, error) {
	st, err := store.New(nil, schema)
	if err != nil {
		return "", err
	}
	return st.SchemaSQL()
}

// Throwaway schemas: a tool or a test that works in a schema of its own
// creates it with CreateSchema, which proves the schema is its own, and
// drops it with DropSchema when it is done (the CLI's demo, sqlstreamstest).
// An application's schema is created by NewClient or `sqlstreams migrate`.

// ErrSchemaExists: CreateSchema found a schema of that name already there.
var ErrSchemaExists = store.ErrSchemaExists

// Conn is what the schema functions run their statement on: a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SchemaExists reports whether a schema named name exists, reading the
// catalog; it runs no DDL and name need not be valid (an invalid one does
// not exist).
func SchemaExists(ctx context.Context, db Conn, name string) (bool, error) {
	return store.SchemaExists(ctx, db, name)
}

// CreateSchema creates the empty schema name (ValidateSchema's rule), and
// fails with ErrSchemaExists when one of that name is there already: nil
// proves the schema is the caller's, created by this call, and only then
// may the caller drop it later with DropSchema.
func CreateSchema(ctx context.Context, db Conn, name string) error {
	return store.CreateSchema(ctx, db, name)
}

// DropSchema drops the schema name with everything in it (streams,
// messages, groups, and any table of the application's there), and is not
// an error when it is gone already. It is for throwaway schemas the caller
// created itself (CreateSchema, or NewClient in a test's own schema): never
// call it on a schema the caller did not make.
func DropSchema(ctx context.Context, db Conn, name string) error {
	return store.DropSchema(ctx, db, name)
}
