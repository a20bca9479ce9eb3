package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Admin is what the schema statements below run on: a pool, a connection
// or a transaction.
type Admin interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrSchemaExists reports that CreateSchema found a schema of that name
// already there.
var ErrSchemaExists = errors.New("schema already exists")

// SchemaExists reports whether a schema named name exists in the database,
// reading pg_catalog. It runs no DDL; name is a bind parameter, so it need
// not be a valid identifier (an invalid one simply does not exist).
func SchemaExists(ctx context.Context, q Admin, name string) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, `-- store.SchemaExists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)`, name).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("check whether schema %q exists: %w", name, err)
	}
	return exists, nil
}

// CreateSchema creates the empty schema name, and fails with ErrSchemaExists
// when it is already there (no IF NOT EXISTS): a caller that gets nil knows
// the schema is its own, created by this call, and may drop it later
// without destroying anything it did not make.
func CreateSchema(ctx context.Context, q Admin, name string) error {
	if err := ValidateSchema(name); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, `-- store.CreateSchema
CREATE SCHEMA `+quote(name)); err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "42P06" { // duplicate_schema
			return fmt.Errorf("%w: schema %q", ErrSchemaExists, name)
		}
		return fmt.Errorf("create schema %q: %w", name, err)
	}
	return nil
}

// DropSchema drops the schema name and everything in it (CASCADE); a schema
// that is not there is not an error. It is for throwaway schemas a caller
// created itself (CreateSchema), such as the demo's and users' tests': never
// call it on a schema the caller did not make.
func DropSchema(ctx context.Context, q Admin, name string) error {
	if err := ValidateSchema(name); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, `-- store.DropSchema
DROP SCHEMA IF EXISTS `+quote(name)+` CASCADE`); err != nil {
		return fmt.Errorf("drop schema %q: %w", name, err)
	}
	return nil
}
