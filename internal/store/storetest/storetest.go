// Package storetest holds the statements only tests run: counts, a
// group's binding rows, the delivery log, and moving an instance's leases
// into the past to stand for a process that died. Production code never
// imports it (TestProductionNeverImportsStoretest), so the store's API is
// what the library uses.
//
// It is a test helper, not an API for users.
package storetest

import (
	"context"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
)

// CountLog counts a stream's messages.
func CountLog(ctx context.Context, st *store.Store, streamID int64) (int64, error) {
	var n int64
	err := st.Pool().QueryRow(ctx, "-- storetest.CountLog\nSELECT count(*) FROM "+st.StreamTable(streamID, "log")).Scan(&n)
	return n, err
}

// CountExceptions counts a group's exception rows.
func CountExceptions(ctx context.Context, st *store.Store, streamID, groupID int64) (int64, error) {
	var n int64
	err := st.Pool().QueryRow(ctx, "-- storetest.CountExceptions\nSELECT count(*) FROM "+st.StreamTable(streamID, "exception")+
		" WHERE group_id = $1", groupID).Scan(&n)
	return n, err
}

// BindingSet reads a group's effective set from its binding rows.
func BindingSet(ctx context.Context, st *store.Store, streamID, groupID int64) ([]string, error) {
	var set []string
	err := st.Pool().QueryRow(ctx, "-- storetest.BindingSet\nSELECT coalesce(array_agg(pattern ORDER BY pattern), '{}') FROM "+
		st.StreamTable(streamID, "binding")+" WHERE group_id = $1", groupID).Scan(&set)
	if err != nil {
		return nil, fmt.Errorf("binding set: %w", err)
	}
	return set, nil
}

// LiveInstances counts a worker's instances whose heartbeat has not lapsed.
func LiveInstances(ctx context.Context, st *store.Store, workerConfigID int64, now store.Now) (int, error) {
	var n int
	err := st.Pool().QueryRow(ctx, "-- storetest.LiveInstances\nSELECT count(*) FROM "+st.SharedTable("worker_instance")+
		" WHERE worker_config_id = $1 AND expires_at > coalesce($2, now())", workerConfigID, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count live instances: %w", err)
	}
	return n, nil
}

// ExpireInstanceLeases moves an instance's heartbeat and its range leases
// into the past: a test's stand-in for time passing after a process died,
// instead of waiting out a TTL.
func ExpireInstanceLeases(ctx context.Context, st *store.Store, id string, streamID int64) error {
	if _, err := st.Pool().Exec(ctx, "-- storetest.ExpireInstanceLeases\nUPDATE "+st.SharedTable("worker_instance")+
		" SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", id); err != nil {
		return fmt.Errorf("expire instance: %w", err)
	}
	if _, err := st.Pool().Exec(ctx, "-- storetest.ExpireInstanceLeases\nUPDATE "+st.StreamTable(streamID, "range")+
		" SET expires_at = now() - interval '1 second' WHERE owner = $1::uuid", id); err != nil {
		return fmt.Errorf("expire range leases: %w", err)
	}
	if _, err := st.Pool().Exec(ctx, "-- storetest.ExpireInstanceLeases\nUPDATE "+st.StreamTable(streamID, "exception")+
		" SET expires_at = now() - interval '1 second' WHERE owner = $1::uuid AND status IN ('running', 'queued')", id); err != nil {
		return fmt.Errorf("expire exception leases: %w", err)
	}
	return nil
}

// LeaseLengths returns, for each range lease and each running exception
// row of a stream, how far its expiry lies past the moment it was taken
// (claimed_at; updated_at, which the exception claim sets): longer than the
// lease it was taken for once a heartbeat renewed it.
func LeaseLengths(ctx context.Context, st *store.Store, streamID int64) (ranges, exceptions []time.Duration, err error) {
	read := func(table, since, where string) ([]time.Duration, error) {
		rows, err := st.Pool().Query(ctx, "-- storetest.LeaseLengths\nSELECT expires_at - "+since+" FROM "+st.StreamTable(streamID, table)+where)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[time.Duration])
	}
	if ranges, err = read("range", "claimed_at", ""); err != nil {
		return nil, nil, fmt.Errorf("range leases: %w", err)
	}
	if exceptions, err = read("exception", "updated_at", " WHERE status = 'running'"); err != nil {
		return nil, nil, fmt.Errorf("exception leases: %w", err)
	}
	return ranges, exceptions, nil
}

