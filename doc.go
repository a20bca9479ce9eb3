// Package sqlstreams is durable, Kafka-like streams on PostgreSQL, embedded in
// your process: PostgreSQL is the log, the coordinator and the fleet
// registry, and there is no broker to run.
//
// A stream is an append-only log of typed messages. A consumer group reads a
// stream with a cursor; any number of processes may run Consume for one group
// and they share its work through leased ranges of the log. A process that
// dies loses its leases one InstanceTTL after its last heartbeat, and another
// instance delivers the range again: delivery is at least once, and nothing
// produced is skipped, including messages whose transaction commits late.
//
// The API follows one rule: every durable resource is declared by a Register
// verb that carries its stored config (StreamConfig, ConsumerConfig), and the
// verbs that act take per-call options (ProduceOptions, ConsumeOptions), nil
// meaning the defaults. Go has no generic methods, so the typed entry point is
// the function Stream[T].
//
// # Names
//
// Streams, consumer groups and schedules are named with 1 to 128 bytes of
// ASCII letters, digits, '.', '_' and '-', starting with a letter or digit
// (orders.placed, billing-v2); names are case-sensitive, and a group name is
// unique in its schema (ErrInvalidName, ErrGroupStream). A schema
// (ClientConfig.Schema) is a lower-case SQL identifier of at most 63 bytes,
// not information_schema nor pg_* (ValidateSchema, ErrInvalidSchema).
// Routing keys are words of ASCII letters, digits, '_' and '-' separated by
// '.', at most 255 bytes (ErrInvalidRoutingKey); binding patterns are
// routing keys whose whole words may be '*' (one word) or '#' (zero or more)
// (ErrInvalidPattern). Message and idempotency keys are any UTF-8 text of at
// most 255 bytes without control characters (ErrInvalidKey).
//
// # Schema versions
//
// A message type declares its schema version with a SchemaVersion() int
// method (Versioned); without one it is version 1. Produce stores the
// version with the message, and a consumer reads only its own type's
// version: a message of another version is a dead letter of the group at
// once (ErrSchemaVersion), so that a consumer never decodes a document it
// does not understand. Deploy a new version as a new type (OrderPlacedV2)
// and a consumer that reads it, or a new stream. A Stream[json.RawMessage]
// consumer gets each payload's bytes exactly as stored, undecoded (the
// database validated them as JSON when they were produced); json.RawMessage
// declares no version, so it reads version 1.
//
// # Binding swaps and the messages already in the log
//
// A group's binding set (ConsumerConfig.Bindings) is read by every claim.
// When a changed set swaps in (once no live instance holds the old one), it
// applies to every claim made afterwards: messages already in the log after
// the group's cursor are delivered if the new set matches them and skipped
// if it does not, whatever the old set said, and a range reclaimed from a
// crashed instance is filtered again by the new set. Messages the group has
// already settled, or holds as retrying or dead, are not revisited.
//
// It is the API for users: the one package an application imports.
package sqlstreams
