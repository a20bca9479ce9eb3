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
// It is the API for users: the one package an application imports.
package sqlstreams