// Delivery is a delivery-log row.
type Delivery struct {
	MessageID int64
	Attempt   int
	Outcome   string
	Error     string
	At        time.Time
}

// Deliveries lists a group's delivery log, for one message or (nil) all.
func Deliveries(ctx context.Context, st *store.Store, streamID, groupID int64, messageID *int64) ([]Delivery, error) {
	rows, err := st.Pool().Query(ctx, "-- storetest.Deliveries\nSELECT message_id, attempt, outcome, error, at FROM "+
		st.StreamTable(streamID, "delivery")+" WHERE group_id = $1 AND ($2::bigint IS NULL OR message_id = $2) ORDER BY id", groupID, messageID)
	if err != nil {
		return nil, fmt.Errorf("deliveries: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		err := r.Scan(&d.MessageID, &d.Attempt, &d.Outcome, &d.Error, &d.At)
		return d, err
	})
}

// DeleteLogBelow deletes a stream's messages with ids below id: a test's
// stand-in for retention having dropped the start of the log.
func DeleteLogBelow(ctx context.Context, st *store.Store, streamID, id int64) error {
	_, err := st.Pool().Exec(ctx, "-- storetest.DeleteLogBelow\nDELETE FROM "+st.StreamTable(streamID, "log")+" WHERE id < $1", id)
	return err
}

// StreamRelations lists every relation of the schema (tables, partitions,
// indexes, sequences) named for stream streamID.
func StreamRelations(ctx context.Context, st *store.Store, streamID int64) ([]string, error) {
	rows, err := st.Pool().Query(ctx, `-- storetest.StreamRelations
SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND starts_with(c.relname, $2) ORDER BY c.relname`, st.Schema(), fmt.Sprintf("stream_%d_", streamID))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// SharedRows counts the shared tables' rows that belong to stream
// streamID, by table.
func SharedRows(ctx context.Context, st *store.Store, streamID int64) (map[string]int64, error) {
	out := map[string]int64{}
	for table, where := range map[string]string{
		"stream_config": "id = $1", "stream_config_log": "stream_id = $1", "stream_migration": "stream_id = $1",
		"consumer_group_config": "stream_id = $1", "schedule": "stream_id = $1",
		"worker_config": "consumer_group_id IN (SELECT id FROM " + st.SharedTable("consumer_group_config") + " WHERE stream_id = $1)",
	} {
		var n int64
		if err := st.Pool().QueryRow(ctx, "-- storetest.SharedRows\nSELECT count(*) FROM "+st.SharedTable(table)+" WHERE "+where, streamID).Scan(&n); err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
		out[table] = n
	}
	return out, nil
}

// GroupRows counts group groupID's rows in its stream's tables and the
// shared ones, by table.
func GroupRows(ctx context.Context, st *store.Store, streamID, groupID int64) (map[string]int64, error) {
	out := map[string]int64{}
	for _, t := range []string{"cursor", "range", "exception", "key_lease", "delivery", "binding", "binding_declaration"} {
		var n int64
		if err := st.Pool().QueryRow(ctx, "-- storetest.GroupRows\nSELECT count(*) FROM "+st.StreamTable(streamID, t)+" WHERE group_id = $1", groupID).Scan(&n); err != nil {
			return nil, fmt.Errorf("%s: %w", t, err)
		}
		out[t] = n
	}
	for table, where := range map[string]string{
		"consumer_group_config": "id = $1",
		"worker_config":         "consumer_group_id = $1",
		"worker_config_log":     "worker_config_id IN (SELECT id FROM " + st.SharedTable("worker_config") + " WHERE consumer_group_id = $1)",
		"worker_instance":       "worker_config_id IN (SELECT id FROM " + st.SharedTable("worker_config") + " WHERE consumer_group_id = $1)",
	} {
		var n int64
		if err := st.Pool().QueryRow(ctx, "-- storetest.GroupRows\nSELECT count(*) FROM "+st.SharedTable(table)+" WHERE "+where, groupID).Scan(&n); err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
		out[table] = n
	}
	return out, nil
}
