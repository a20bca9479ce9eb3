package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/c1702965/sqlstreams/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lockKey derives the advisory-lock key that serializes migrations of one
// schema (and, with a suffix, of one stream's tables) across processes.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	h.Write([]byte("sqlstreams"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return int64(h.Sum64())
}

func (st *Store) render(sql, prefix string) string {
	r := strings.NewReplacer("{{schema}}", st.s, "{{t}}", prefix)
	return r.Replace(sql)
}

// Migrate brings the shared tables up to the newest embedded version. It holds
// a transaction-scoped advisory lock for the whole run, so concurrent
// migrators queue behind each other and the later ones find nothing to do.
func (st *Store) Migrate(ctx context.Context) (applied int, err error) {
	ms, err := migrations.Schema()
	if err != nil {
		return 0, err
	}
	err = pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "-- store.Migrate\nSELECT pg_advisory_xact_lock($1)", lockKey(st.schema)); err != nil {
			return fmt.Errorf("advisory lock: %w", err)
		}
		if _, err := tx.Exec(ctx, st.sql(`-- store.Migrate
CREATE SCHEMA IF NOT EXISTS %[1]s`)); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		if _, err := tx.Exec(ctx, st.sql(`-- store.Migrate
CREATE TABLE IF NOT EXISTS %[1]s.schema_migration (
    version     int         PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)`)); err != nil {
			return fmt.Errorf("create migration table: %w", err)
		}
		var current int
		if err := tx.QueryRow(ctx, st.sql(`-- store.Migrate
SELECT coalesce(max(version), 0) FROM %[1]s.schema_migration`)).Scan(&current); err != nil {
			return fmt.Errorf("read migration version: %w", err)
		}
		for _, m := range ms {
			if m.Version <= current {
				continue
			}
			if _, err := tx.Exec(ctx, st.render(m.SQL, "")); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, st.sql(`-- store.Migrate
INSERT INTO %[1]s.schema_migration (version, name) VALUES ($1, $2)`), m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
			applied++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("migrate schema %s: %w", st.schema, err)
	}
	return applied, nil
}

// CheckSchema verifies, without running any DDL, that the schema holds the
// shared tables this library version needs: what a client that may not
// migrate (ClientConfig.DisableMigrate) checks at start. A missing schema or
// an older version is ErrNotMigrated, naming the command that fixes it.
func (st *Store) CheckSchema(ctx context.Context) error {
	ms, err := migrations.Schema()
	if err != nil {
		return err
	}
	want := ms[len(ms)-1].Version
	remedy := fmt.Sprintf("run `sqlstreams migrate -schema %s` (SQLSTREAMS_DATABASE_URL set) as a role that may create tables in it, "+
		"or create one client without DisableMigrate", st.schema)
	v, err := st.SchemaVersion(ctx)
	if p := Permanent(err); p != nil && p.Err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && (pg.Code == "3F000" || pg.Code == "42P01") {
			return &PermanentError{Err: fmt.Errorf("%w: schema %q has no sqlstreams tables", ErrNotMigrated, st.schema), Remedy: remedy}
		}
		return p
	}
	if err != nil {
		return fmt.Errorf("check schema %s: %w", st.schema, err)
	}
	if v < want {
		return &PermanentError{Err: fmt.Errorf("%w: schema %q is at version %d and this library needs %d", ErrNotMigrated, st.schema, v, want), Remedy: remedy}
	}
	return nil
}

// SchemaVersion reports the newest applied shared-table migration.
func (st *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := st.pool.QueryRow(ctx, st.sql(`-- store.SchemaVersion
SELECT coalesce(max(version), 0) FROM %[1]s.schema_migration`)).Scan(&v)
	return v, err
}

