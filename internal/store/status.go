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
// statement of one listing sees one snapshot.
func (st *Store) readOnly(ctx context.Context, what string, f func(pgx.Tx) error) error {
	if st.tx != nil { // a View's reads share its transaction
		if err := f(st.tx); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	err := pgx.BeginTxFunc(ctx, st.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, f)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
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

// StatusRow is a group's state at one snapshot.
type StatusRow struct {
	Now       time.Time
	Committed Position // every position at or below it is settled
	Cursor    Position // the highest position claimed into a range
	Head      Position // the stream's newest visible position ({0,0}: empty)
	// Lag counts log positions after Committed, up to the cap it was read
	// with; LagCapped says the count stopped there.
	Lag       int64
	LagCapped bool
	// Oldest is the produced_at of the first position after Committed
	// (zero when there is none).
	Oldest                      time.Time
	Ranges, ExpiredRanges       int64
	Retrying, Quarantined, Dead int64
	Bindings                    int64 // installed binding patterns (0: the whole stream)
	Instances                   []InstanceRow
}

// Status reads the group's state in one snapshot. lagCap bounds the
// positions the lag count reads (it costs one index probe per position).
func (g Group) Status(ctx context.Context, lagCap int64, now Now) (StatusRow, error) {
	var s StatusRow
	err := g.st.readOnly(ctx, "group status", func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "-- store.Status\nSELECT coalesce($1, now())", now).Scan(&s.Now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, g.sql(committedSQL), g.GroupID).Scan(&s.Committed.Xid, &s.Committed.ID); err != nil {
			return fmt.Errorf("committed position: %w", err)
		}
		if err := tx.QueryRow(ctx, g.sql(statusCursorSQL), g.GroupID).Scan(&s.Cursor.Xid, &s.Cursor.ID); err != nil {
			return fmt.Errorf("cursor: %w", err)
		}
		err := tx.QueryRow(ctx, g.sql(statusHeadSQL)).Scan(&s.Head.Xid, &s.Head.ID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("head: %w", err)
		}
		if err := tx.QueryRow(ctx, g.sql(statusLagSQL), s.Committed.Xid, s.Committed.ID, lagCap+1).Scan(&s.Lag); err != nil {
			return fmt.Errorf("lag: %w", err)
		}
		if s.Lag > lagCap {
			s.Lag, s.LagCapped = lagCap, true
		}
		err = tx.QueryRow(ctx, g.sql(statusOldestSQL), s.Committed.Xid, s.Committed.ID).Scan(&s.Oldest)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("oldest unconsumed: %w", err)
		}
		if err := tx.QueryRow(ctx, g.sql(statusCountsSQL), g.GroupID, now).Scan(&s.Ranges, &s.ExpiredRanges,
			&s.Retrying, &s.Quarantined, &s.Dead, &s.Bindings); err != nil {
			return fmt.Errorf("counts: %w", err)
		}
		rows, err := tx.Query(ctx, g.st.sql(`-- store.Status
SELECT i.id::text, w.name, i.declared_by, i.started_at, i.heartbeat_at, i.expires_at, true
FROM %[1]s.worker_instance i JOIN %[1]s.worker_config w ON w.id = i.worker_config_id
WHERE w.consumer_group_id = $1 AND i.expires_at > coalesce($2, now())
ORDER BY w.name, i.started_at
LIMIT 1000`), g.GroupID, now)
		if err != nil {
			return fmt.Errorf("live instances: %w", err)
		}
		s.Instances, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstanceRow, error) {
			var i InstanceRow
			err := r.Scan(&i.ID, &i.Worker, &i.DeclaredBy, &i.StartedAt, &i.HeartbeatAt, &i.ExpiresAt, &i.Live)
			return i, err
		})
		return err
	})
	return s, err
}

var statusCursorSQL = perStream(`-- store.Status
SELECT head_xid, head_id FROM {s}.{t}_cursor WHERE group_id = $1`)

var statusHeadSQL = perStream(`-- store.Status
SELECT xid, id FROM {s}.{t}_log ORDER BY xid DESC, id DESC LIMIT 1`)

var statusLagSQL = perStream(`-- store.Status
SELECT count(*) FROM (
    SELECT 1 FROM {s}.{t}_log WHERE (xid, id) > ($1, $2) ORDER BY xid, id LIMIT $3
) l`)

var statusOldestSQL = perStream(`-- store.Status
SELECT produced_at FROM {s}.{t}_log WHERE (xid, id) > ($1, $2) ORDER BY xid, id LIMIT 1`)

// quarantined rows are pending rows whose only error is the quarantine's
// (their first attempt has not run yet).
var statusCountsSQL = perStream(`-- store.Status
SELECT (SELECT count(*) FROM {s}.{t}_range WHERE group_id = $1),
       (SELECT count(*) FROM {s}.{t}_range WHERE group_id = $1 AND expires_at <= coalesce($2, now())),
       x.retrying, x.quarantined, x.dead,
       (SELECT count(*) FROM {s}.{t}_binding WHERE group_id = $1)
FROM (SELECT count(*) FILTER (WHERE status <> 'dead' AND NOT (attempts = 0 AND last_error LIKE 'quarantined:%')) AS retrying,
             count(*) FILTER (WHERE status <> 'dead' AND attempts = 0 AND last_error LIKE 'quarantined:%') AS quarantined,
             count(*) FILTER (WHERE status = 'dead') AS dead
      FROM {s}.{t}_exception WHERE group_id = $1) x`)

// DeadLetterRow is one dead letter with its payload and its delivery log.
type DeadLetterRow struct {
	DeadLetter
	Payload    []byte
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
			&d.DiedAt, &d.Key, &d.RoutingKey, &d.Version, &d.ProducedAt, &d.Payload)
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
       coalesce(m.routing_key, ''), m.version, m.produced_at, m.payload
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
