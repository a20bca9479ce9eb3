package sqlstreams

import (
	"errors"
	"fmt"

	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors, checked with errors.Is. Errors carry the offending name or
// limit but never a payload.
var (
	// ErrInvalidName: a stream or group name outside the allowed alphabet.
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidConfig: a config or options field out of range.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrInvalidSchema: ClientConfig.Schema is not a plain identifier.
	ErrInvalidSchema = store.ErrInvalidIdentifier
	// ErrInvalidRoutingKey: a routing key breaking the topic word rules.
	ErrInvalidRoutingKey = topic.ErrInvalidRoutingKey
	// ErrInvalidPattern: a binding pattern breaking the topic word rules.
	ErrInvalidPattern = topic.ErrInvalidPattern
	// ErrInvalidKey: a message or idempotency key too long or with control characters.
	ErrInvalidKey = errors.New("invalid key")
	// ErrMessageTooLarge: an encoded payload over the stream's MaxMessageBytes.
	ErrMessageTooLarge = errors.New("message too large")
	// ErrEncode: a payload that does not encode as JSON, or encodes to JSON
	// null (a nil pointer, RawMessage or interface is not a message).
	ErrEncode = errors.New("payload does not encode")
	// ErrDecode: a stored payload that does not decode into the consumer's type.
	ErrDecode = errors.New("payload does not decode")
	// ErrSchemaVersion: a message of another schema version than the consumer reads.
	ErrSchemaVersion = errors.New("schema version mismatch")
	// ErrNotRegistered: a stream used before any process registered it.
	ErrNotRegistered = store.ErrNotFound
	// ErrGroupStream: a group name already registered on another stream.
	ErrGroupStream = store.ErrGroupStream
	// ErrPermanent: a store failure that retrying cannot fix (a missing
	// schema or table, a missing privilege, a closed pool, a schema
	// recreated under the client). Consume returns it, naming the cause and
	// the remedy, instead of retrying forever.
	ErrPermanent = store.ErrPermanent
	// ErrNotMigrated: a client with DisableMigrate found the schema without
	// this library's tables (run `sqlstreams migrate`).
	ErrNotMigrated = store.ErrNotMigrated
	// ErrStreamChanged: a stream's stored row no longer matches the one a
	// handle resolved, because the schema was dropped and recreated under
	// the client. Nothing was written; make new handles.
	ErrStreamChanged = store.ErrStreamChanged
	// ErrUnavailable: the database could not be reached (a refused or cut
	// connection, a server shutting down, starting up or failing over, a
	// standby that took over read-only). Produce does not retry: it returns
	// this at once, wrapping the cause, and wrote nothing unless its
	// transaction committed before the connection was cut (an idempotency
	// key makes a retry safe).
	ErrUnavailable = errors.New("database unavailable")
)

// unavailable wraps err with ErrUnavailable when it shows the database out
// of reach; other errors pass through.
func unavailable(err error) error {
	var pg *pgconn.PgError
	if store.Unreachable(err) || errors.As(err, &pg) && pg.Code == "25006" { // read_only_sql_transaction: a standby
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// ownerOnly turns a missing privilege (SQLSTATE 42501) met by a step that
// runs DDL into a permanent error saying who may run it; other errors pass
// through.
func ownerOnly(err error, step string) error {
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) || pg.Code != "42501" {
		return err
	}
	return &store.PermanentError{Err: err, Remedy: step + " runs DDL on the schema: run it as the schema's owner " +
		"(README, Privileges), or GRANT CREATE ON SCHEMA to this role"}
}
