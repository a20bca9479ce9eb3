package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// streamTables are a stream's tables, in the order Destroy drops them (the
// log last: its partitions go with it).
var streamTables = []string{"idempotency", "cursor", "range", "exception", "key_lease", "delivery", "binding",
	"binding_declaration", "chunk", "log"}

// groupTables are the per-stream tables that hold rows of one group.
var groupTables = []string{"cursor", "range", "exception", "key_lease", "delivery", "binding", "binding_declaration"}

// DestroyRequest removes a stream (Group 0) or one group of it.
type DestroyRequest struct {
	StreamID int64
	GroupID  int64 // 0: the whole stream
	DryRun   bool  // count what would go, change nothing (a READ ONLY transaction)
	Now      Now
}

// Destroyed is what a destroy removed, or would remove.
type Destroyed struct {
	// Relations are the stream's tables and partitions (a stream destroy).
	Relations []string
	// Rows counts the rows removed per table ("log" for a stream's
	// messages; a group destroy counts the group's rows of each table).
	Rows   map[string]int64
	Groups []string // the groups removed with the stream
}

// Destroy removes a stream with every table, partition and row it owns
// (its groups, their config and instances, its schedules), or one group's
// rows, in one transaction. It is refused with ErrGroupActive while an
// instance of the stream's groups (or of the group) is live.
func (st *Store) Destroy(ctx context.Context, req DestroyRequest) (Destroyed, error) {
	d := Destroyed{Rows: map[string]int64{}}
	f := func(tx pgx.Tx) error {
		// The stream row first: concurrent destroys and registers of this
		// stream queue here.
		lock := " FOR UPDATE"
		if req.DryRun {
			lock = ""
		}
		var id int64
		err := tx.QueryRow(ctx, st.sql(`-- store.Destroy
SELECT id FROM %[1]s.stream_config WHERE id = $1`)+lock, req.StreamID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("stream id %d: %w", req.StreamID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		var live int64
		if err := tx.QueryRow(ctx, st.sql(`-- store.Destroy
SELECT count(*) FROM %[1]s.worker_instance i
JOIN %[1]s.worker_config w ON w.id = i.worker_config_id
JOIN %[1]s.consumer_group_config g ON g.id = w.consumer_group_id
WHERE g.stream_id = $1 AND ($2 = 0 OR g.id = $2) AND i.expires_at > coalesce($3, now())`), req.StreamID, req.GroupID, req.Now).Scan(&live); err != nil {
			return fmt.Errorf("check for live instances: %w", err)
		}
		if live > 0 {
			return fmt.Errorf("%w: %d live instance(s); stop its consumers first", ErrGroupActive, live)
		}
		if req.GroupID != 0 {
			return st.destroyGroup(ctx, tx, req, &d)
		}
		return st.destroyStream(ctx, tx, req, &d)
	}
	var err error
	if req.DryRun {
		err = st.readOnly(ctx, "destroy (dry run)", f)
	} else {
		err = pgx.BeginFunc(ctx, st.pool, f)
	}
	if err != nil {
		return Destroyed{}, fmt.Errorf("destroy: %w", err)
	}
	if req.GroupID == 0 && !req.DryRun {
		renderedCache.drop(renderKey(st.schema, req.StreamID))
	}
	return d, nil
}

func (st *Store) destroyGroup(ctx context.Context, tx pgx.Tx, req DestroyRequest, d *Destroyed) error {
	for _, t := range groupTables {
		table := st.StreamTable(req.StreamID, t)
		q := "-- store.Destroy\nDELETE FROM " + table + " WHERE group_id = $1"
		if req.DryRun {
			q = "-- store.Destroy\nSELECT count(*) FROM " + table + " WHERE group_id = $1"
			var n int64
			if err := tx.QueryRow(ctx, q, req.GroupID).Scan(&n); err != nil {
				return fmt.Errorf("count %s: %w", t, err)
			}
			d.Rows[t] = n
			continue
		}
		tag, err := tx.Exec(ctx, q, req.GroupID)
		if err != nil {
			return fmt.Errorf("delete from %s: %w", t, err)
		}
		d.Rows[t] = tag.RowsAffected()
	}
	if req.DryRun {
		return nil
	}
	// worker_config, its log and instances go by cascade.
	if _, err := tx.Exec(ctx, st.sql(`-- store.Destroy
DELETE FROM %[1]s.consumer_group_config WHERE id = $1 AND stream_id = $2`), req.GroupID, req.StreamID); err != nil {
		return fmt.Errorf("delete group row: %w", err)
	}
	return nil
}

func (st *Store) destroyStream(ctx context.Context, tx pgx.Tx, req DestroyRequest, d *Destroyed) error {
	rows, err := tx.Query(ctx, st.sql(`-- store.Destroy
SELECT name FROM %[1]s.consumer_group_config WHERE stream_id = $1 ORDER BY name`), req.StreamID)
	if err != nil {
		return fmt.Errorf("list groups: %w", err)
	}
	if d.Groups, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return fmt.Errorf("list groups: %w", err)
	}
	var n int64
	if err := tx.QueryRow(ctx, "-- store.Destroy\nSELECT count(*) FROM "+st.StreamTable(req.StreamID, "log")).Scan(&n); err != nil {
		return fmt.Errorf("count messages: %w", err)
	}
	d.Rows["log"] = n
	rels, err := st.streamRelations(ctx, tx, req.StreamID)
	if err != nil {
		return err
	}
	d.Relations = rels
	if req.DryRun {
		return nil
	}
	for _, t := range streamTables {
		if _, err := tx.Exec(ctx, "-- store.Destroy\nDROP TABLE IF EXISTS "+st.StreamTable(req.StreamID, t)+" CASCADE"); err != nil {
			return fmt.Errorf("drop %s: %w", t, err)
		}
	}
	// Anything else named for the stream (a chunk detached by retention
	// and not yet dropped) goes too.
	left, err := st.streamRelations(ctx, tx, req.StreamID)
	if err != nil {
		return err
	}
	for _, r := range left {
		if _, err := tx.Exec(ctx, "-- store.Destroy\nDROP TABLE IF EXISTS "+st.s+"."+quote(r)+" CASCADE"); err != nil {
			return fmt.Errorf("drop %s: %w", r, err)
		}
	}
	// Its config log, migrations, groups (with their workers, config logs
	// and instances) and schedules go by cascade.
	if _, err := tx.Exec(ctx, st.sql(`-- store.Destroy
DELETE FROM %[1]s.stream_config WHERE id = $1`), req.StreamID); err != nil {
		return fmt.Errorf("delete stream row: %w", err)
	}
	return nil
}

// streamRelations lists the tables, partitions and sequences of the schema
// named for the stream (stream_<id>_...).
func (st *Store) streamRelations(ctx context.Context, tx pgx.Tx, streamID int64) ([]string, error) {
	rows, err := tx.Query(ctx, `-- store.Destroy
SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND starts_with(c.relname, $2)
ORDER BY c.relname`, st.schema, tablePrefix(streamID)+"_")
	if err != nil {
		return nil, fmt.Errorf("list the stream's tables: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the stream's tables: %w", err)
	}
	return out, nil
}
