package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Reader runs the operator's reads (listings, a group's status, inspect,
// dead letters, bindings) on a pool that may point at a streaming replica
// (ClientConfig.ReadPool; decision 0029). It is a type of its own, not a
// Store, and it hands out only Views, whose methods only read: nothing that
// claims, commits, produces, renews or refreshes a config can be reached
// from it, so the engine, which is only ever given the primary's *Store,
// cannot run on the replica by mistake, and a replica's stale rows can never
// decide a lease.
type Reader struct {
	st *Store
}

// NewReader returns a Reader for schema on pool. It does not touch the
// database.
func NewReader(pool *pgxpool.Pool, schema string) (*Reader, error) {
	st, err := New(pool, schema)
	if err != nil {
		return nil, err
	}
	return &Reader{st: st}, nil
}

// Replica is where one Reader.Read was served, read in the read's own
// transaction before anything else.
type Replica struct {
	// InRecovery: the server was a standby (pg_is_in_recovery()).
	InRecovery bool
	// Lag is now() - pg_last_xact_replay_timestamp() on a standby (0 on a
	// primary, and never below 0: the two hosts' clocks may disagree). It
	// is an upper bound on how old the read's rows are, and an
	// overestimate on an idle primary: the timestamp is the last replayed
	// commit's, so with nothing committed the lag grows though the standby
	// is current.
	Lag time.Duration
	// LagUnknown: a standby that has replayed no transaction since it
	// started (pg_last_xact_replay_timestamp() is null), so how far behind
	// it is cannot be told; Lag is 0 then.
	LagUnknown bool
}

// Read runs f on a View of one READ ONLY, REPEATABLE READ transaction on
// the reader's pool (a hot standby allows both), so every read f makes sees
// one snapshot, and reports the server's replay lag read first in the same
// transaction. now is the explicit database time, as everywhere.
func (r *Reader) Read(ctx context.Context, what string, now Now, f func(View) error) (Replica, error) {
	var rep Replica
	err := pgx.BeginTxFunc(ctx, r.st.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var lagMicros *int64
		err := tx.QueryRow(ctx, `-- store.Reader.Read
SELECT pg_catalog.pg_is_in_recovery(),
       CASE WHEN pg_catalog.pg_is_in_recovery()
            THEN (extract(epoch FROM coalesce($1, now()) - pg_catalog.pg_last_xact_replay_timestamp()) * 1000000)::bigint
       END`, now).Scan(&rep.InRecovery, &lagMicros)
		if err != nil {
			return fmt.Errorf("replay lag: %w", err)
		}
		switch {
		case !rep.InRecovery:
		case lagMicros == nil:
			rep.LagUnknown = true
		default:
			rep.Lag = max(0, time.Duration(*lagMicros)*time.Microsecond)
		}
		view := *r.st
		view.tx = tx
		return f(View{st: &view})
	})
	if err != nil {
		return Replica{}, fmt.Errorf("%s: %w", what, err)
	}
	return rep, nil
}

// View is the read-only statements of one Reader.Read transaction. It has
// no method that writes.
type View struct {
	st *Store
}

// ListStreams: see Store.ListStreams.
func (v View) ListStreams(ctx context.Context, after string, limit int) ([]StreamInfoRow, error) {
	return v.st.ListStreams(ctx, after, limit)
}

// ListGroups: see Store.ListGroups.
func (v View) ListGroups(ctx context.Context, stream, after string, limit int) ([]GroupInfoRow, error) {
	return v.st.ListGroups(ctx, stream, after, limit)
}

// LookupStream: see Store.LookupStream.
func (v View) LookupStream(ctx context.Context, name string) (StreamRow, error) {
	return v.st.LookupStream(ctx, nil, name)
}

// ReadGroupConfig: see Store.ReadGroupConfig.
func (v View) ReadGroupConfig(ctx context.Context, groupID int64) (map[string][]byte, error) {
	return v.st.ReadGroupConfig(ctx, groupID)
}

// GroupDeclarations: see Store.GroupDeclarations.
func (v View) GroupDeclarations(ctx context.Context, groupID int64, limit int) ([]DeclarationRow, error) {
	return v.st.GroupDeclarations(ctx, groupID, limit)
}

// GroupInstances: see Store.GroupInstances.
func (v View) GroupInstances(ctx context.Context, groupID int64, now Now) ([]InstanceRow, error) {
	return v.st.GroupInstances(ctx, groupID, now)
}

// Group returns the read-only handle of group groupID of stream streamID.
func (v View) Group(streamID, groupID int64) ViewGroup {
	return ViewGroup{g: v.st.Group(streamID, groupID)}
}

// ViewGroup is a group's read-only statements in a View.
type ViewGroup struct {
	g Group
}

// Status: see Group.Status.
func (v ViewGroup) Status(ctx context.Context, lagCap int64, now Now) (StatusRow, error) {
	return v.g.Status(ctx, lagCap, now)
}

// DeadLetter: see Group.DeadLetter.
func (v ViewGroup) DeadLetter(ctx context.Context, messageID int64, maxDeliveries int) (DeadLetterRow, error) {
	return v.g.DeadLetter(ctx, messageID, maxDeliveries)
}

// ListDead: see Group.ListDead.
func (v ViewGroup) ListDead(ctx context.Context, afterID int64, limit int) ([]DeadLetter, error) {
	return v.g.ListDead(ctx, afterID, limit)
}

// BindingsInForce: see Group.BindingsInForce.
func (v ViewGroup) BindingsInForce(ctx context.Context) (int64, []string, error) {
	return v.g.BindingsInForce(ctx)
}

// BindingLedger: see Group.BindingLedger.
func (v ViewGroup) BindingLedger(ctx context.Context) (*LedgerRow, []LedgerRow, error) {
	return v.g.BindingLedger(ctx)
}
