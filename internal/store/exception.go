package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// KeyClaim is one key a claimer wants for a keyed message. An Ordered key
// is checked for an unresolved message before Position.
type KeyClaim struct {
	Key     string
	Ordered bool
	Position
}

// AcquireKeys leases the keys that are free (or whose holder lapsed) under
// token for owner, then gives back the ordered ones that must wait for an
// earlier message, in one round trip (two statements, two snapshots: see the
// SQL). rangeID is the caller's own range (0 on the exception path). It
// returns the keys held and the ordered keys blocked; any other key is busy
// elsewhere.
func (st *Store) AcquireKeys(ctx context.Context, streamID, groupID, rangeID int64, want []KeyClaim, token, owner string, ttl time.Duration, now Now) (held, blocked map[string]bool, err error) {
	t := st.streamTables(streamID)
	keys := make([]string, len(want))
	var okeys []string
	var oxids, oids []int64
	for i, k := range want {
		keys[i] = k.Key
		if k.Ordered {
			okeys, oxids, oids = append(okeys, k.Key), append(oxids, k.Xid), append(oids, k.ID)
		}
	}
	var b pgx.Batch
	b.Queue(t.acquireKeys, groupID, keys, token, owner, now, ttl)
	if len(okeys) > 0 {
		b.Queue(t.blockOrdered, groupID, okeys, oxids, oids, rangeID, token)
	}
	br := st.pool.SendBatch(ctx, &b)
	defer br.Close()
	held, blocked = map[string]bool{}, map[string]bool{}
	for q := range b.Len() {
		rows, err := br.Query()
		if err != nil {
			return nil, nil, fmt.Errorf("acquire keys: %w", err)
		}
		for rows.Next() {
			var key string
			if err := rows.Scan(&key); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("acquire keys: scan: %w", err)
			}
			if q == 0 {
				held[key] = true
			} else {
				delete(held, key)
				blocked[key] = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("acquire keys: %w", err)
		}
	}
	return held, blocked, nil
}

// ExceptionRun is an exception row leased for one attempt.
type ExceptionRun struct {
	Message
	Token       string
	Concurrency string
	Attempts    int  // failed attempts so far (including a lapsed lease just now)
	Delays      int  // delays used so far
	Expired     bool // the row was taken over from a lapsed lease
	// Queued marks a row leased behind its ordered key's head in the same
	// claim: it runs when the row before it resolves (see SettleException's
	// Next) and not before.
	Queued bool
}

// ClaimExceptions leases up to limit due exception rows of the group, and
// behind each ordered head up to chain more rows of its key, queued, in log
// order (rows come back in log order: a key's queued rows follow its head).
func (st *Store) ClaimExceptions(ctx context.Context, streamID, groupID int64, owner string, limit, chain int, lease time.Duration, now Now) ([]ExceptionRun, error) {
	t := st.streamTables(streamID)
	rows, err := st.pool.Query(ctx, t.claimExceptions, groupID, now, limit, owner, lease, chain)
	if err != nil {
		return nil, fmt.Errorf("claim exceptions: %w", err)
	}
	defer rows.Close()
	var out []ExceptionRun
	for rows.Next() {
		var r ExceptionRun
		m := &r.Message
		if err := rows.Scan(&r.Token, &r.Concurrency, &r.Attempts, &r.Delays, &r.Expired, &r.Queued,
			&m.Xid, &m.ID, &m.ProducedAt, &m.Version, &m.RoutingKey, &m.Key, &m.Payload, &m.Options); err != nil {
			return nil, fmt.Errorf("claim exceptions: scan: %w", err)
		}
		m.Matched = true // routed to the group when its range was claimed
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim exceptions: %w", err)
	}
	return out, nil
}

// Settlement is an exception row's next state after an attempt.
type Settlement struct {
	Delete   bool
	Status   string
	Attempts int
	Delays   int
	Error    string
	After    time.Duration
	// Outcome, when set, writes a delivery-log row for attempt Attempt.
	Outcome string
	Attempt int
	// Next, when set, is the next row of the settled row's ordered chain:
	// the key lease passes to it and it starts running, in the settling
	// statement.
	Next *ExceptionRun
}

