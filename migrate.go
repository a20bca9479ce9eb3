package sqlstreams

import (
	"context"
	"fmt"

	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaMigrations is what a schema holds next to what this version of the
// library needs.
type SchemaMigrations struct {
	Schema string
	// Exists is false for a schema without sqlstreams tables (or none at all).
	Exists bool
	// Applied is the newest shared-table version applied, Latest the newest
	// this library carries; Applied < Latest means `sqlstreams migrate` has
	// work to do (and a client with DisableMigrate refuses to start).
	Applied, Latest int
	// Streams are the registered streams' own table versions; StreamLatest
	// is this library's. A stream's tables are brought up to date when a
	// client registers it.
	Streams      []StreamMigration
	StreamLatest int
}

// StreamMigration is one stream's applied table version.
type StreamMigration struct {
	Stream  string
	Applied int
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
