package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

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

// Wait blocks for the next notification and returns the stream it names.
func (l *Listener) Wait(ctx context.Context) (int64, error) {
	n, err := l.conn.WaitForNotification(ctx)
	if err != nil {
		return 0, fmt.Errorf("wait for notification: %w", err)
	}
	id, err := strconv.ParseInt(n.Payload, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("notification payload %q: %w", n.Payload, err)
	}
	return id, nil
}

// PID is the listening backend's process id.
func (l *Listener) PID() uint32 { return l.conn.PgConn().PID() }

// Close closes the connection.
func (l *Listener) Close(ctx context.Context) error { return l.conn.Close(ctx) }
