package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/c1702965/sqlstreams/internal/wakeup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// NewMessage is a message about to be written.
type NewMessage struct {
	Version        int
	RoutingKey     string
	Key            string
	IdempotencyKey string
	Payload        []byte // JSON
	Options        []byte // JSON or empty
	Headers        []byte // a JSON object of strings, or empty
}

// StreamRef names the stream a produce writes to: its id, and its name for
// the guard that refuses to write when the id no longer names that stream
// ("" skips the guard, for callers that read the id in the same database
// transaction).
type StreamRef struct {
	ID   int64
	Name string
}

// Produced reports what happened to one NewMessage.
type Produced struct {
	ID        int64
	Duplicate bool // an earlier message holds the idempotency key; nothing was written
}

// Produce writes msgs atomically, in the order given: unkeyed messages in
// one multi-row insert; with idempotent messages among them, one statement
// per idempotent message and per run of unkeyed ones between them, in one
// batch (one implicit transaction on the pool). On a caller's transaction
// the messages exist exactly when it commits.
//
// The wake-up notification goes out in the caller's transaction when there is
// one. On the pool it is the caller's to send after the insert has committed
// (SendWakes, through internal/wakeup's combiner): PostgreSQL serializes the
// commits of notifying transactions under one database-wide lock, held
// across the commit's WAL flush, so notifying inside the insert made
// concurrent producers flush one at a time (decision 0014).
//
// Every insert is guarded by the stream's row: when stream.Name is set and
// the stream_config row of stream.ID no longer carries that name (the schema
// was dropped and recreated, and the id may now be another stream's), the
// insert writes nothing and Produce returns ErrStreamChanged. On a caller's
// transaction every statement runs on that transaction, and a finished one
// is refused with pgx.ErrTxClosed before anything is sent.
func (st *Store) Produce(ctx context.Context, q Querier, stream StreamRef, msgs []NewMessage, now Now) ([]Produced, error) {
	streamID := stream.ID
	own := q == nil
	if own {
		q = st.pool
	}
	r := st.stream(streamID)
	out := make([]Produced, len(msgs))
	var channel, wake string // the in-transaction notification, on a caller's transaction
	if !own {
		channel, wake = st.NotifyChannel(), WakePayloadOf(streamID, msgs)
	}
	keyed := false
	for i := range msgs {
		keyed = keyed || msgs[i].IdempotencyKey != ""
	}
	if !keyed {
		idx := make([]int, len(msgs))
		for i := range idx {
			idx[i] = i
		}
		text := []string{stream.Name} // the guard
		if !own {
			text = append(text, channel, wake)
		}
		p := unkeyedProduce{q: q, own: own, r: r, stream: stream, rows: insertRows{now: now, msgs: msgs, idx: idx, out: out, text: text}}
		if err := st.produceUnkeyed(ctx, p); err != nil {
			return nil, err
		}
		return out, nil
	}
	// Idempotent messages among them: one statement per idempotent message
	// and one per run of unkeyed messages between them, in item order, so
	// the log holds the batch in the order given.
	var (
		batch pgx.Batch
		runs  [][]int // a run of unkeyed messages, or one idempotent message
	)
	for i := 0; i < len(msgs); {
		if msgs[i].IdempotencyKey != "" {
			m := &msgs[i]
			batch.Queue(r.sql(insertKeyedSQL), now, m.IdempotencyKey, m.Version, m.RoutingKey, m.Key, m.Payload, m.Options, stream.Name, m.Headers)
			runs = append(runs, []int{i})
			i++
			continue
		}
		j := i
		for j < len(msgs) && msgs[j].IdempotencyKey == "" {
			j++
		}
		idx := make([]int, 0, j-i)
		for k := i; k < j; k++ {
			idx = append(idx, k)
		}
		batch.Queue(r.sql(insertBatchSQL), plainParams(now, msgs, idx, stream.Name)...)
		runs = append(runs, idx)
		i = j
	}
	if !own {
		batch.Queue(notifySQL, channel, wake)
	}
	br := q.SendBatch(ctx, &batch)
	fail := func(err error) ([]Produced, error) {
		_ = br.Close()
		return nil, err
	}
	for _, idx := range runs {
		if msgs[idx[0]].IdempotencyKey != "" {
			i := idx[0]
			var ok bool
			if err := br.QueryRow().Scan(&out[i].ID, &out[i].Duplicate, &ok); err != nil {
				return fail(fmt.Errorf("idempotent insert: %w", err))
			}
			if !ok {
				return fail(streamChanged(stream.Name, stream.ID))
			}
			continue
		}
		rows, err := br.Query()
		if err != nil {
			return fail(fmt.Errorf("insert: %w", err))
		}
		if err := scanIDs(rows, idx, out); err != nil {
			if errors.Is(err, errGuard) {
				err = streamChanged(stream.Name, stream.ID)
			}
			return fail(err)
		}
	}
	if !own {
		if _, err := br.Exec(); err != nil {
			return fail(fmt.Errorf("notify: %w", err))
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	return out, nil
}

// plainParams are the unkeyed insert's parameters for pgx to encode, on the
// paths that do not use wire.go's (a run of unkeyed messages among
// idempotent ones, a Querier without a connection): produced_at, then the
// versions, routing keys, message keys, payloads and options of msgs[idx...],
// then the stream guard's name.
func plainParams(now Now, msgs []NewMessage, idx []int, guard string) []any {
	versions := make([]int32, len(idx))
	column := func(get func(m *NewMessage) []byte) [][]byte {
		out := make([][]byte, len(idx))
		for j, i := range idx {
			out[j] = get(&msgs[i])
		}
		return out
	}
	for j, i := range idx {
		versions[j] = int32(msgs[i].Version)
	}
	return []any{now, versions,
		column(func(m *NewMessage) []byte { return []byte(m.RoutingKey) }),
		column(func(m *NewMessage) []byte { return []byte(m.Key) }),
		column(func(m *NewMessage) []byte { return m.Payload }),
		column(func(m *NewMessage) []byte { return m.Options }),
		column(func(m *NewMessage) []byte { return m.Headers }),
		guard}
}

// SendWakes sends one round of merged wake-ups (internal/wakeup): one
// notification per stream, in one statement and one transaction.
func (st *Store) SendWakes(ctx context.Context, round map[int64]*wakeup.Keys) error {
	payloads := make([]string, 0, len(round))
	for id, k := range round {
		payloads = append(payloads, WakePayload(id, k))
	}
	_, err := st.pool.Exec(ctx, `-- store.SendWakes
SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, st.NotifyChannel(), payloads)
	return err
}

// unkeyedProduce is a produce of unkeyed messages only: one insert.
type unkeyedProduce struct {
	q      Querier // the caller's transaction, or the pool (own)
	own    bool    // on the pool: the caller sends the wake-up after the commit
	r      *rendered
	stream StreamRef
	// rows: their text parameters are the guard (stream.Name) and, on a
	// caller's transaction, the wake's channel and payload.
	rows insertRows
}

// insertRows are what one multi-row insert writes: the messages msgs[idx...]
// at now, whose ids go to out; and the statement's text parameters after
// the seven produceParams encodes.
type insertRows struct {
	now  Now
	msgs []NewMessage
	idx  []int
	out  []Produced
	text []string
}

// produceUnkeyed is the common case: one insert whose parameters wire.go
// encodes; on the pool, unnamed the first unnamedSightings times a
// connection meets the stream and prepared after that. On a caller's
// transaction the statement is prepared through the transaction, which refuses a
// finished one (pgx.ErrTxClosed): only then is its connection used, so a
// produce never writes on a connection the transaction gave back to the
// pool, where another caller's transaction may run by now.
func (st *Store) produceUnkeyed(ctx context.Context, p unkeyedProduce) error {
	guarded := func(err error) error {
		if errors.Is(err, errGuard) {
			return streamChanged(p.stream.Name, p.stream.ID)
		}
		return err
	}
	if p.own {
		c, err := st.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("acquire a connection: %w", err)
		}
		conn := c.Conn()
		if sighting(conn.PgConn(), p.r.name(insertBatchSQL)) <= unnamedSightings {
			err = insertUnnamed(ctx, conn, p.r.sql(insertBatchSQL), p.rows)
		} else {
			err = insertPrepared(ctx, conn, conn.Prepare, p.r.named(insertBatchSQL), p.rows)
		}
		c.Release()
		return guarded(err)
	}
	if tx, ok := p.q.(txConn); ok {
		return guarded(insertPrepared(ctx, tx.Conn(), tx.Prepare, p.r.named(insertBatchWakeSQL), p.rows))
	}
	return guarded(insertPlain(ctx, p.q, p.r.sql(insertBatchWakeSQL), p.rows))
}

// txConn is what a pgx.Tx offers: its connection, and a Prepare that
// refuses a finished transaction.
type txConn interface {
	Conn() *pgx.Conn
	Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)
}

// insertPlain runs insert with rows through q's own protocol (a
// Querier that is neither the pool nor a pgx.Tx).
func insertPlain(ctx context.Context, q Querier, insert string, rows insertRows) error {
	args := plainParams(rows.now, rows.msgs, rows.idx, rows.text[0])
	for _, x := range rows.text[1:] {
		args = append(args, x)
	}
	res, err := q.Query(ctx, insert, args...)
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	return scanIDs(res, rows.idx, rows.out)
}

// scanIDs reads the ids an insert returned and assigns them (assignIDs).
func scanIDs(rows pgx.Rows, idx []int, out []Produced) error {
	defer rows.Close()
	ids := make([]int64, 0, len(idx))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return fmt.Errorf("scan id: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	return assignIDs(ids, idx, out)
}

// errGuard is an insert that wrote nothing because its stream guard failed.
var errGuard = errors.New("stream guard")

// assignIDs assigns returned ids in ascending order: identity values follow
// the insert's ORDER BY, so the i-th smallest id belongs to the i-th message.
func assignIDs(ids []int64, idx []int, out []Produced) error {
	if len(ids) == 0 && len(idx) > 0 {
		return errGuard // the insert's stream guard held it back: nothing was written
	}
	if len(ids) != len(idx) {
		return fmt.Errorf("%d ids returned for %d messages", len(ids), len(idx))
	}
	slices.Sort(ids)
	for j, i := range idx {
		out[i].ID = ids[j]
	}
	return nil
}

// The produce statements.

// One notification per produce (PostgreSQL folds identical ones
// within a transaction and delivers them at commit), so idle
// consumers wake without tight polling: in the insert's statement
// inside a caller's transaction, after it on the pool (see
// store.Produce).
var insertBatchSQL = perStream(`-- store.Produce
` + insertBatchText)

var insertBatchWakeSQL = perStream(`-- store.Produce
WITH ins AS (
` + insertBatchText + `
)
SELECT ins.id FROM ins, (SELECT pg_notify($9, $10)) AS wake(x)`)

const notifySQL = `-- store.Produce
SELECT pg_notify($1, $2)`

// The idempotency row takes the message's id from the log's identity
// sequence first, so two producers racing on one key serialize on the
// key's unique index and exactly one log row is written.
var insertKeyedSQL = perStream(`-- store.Produce
WITH g AS (
    SELECT coalesce($8 = '' OR (SELECT s.name FROM {s}.stream_config s WHERE s.id = {id}) = $8, false) AS ok
), k AS (
    INSERT INTO {s}.{t}_idempotency (key, message_id, created_at)
    SELECT $2, nextval(pg_get_serial_sequence('{s}.{t}_log', 'id')), coalesce($1, now())
    WHERE (SELECT ok FROM g)
    ON CONFLICT (key) DO NOTHING
    RETURNING message_id
), ins AS (
    INSERT INTO {s}.{t}_log (id, produced_at, version, routing_key, message_key, payload, options, headers)
    OVERRIDING SYSTEM VALUE
    SELECT k.message_id, coalesce($1, now()), $3, nullif($4, ''), nullif($5, ''), $6::text::json, nullif($7, '')::jsonb,
           nullif($9::text, '')::jsonb
    FROM k
    RETURNING id
)
SELECT id, false, true FROM ins
UNION ALL
SELECT coalesce((SELECT message_id FROM {s}.{t}_idempotency WHERE key = $2), 0), true, (SELECT ok FROM g)
WHERE NOT EXISTS (SELECT 1 FROM k)`)

// insertBatchText writes a produce call's unkeyed messages, ids in item order.
// The guard ($8, the stream's name, or ” for none) is a one-time filter:
// when the stream's row no longer carries that name, nothing is written.
const insertBatchText = `INSERT INTO {s}.{t}_log (produced_at, version, routing_key, message_key, payload, options, headers)
SELECT coalesce($1, now()), m.version, nullif(m.routing_key, ''), nullif(m.message_key, ''),
       m.payload::json, nullif(m.options, '')::jsonb, nullif(m.headers, '')::jsonb
FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
     WITH ORDINALITY AS m(version, routing_key, message_key, payload, options, headers, n)
WHERE $8::text = '' OR (SELECT s.name FROM {s}.stream_config s WHERE s.id = {id}) = $8::text
ORDER BY m.n
RETURNING id`
