package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Operator reads: the read-only group handle's statements (streams and
// groups listed, a group's status, one dead letter with its history). Each
// runs in a READ ONLY transaction, so a read can never write, whatever a
// later change to its SQL does; nothing here is on the claim path.

// readOnly runs f in a READ ONLY, REPEATABLE READ transaction: every
// statement of one listing sees one snapshot. Its error names what (unless
// what is "": the caller names it). A View's reads share its transaction
// and are named once, by the Reader.Read that opened it.
func (st *Store) readOnly(ctx context.Context, what string, f func(pgx.Tx) error) error {
	if st.tx != nil {
		return f(st.tx)
	}
	err := pgx.BeginTxFunc(ctx, st.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, f)
	if err != nil && what != "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	return err
}

// StreamInfoRow is a registered stream as the listing shows it.
type StreamInfoRow struct {
	ID        int64
	Name      string
	Config    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
	// RetainedBytes is the on-disk size of the stream's log partitions
	// (rows, indexes and TOAST).
	RetainedBytes int64
	Groups        []string
}

// ListStreams lists at most limit streams by name, after the name after.
func (st *Store) ListStreams(ctx context.Context, after string, limit int) ([]StreamInfoRow, error) {
	var out []StreamInfoRow
	err := st.readOnly(ctx, "list streams", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, st.sql(`-- store.ListStreams
SELECT s.id, s.name, s.config, s.created_at, s.updated_at,
       coalesce((SELECT sum(pg_total_relation_size(i.inhrelid))::bigint FROM pg_catalog.pg_inherits i
                 WHERE i.inhparent = to_regclass(format('%%I.%%I', $1::text, 'stream_' || s.id || '_log'))), 0),
       coalesce((SELECT array_agg(g.name ORDER BY g.name) FROM %[1]s.consumer_group_config g
                 WHERE g.stream_id = s.id), '{}')
FROM %[1]s.stream_config s
WHERE s.name > $2
ORDER BY s.name
LIMIT $3`), st.schema, after, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamInfoRow, error) {
			var s StreamInfoRow
			err := r.Scan(&s.ID, &s.Name, &s.Config, &s.CreatedAt, &s.UpdatedAt, &s.RetainedBytes, &s.Groups)
			return s, err
		})
		return err
	})
	return out, err
}

// GroupInfoRow is a registered group as the listing shows it.
type GroupInfoRow struct {
	ID        int64
	StreamID  int64
	Stream    string
	Name      string
	Start     string
	CreatedAt time.Time
}

// ListGroups lists at most limit groups by name, after the name after, of
// one stream (stream "" for every stream).
func (st *Store) ListGroups(ctx context.Context, stream, after string, limit int) ([]GroupInfoRow, error) {
	var out []GroupInfoRow
	err := st.readOnly(ctx, "list groups", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, st.sql(`-- store.ListGroups
SELECT g.id, g.stream_id, s.name, g.name, g.start, g.created_at
FROM %[1]s.consumer_group_config g JOIN %[1]s.stream_config s ON s.id = g.stream_id
WHERE ($1 = '' OR s.name = $1) AND g.name > $2
ORDER BY g.name
LIMIT $3`), stream, after, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (GroupInfoRow, error) {
			var g GroupInfoRow
			err := r.Scan(&g.ID, &g.StreamID, &g.Stream, &g.Name, &g.Start, &g.CreatedAt)
			return g, err
		})
		return err
	})
	return out, err
}

// LookupGroup reads a registered group by name, with its stream's name and
// its workers' ids, and creates nothing: an unknown name is ErrNotFound.
func (st *Store) LookupGroup(ctx context.Context, name string) (GroupRow, string, error) {
	g := GroupRow{Name: name, Workers: map[string]int64{}}
	var stream string
	err := st.readOnly(ctx, "lookup group", func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, st.sql(`-- store.LookupGroup
SELECT g.id, g.stream_id, g.start, s.name
FROM %[1]s.consumer_group_config g JOIN %[1]s.stream_config s ON s.id = g.stream_id
WHERE g.name = $1`), name).Scan(&g.ID, &g.StreamID, &g.Start, &stream)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("consumer group %q: %w", name, ErrNotFound)
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, st.sql(`-- store.LookupGroup
SELECT name, id FROM %[1]s.worker_config WHERE consumer_group_id = $1 ORDER BY name`), g.ID)
		if err != nil {
			return err
		}
		var w string
		var id int64
		_, err = pgx.ForEachRow(rows, []any{&w, &id}, func() error {
			g.Workers[w] = id
			return nil
		})
		return err
	})
	if err != nil {
		return GroupRow{}, "", err
	}
	return g, stream, nil
}

// DeadLetterRow is one dead letter with its payload and its delivery log.
type DeadLetterRow struct {
	DeadLetter
	Payload    []byte
	Headers    []byte // the message's headers document (nil: none)
	Deliveries []DeliveryRow
}

// DeliveryRow is one delivery-log row.
type DeliveryRow struct {
	Attempt int
	Outcome string
	Error   string
	At      time.Time
}

// DeadLetter reads one dead letter with its payload and at most
// maxDeliveries of its delivery-log rows (oldest first); ErrNotFound when
// messageID is not a dead letter of the group.
func (g Group) DeadLetter(ctx context.Context, messageID int64, maxDeliveries int) (DeadLetterRow, error) {
	var d DeadLetterRow
	err := g.st.readOnly(ctx, "dead letter", func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, g.sql(deadLetterSQL), g.GroupID, messageID).Scan(&d.MessageID, &d.Attempts, &d.LastError,
			&d.DiedAt, &d.Key, &d.RoutingKey, &d.Version, &d.ProducedAt, &d.Payload, &d.Headers)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("message %d: %w (not a dead letter of this group)", messageID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, g.sql(deliveriesSQL), g.GroupID, messageID, maxDeliveries)
		if err != nil {
			return err
		}
		d.Deliveries, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeliveryRow, error) {
			var l DeliveryRow
			err := r.Scan(&l.Attempt, &l.Outcome, &l.Error, &l.At)
			return l, err
		})
		return err
	})
	return d, err
}

var deadLetterSQL = perStream(`-- store.DeadLetter
SELECT x.message_id, x.attempts, x.last_error, x.updated_at, coalesce(x.message_key, ''),
       coalesce(m.routing_key, ''), m.version, m.produced_at, m.payload, m.headers::text
FROM {s}.{t}_exception x JOIN {s}.{t}_log m ON m.xid = x.message_xid AND m.id = x.message_id
WHERE x.group_id = $1 AND x.status = 'dead' AND x.message_id = $2`)

var deliveriesSQL = perStream(`-- store.DeadLetter
SELECT attempt, outcome, error, at FROM {s}.{t}_delivery
WHERE group_id = $1 AND message_id = $2
ORDER BY id
LIMIT $3`)

// ProducedIn returns the payloads q's transaction has produced to the stream
// so far (visible in it, committed or not), oldest first, at most limit. A
// transaction that has written nothing has no xid and gets none.
func (st *Store) ProducedIn(ctx context.Context, q Querier, streamID int64, limit int) ([][]byte, error) {
	rows, err := q.Query(ctx, st.stream(streamID).sql(producedInSQL), limit)
	if err != nil {
		return nil, fmt.Errorf("messages produced in the transaction: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]byte, error) {
		var b []byte
		err := r.Scan(&b)
		return b, err
	})
}

var producedInSQL = perStream(`-- store.ProducedIn
SELECT payload FROM {s}.{t}_log
WHERE xid = pg_current_xact_id_if_assigned()::text::bigint
ORDER BY id
LIMIT $1`)
