package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// ErrPermanent is wrapped by every store error that retrying cannot fix: a
// missing schema or table, a missing privilege, a closed pool. Actors stop
// their session on it instead of retrying forever.
var ErrPermanent = errors.New("permanent store error")

// ErrNotMigrated reports a schema without the tables this library version
// needs, found by a client that may not run DDL (DisableMigrate).
var ErrNotMigrated = errors.New("schema not migrated")

// PermanentError is a store error that retrying cannot fix, with what to do
// about it.
type PermanentError struct {
	Err    error
	Remedy string
}

func (e *PermanentError) Error() string { return e.Err.Error() + "; " + e.Remedy }

// Unwrap lets errors.Is find both ErrPermanent and the cause.
func (e *PermanentError) Unwrap() []error { return []error{ErrPermanent, e.Err} }

// Permanent returns err as a *PermanentError when retrying cannot fix it,
// else nil. The classes, by SQLSTATE:
//
//   - 3F000 (no such schema), 42P01 (no such table), 42703 (no such column)
//     and 42883 (no such function): the schema is missing or older than
//     this library;
//   - 42501 (insufficient privilege), 28000 and 28P01 (authentication);
//   - 3D000 (no such database);
//   - a closed pool, and a stream whose row no longer matches (the schema
//     was dropped and recreated under the client);
//   - the rest of class 42 (a syntax error, a type mismatch): a statement
//     the server refuses every time.
//
// Everything else is transient (see Transient) or unknown, and retried.
func Permanent(err error) *PermanentError {
	if err == nil {
		return nil
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return pe
	}
	if errors.Is(err, puddle.ErrClosedPool) {
		return &PermanentError{Err: err, Remedy: "the connection pool was closed while sqlstreams used it: close the pool only after Consume has returned"}
	}
	if errors.Is(err, ErrStreamChanged) {
		return &PermanentError{Err: err, Remedy: "the schema was dropped or recreated under this client: make a new client and handles"}
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return nil
	}
	switch pg.Code {
	case "3F000", "42P01", "42703", "42883":
		return &PermanentError{Err: err, Remedy: "the schema's tables are missing or older than this library: run `sqlstreams migrate -schema NAME` " +
			"(or create a client without DisableMigrate), and check ClientConfig.Schema"}
	case "42501":
		return &PermanentError{Err: err, Remedy: "the database role lacks a privilege on the table named above: GRANT it " +
			"(README, Privileges), or run this part as the schema's owner"}
	case "28000", "28P01":
		return &PermanentError{Err: err, Remedy: "the database refused the role's credentials: check the connection string"}
	case "3D000":
		return &PermanentError{Err: err, Remedy: "the database named in the connection string does not exist"}
	}
	if strings.HasPrefix(pg.Code, "42") {
		// The rest of class 42 (a syntax error, a type mismatch, an
		// ambiguous name): the server will refuse the statement every time.
		return &PermanentError{Err: err, Remedy: "the server cannot run a statement sqlstreams sent: " +
			"report it to sqlstreams with the statement's caller (the comment that starts it) and the server's version"}
	}
	return nil
}

// Transient reports whether err is one that usually passes by itself: a
// lost or refused connection (SQLSTATE class 08, a network error), an
// administrator or crash shutdown and a server not yet accepting connections
// (57P01-57P03), too many connections (53300), a serialization failure or
// deadlock (40001, 40P01), a read-only transaction (25006, as right after a
// failover), or a statement cut short by its own context.
func Transient(err error) bool {
	if err == nil || Permanent(err) != nil {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case strings.HasPrefix(pg.Code, "08"), pg.Code == "57P01", pg.Code == "57P02", pg.Code == "57P03",
			pg.Code == "53300", pg.Code == "40001", pg.Code == "40P01", pg.Code == "25006":
			return true
		}
		return false
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	return errors.As(err, &ne) || errors.As(err, &ce) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "conn closed")
}

// Disrupted reports whether err shows that the server dropped a connection
// the pool had already established: the backend was terminated or the
// server shut down (57P01, 57P02), the connection failed (class 08), or it
// was found closed or cut (EOF, a network error on an open connection). A
// failure to connect is not one: there was no connection to drop.
func Disrupted(err error) bool {
	if err == nil || Permanent(err) != nil {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "57P01" || pg.Code == "57P02" || strings.HasPrefix(pg.Code, "08")
	}
	var ne net.Error
	return (errors.As(err, &ne) && !ne.Timeout()) ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "conn closed")
}

// Unreachable reports whether err shows the server out of reach rather than
// busy: a connection refused or cut (a failure to connect, class 08, a
// network error other than a timeout, EOF), a server shutting down or not
// yet accepting connections (57P01-57P03). Retrying such an error costs
// the server nothing, so actors retry it sooner than their backoff would
// (outage.UnreachableRetry). Timeouts, too many connections (53300) and
// conflicts (40001, 40P01) are a busy server's and keep the whole backoff.
func Unreachable(err error) bool {
	if err == nil || Permanent(err) != nil {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return !pgconn.Timeout(err)
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03" || strings.HasPrefix(pg.Code, "08")
	}
	var ne net.Error
	return (errors.As(err, &ne) && !ne.Timeout()) ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "conn closed")
}

// ResetIfDisrupted closes every connection of the pool when err is
// Disrupted (connections checked out close when they are returned). When
// the server restarts, fails over or terminates its backends, every idle
// connection of the pool is dead, and each would fail once when next
// used: the actors sharing the pool took turns failing on them, each
// failure doubling a backoff, so a database back within a second kept a
// session idle for several. After the reset the next statement connects
// afresh, or fails to connect while the server is still down.
func (st *Store) ResetIfDisrupted(err error) {
	if Disrupted(err) {
		st.pool.Reset()
	}
}

// ErrStreamChanged reports a stream whose stored row no longer matches the
// one a handle resolved: its schema was dropped and recreated, and its id
// may now name another stream. Nothing is written.
var ErrStreamChanged = errors.New("stream row changed under the client")

func streamChanged(name string, id int64) error {
	return fmt.Errorf("stream %q (id %d): %w", name, id, ErrStreamChanged)
}
