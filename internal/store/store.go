// Package store holds every SQL statement sqlstreams runs. Nothing outside it
// builds SQL, so the whole database contract can be read in one place.
//
// Conventions every statement follows: it names its schema (a validated,
// quoted identifier), never selects *, starts with a comment naming its Go
// caller (visible in pg_stat_statements), passes values only as bind
// parameters, and, when it depends on time, takes an optional explicit now
// (coalesce($n, now())) so a simulator's mock clock reaches the database.
//
// It is part of the engine's inside, not an API for users.
package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier is what both a pool and a caller's transaction offer; statements
// that may run inside a user's transaction take one.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Now is an optional explicit database time. nil means the database's own
// clock, which is what production uses so that hosts' clock skew never
// decides a lease.
type Now = *time.Time

// ErrInvalidIdentifier reports a schema name that is not a plain lower-case
// SQL identifier.
var ErrInvalidIdentifier = errors.New("invalid identifier")

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema accepts only plain lower-case identifiers so the quoted form
// is also the form a person types in psql, and refuses PostgreSQL's own
// schemas (information_schema, pg_*), where tables must never be created.
func ValidateSchema(name string) error {
	if !identRe.MatchString(name) {
		return fmt.Errorf("%w: schema %q must be a lower-case SQL identifier: a letter or '_', then letters, digits or '_', at most 63 bytes", ErrInvalidIdentifier, name)
	}
	if name == "information_schema" || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("%w: schema %q is reserved for PostgreSQL's own use (information_schema, pg_*)", ErrInvalidIdentifier, name)
	}
	return nil
}

// quote returns name as a quoted SQL identifier.
func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// Store runs statements against one schema.
type Store struct {
	pool   *pgxpool.Pool
	schema string // validated, unquoted
	s      string // quoted
	// tx, when set, is the READ ONLY transaction a Reader's View runs
	// every read on (reader.go); nil on the Store the engine gets, whose
	// statements run on the pool.
	tx pgx.Tx
	// lanes, when set, run the claimers' statements (SetLanes, lanes.go).
	lanes *laneSet
}

// New returns a Store for schema on pool. It does not touch the database.
func New(pool *pgxpool.Pool, schema string) (*Store, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	return &Store{pool: pool, schema: schema, s: quote(schema)}, nil
}

// Pool returns the pool the store runs on.
func (st *Store) Pool() *pgxpool.Pool { return st.pool }

// q is where the reads a View shares with the engine run: the View's
// transaction, or the pool.
func (st *Store) q() Querier {
	if st.tx != nil {
		return st.tx
	}
	return st.pool
}

// Schema returns the store's schema name, unquoted.
func (st *Store) Schema() string { return st.schema }

// sql formats a statement with the quoted schema in place of every %[1]s.
func (st *Store) sql(format string) string { return fmt.Sprintf(format, st.s) }