// SettleException writes an attempt's result under the row's lease token
// and reports whether s.Next started (false: its lease was lost meanwhile).
func (st *Store) SettleException(ctx context.Context, streamID, groupID int64, pos Position, token string, s Settlement, now Now) (nextStarted bool, err error) {
	t := st.streamTables(streamID)
	var n, started int
	next, nxid, nid := "", int64(0), int64(0)
	if s.Next != nil {
		next, nxid, nid = s.Next.Token, s.Next.Xid, s.Next.ID
	}
	if err := st.pool.QueryRow(ctx, t.settleException, groupID, pos.Xid, pos.ID, token, s.Delete,
		s.Status, s.Attempts, s.Delays, s.Error, now, s.After.Microseconds(), s.Outcome, s.Attempt,
		next, nxid, nid).Scan(&n, &started); err != nil {
		return false, fmt.Errorf("settle exception %d: %w", pos.ID, err)
	}
	if n == 0 {
		return false, fmt.Errorf("settle exception %d: %w", pos.ID, ErrLeaseLost)
	}
	return started > 0, nil
}

// ReturnRuns gives the rows leased under tokens back to pending without
// spending an attempt, and releases their key leases.
func (st *Store) ReturnRuns(ctx context.Context, streamID, groupID int64, runs []ExceptionRun, now Now) error {
	tokens := make([]string, len(runs))
	xids, ids := make([]int64, len(runs)), make([]int64, len(runs))
	for i, r := range runs {
		tokens[i], xids[i], ids[i] = r.Token, r.Xid, r.ID
	}
	if _, err := st.pool.Exec(ctx, st.streamTables(streamID).returnRuns, groupID, tokens, now, xids, ids); err != nil {
		return fmt.Errorf("return queued exception rows: %w", err)
	}
	return nil
}

// DeadLetter is a dead exception row.
type DeadLetter struct {
	MessageID  int64
	Attempts   int
	LastError  string
	DiedAt     time.Time
	Key        string
	RoutingKey string
	Version    int
	ProducedAt time.Time
}

// ListDead pages through a group's dead letters in message id order.
func (st *Store) ListDead(ctx context.Context, streamID, groupID, afterID int64, limit int) ([]DeadLetter, error) {
	rows, err := st.pool.Query(ctx, st.streamTables(streamID).listDead, groupID, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.MessageID, &d.Attempts, &d.LastError, &d.DiedAt, &d.Key, &d.RoutingKey, &d.Version, &d.ProducedAt)
		return d, err
	})
}

// Redrive puts one dead letter (messageID) or all of them (nil) back on the
// curve from attempt zero, due now. It returns how many were redriven.
func (st *Store) Redrive(ctx context.Context, streamID, groupID int64, messageID *int64, now Now) (int64, error) {
	tag, err := st.pool.Exec(ctx, st.streamTables(streamID).redrive, groupID, messageID, now)
	if err != nil {
		return 0, fmt.Errorf("redrive: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ExceptionState is an exception row as tests and inspection see it.
type ExceptionState struct {
	MessageID   int64
	Status      string
	Attempts    int
	Delays      int
	LastError   string
	CanRunAfter time.Time
	Concurrency string
}

// ExceptionStates lists a group's exception rows in log order.
func (st *Store) ExceptionStates(ctx context.Context, streamID, groupID int64) ([]ExceptionState, error) {
	rows, err := st.pool.Query(ctx, st.streamTables(streamID).exceptionState, groupID)
	if err != nil {
		return nil, fmt.Errorf("exception states: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExceptionState, error) {
		var e ExceptionState
		err := r.Scan(&e.MessageID, &e.Status, &e.Attempts, &e.Delays, &e.LastError, &e.CanRunAfter, &e.Concurrency)
		return e, err
	})
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
func (st *Store) Deliveries(ctx context.Context, streamID, groupID int64, messageID *int64) ([]Delivery, error) {
	rows, err := st.pool.Query(ctx, st.streamTables(streamID).deliveries, groupID, messageID)
	if err != nil {
		return nil, fmt.Errorf("deliveries: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		err := r.Scan(&d.MessageID, &d.Attempt, &d.Outcome, &d.Error, &d.At)
		return d, err
	})
}
