package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/c1702965/sqlstreams/internal/wakeup"
	"github.com/jackc/pgx/v5"
)

// WakePayload is the notification a produce sends at commit: the stream id,
// then ";" and the distinct routing keys of its messages separated by
// spaces (routing keys hold no spaces or semicolons). A group with bindings
// is woken only when one of them matches; messages without a routing key
// match no binding, so they are not listed. Without the list (too long:
// wakeup.MaxKeysBytes) the notification wakes every group of the stream.
func WakePayload(streamID int64, k *wakeup.Keys) string {
	id := strconv.FormatInt(streamID, 10)
	if k.All {
		return id
	}
	return id + ";" + strings.Join(k.List, " ")
}

// WakePayloadOf is the wake-up of one produce's messages.
func WakePayloadOf(streamID int64, msgs []NewMessage) string {
	var k wakeup.Keys
	for i := range msgs {
		k.Add(msgs[i].RoutingKey)
	}
	return WakePayload(streamID, &k)
}

// Wake is one notification: a produce's (the stream, and when Known the
// routing keys of everything it produced), or an operator action's that
// wakes one group's claimers (Groups).
type Wake struct {
	StreamID int64
	Known    bool
	Keys     []string
	// Groups are the groups an action named: a redrive wakes a group's
	// exception claimers, a seek its range claimers.
	Groups []GroupWake
	// Ping: a hub's ping (Ping), no stream's.
	Ping bool
}

// GroupWake names one group's claimers to wake: its exception claimers
// (Exceptions), or its range claimers.
type GroupWake struct {
	GroupID    int64
	Exceptions bool
}

// A group's wake rides a stream's payload as a key no routing key can be
// ("!x12": group 12's exception claimers, "!r12": its range claimers): a
// hub of an earlier version takes it for an unmatched routing key, which
// wakes only the stream's groups without bindings, once, for nothing.
const groupWakeMark = "!"

// GroupWakePayload is the payload of a wake of one group's claimers.
func GroupWakePayload(streamID int64, g GroupWake) string {
	kind := "r"
	if g.Exceptions {
		kind = "x"
	}
	return strconv.FormatInt(streamID, 10) + ";" + groupWakeMark + kind + strconv.FormatInt(g.GroupID, 10)
}

// WakeGroup wakes one group's claimers in every process, as a produce
// wakes a stream's: its exception claimers after a redrive (the rows are
// due now), its range claimers after a seek. Best effort: a claimer that
// misses it finds the work at its next sweep.
func (st *Store) WakeGroup(ctx context.Context, streamID int64, g GroupWake) error {
	if _, err := st.pool.Exec(ctx, `-- store.WakeGroup
SELECT pg_notify($1, $2)`, st.NotifyChannel(), GroupWakePayload(streamID, g)); err != nil {
		return fmt.Errorf("wake group %d: %w", g.GroupID, err)
	}
	return nil
}

// PingPayload is the payload of a listener's own ping (engine.Hub): no
// stream's wake-up.
const PingPayload = "ping"

// Ping notifies the schema's channel with PingPayload through the pool and
// returns the database's clock at the time: a hub that hears nothing for a
// while pings, and measures in database time how long its ping goes unheard.
func (st *Store) Ping(ctx context.Context) (time.Time, error) {
	var at time.Time
	if err := st.pool.QueryRow(ctx, `-- store.Ping
SELECT clock_timestamp() FROM (SELECT pg_notify($1, $2)) AS n`, st.NotifyChannel(), PingPayload).Scan(&at); err != nil {
		return at, fmt.Errorf("ping the listener: %w", err)
	}
	return at, nil
}

// ParseWake reads a notification payload (see WakePayload); a ping is a
// Wake with Ping set.
func ParseWake(payload string) (Wake, error) {
	if payload == PingPayload {
		return Wake{Ping: true}, nil
	}
	idText, keys, known := strings.Cut(payload, ";")
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil {
		return Wake{}, fmt.Errorf("notification payload %q: %w", payload, err)
	}
	w := Wake{StreamID: id, Known: known}
	if known && keys != "" {
		w.Keys = strings.Split(keys, " ")
	}
	for i := 0; i < len(w.Keys); {
		k := w.Keys[i]
		rest, ok := strings.CutPrefix(k, groupWakeMark)
		if !ok || len(rest) < 2 {
			i++
			continue
		}
		gid, err := strconv.ParseInt(rest[1:], 10, 64)
		if err != nil || (rest[0] != 'x' && rest[0] != 'r') {
			return Wake{}, fmt.Errorf("notification payload %q: group wake %q", payload, k)
		}
		w.Groups = append(w.Groups, GroupWake{GroupID: gid, Exceptions: rest[0] == 'x'})
		w.Keys = append(w.Keys[:i], w.Keys[i+1:]...)
	}
	return w, nil
}

// NotifyChannel is the channel producers notify on commit: one per schema,
// the payload naming the stream. Channel names are limited to 63 bytes, so a
// long schema name is shortened with a hash that keeps it unique.
func (st *Store) NotifyChannel() string {
	c := "sqlstreams." + st.schema
	if len(c) <= 63 {
		return c
	}
	return fmt.Sprintf("sqlstreams.%s.%016x", st.schema[:34], uint64(lockKey(st.schema)))
}

// Listener is a dedicated connection listening for produce notifications.
type Listener struct {
	conn *pgx.Conn
}

// Listen takes a connection out of the pool for good and LISTENs on the
// schema's channel.
func (st *Store) Listen(ctx context.Context) (*Listener, error) {
	pc, err := st.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("listen: acquire: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "-- store.Listen\nLISTEN "+pgx.Identifier{st.NotifyChannel()}.Sanitize()); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen: %w", err)
	}
	return &Listener{conn: conn}, nil
}

// Wait blocks for the next notification.
func (l *Listener) Wait(ctx context.Context) (Wake, error) {
	n, err := l.conn.WaitForNotification(ctx)
	if err != nil {
		return Wake{}, fmt.Errorf("wait for notification: %w", err)
	}
	return ParseWake(n.Payload)
}

// PID is the listening backend's process id.
func (l *Listener) PID() uint32 { return l.conn.PgConn().PID() }

// Close closes the connection.
func (l *Listener) Close(ctx context.Context) error { return l.conn.Close(ctx) }