// applyStreamTemplates creates or upgrades one stream's tables inside tx,
// under the stream's own advisory lock.
func (st *Store) applyStreamTemplates(ctx context.Context, tx pgx.Tx, streamID int64) error {
	ms, err := migrations.Stream()
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "-- store.applyStreamTemplates\nSELECT pg_advisory_xact_lock($1)",
		lockKey(st.schema, fmt.Sprint(streamID))); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, st.sql(`-- store.applyStreamTemplates
SELECT coalesce(max(version), 0) FROM %[1]s.stream_migration WHERE stream_id = $1`), streamID).Scan(&current); err != nil {
		return fmt.Errorf("read stream template version: %w", err)
	}
	prefix := tablePrefix(streamID)
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if _, err := tx.Exec(ctx, st.render(m.SQL, prefix)); err != nil {
			return fmt.Errorf("apply stream template %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, st.sql(`-- store.applyStreamTemplates
INSERT INTO %[1]s.stream_migration (stream_id, version) VALUES ($1, $2)`), streamID, m.Version); err != nil {
			return fmt.Errorf("record stream template %s: %w", m.Name, err)
		}
	}
	return nil
}

// MigrationState is what a schema holds, next to what this version needs.
type MigrationState struct {
	Applied, Latest int // shared tables: newest applied and newest embedded version
	// Streams are the registered streams' template versions.
	Streams       []StreamMigration
	StreamLatest  int
	SchemaMissing bool // no schema, or one without sqlstreams tables
}

// StreamMigration is one stream's applied template version.
type StreamMigration struct {
	Name    string
	Applied int
}

// MigrationStatus reads the applied versions, in a READ ONLY transaction. A
// schema without sqlstreams tables is SchemaMissing, not an error.
func (st *Store) MigrationStatus(ctx context.Context) (MigrationState, error) {
	var s MigrationState
	shared, err := migrations.Schema()
	if err != nil {
		return s, err
	}
	stream, err := migrations.Stream()
	if err != nil {
		return s, err
	}
	s.Latest, s.StreamLatest = shared[len(shared)-1].Version, stream[len(stream)-1].Version
	var exists bool
	err = st.readOnly(ctx, "migration status", func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `-- store.MigrationStatus
SELECT to_regclass(format('%I.schema_migration', $1::text)) IS NOT NULL`, st.schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return nil
		}
		if err := tx.QueryRow(ctx, st.sql(`-- store.MigrationStatus
SELECT coalesce(max(version), 0) FROM %[1]s.schema_migration`)).Scan(&s.Applied); err != nil {
			return err
		}
		if s.Applied == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, st.sql(`-- store.MigrationStatus
SELECT s.name, coalesce(max(m.version), 0)
FROM %[1]s.stream_config s LEFT JOIN %[1]s.stream_migration m ON m.stream_id = s.id
GROUP BY s.name ORDER BY s.name
LIMIT 10000`))
		if err != nil {
			return err
		}
		s.Streams, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamMigration, error) {
			var m StreamMigration
			err := r.Scan(&m.Name, &m.Applied)
			return m, err
		})
		return err
	})
	s.SchemaMissing = !exists
	return s, err
}

// SchemaSQL renders the shared tables' DDL as Migrate applies it, with the
// bookkeeping rows CheckSchema reads, for users who run their migrations
// with their own tool (goose, golang-migrate, Atlas). It is one script,
// safe to run once per version step: each migration is guarded by the
// version recorded in schema_migration.
func (st *Store) SchemaSQL() (string, error) {
	ms, err := migrations.Schema()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- sqlstreams shared tables for schema %s, versions 1 to %d.\n", st.schema, ms[len(ms)-1].Version)
	b.WriteString("-- Run it as the role that owns the schema. Per-stream tables are not here: the library\n")
	b.WriteString("-- creates them when a stream is first registered (Stream.Register), and its manager adds\n")
	b.WriteString("-- and drops a stream's log partitions at run time (retention).\n\n")
	b.WriteString("BEGIN;\n")
	fmt.Fprintf(&b, "-- store.SchemaSQL\nSELECT pg_advisory_xact_lock(%d);\n", lockKey(st.schema))
	b.WriteString(st.sql("-- store.SchemaSQL\nCREATE SCHEMA IF NOT EXISTS %[1]s;\n"))
	b.WriteString(st.sql(`-- store.SchemaSQL
CREATE TABLE IF NOT EXISTS %[1]s.schema_migration (
    version     int         PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
`))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %s\n", m.Name)
		// Each step runs only when its version is not recorded yet.
		fmt.Fprintf(&b, "DO $sqlstreams$ BEGIN\nIF NOT EXISTS (SELECT 1 FROM %s.schema_migration WHERE version = %d) THEN\n", st.s, m.Version)
		b.WriteString(strings.TrimSpace(st.render(m.SQL, "")) + "\n")
		fmt.Fprintf(&b, "-- store.SchemaSQL\nINSERT INTO %s.schema_migration (version, name) VALUES (%d, '%s');\nEND IF;\nEND $sqlstreams$;\n", st.s, m.Version, m.Name)
	}
	b.WriteString("\nCOMMIT;\n")
	return b.String(), nil
}
