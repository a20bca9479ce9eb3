package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeclareGroupConfig writes a declaration's per-worker documents (newest
// wins) under the group row's lock, appending a snapshot to
// worker_config_log for every document that changed. It returns the stored
// documents it replaced; an identical declaration writes nothing.
func (st *Store) DeclareGroupConfig(ctx context.Context, p GroupConfigParams) (old map[string][]byte, changed bool, err error) {
	return st.declareGroupConfig(ctx, p, false)
}

// GroupConfigParams are DeclareGroupConfig's and SeedGroupConfig's.
type GroupConfigParams struct {
	GroupID    int64
	Docs       map[string][]byte // worker name → its declared document
	DeclaredBy string
	Now        Now
}

// SeedGroupConfig is DeclareGroupConfig for a worker whose document is
// still the empty one only: a stored document (an operator's) is kept
// whole, never merged with the seed.
func (st *Store) SeedGroupConfig(ctx context.Context, p GroupConfigParams) (old map[string][]byte, changed bool, err error) {
	return st.declareGroupConfig(ctx, p, true)
}

func (st *Store) declareGroupConfig(ctx context.Context, p GroupConfigParams, seed bool) (old map[string][]byte, changed bool, err error) {
	groupID, docs, declaredBy, now := p.GroupID, p.Docs, p.DeclaredBy, p.Now
	old = map[string][]byte{}
	err = pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, st.sql(`-- store.DeclareGroupConfig
SELECT id FROM %[1]s.consumer_group_config WHERE id = $1 FOR UPDATE`), groupID); err != nil {
			return fmt.Errorf("lock group row: %w", err)
		}
		for name, doc := range docs {
			var id int64
			var stored []byte
			var same, unset bool
			if err := tx.QueryRow(ctx, st.sql(`-- store.DeclareGroupConfig
SELECT id, metadata::text, metadata = $3::jsonb, metadata = '{}'::jsonb FROM %[1]s.worker_config WHERE consumer_group_id = $1 AND name = $2`),
				groupID, name, string(doc)).Scan(&id, &stored, &same, &unset); err != nil {
				return fmt.Errorf("read worker %s: %w", name, err)
			}
			old[name] = stored
			if same || (seed && !unset) {
				continue
			}
			changed = true
			if _, err := tx.Exec(ctx, st.sql(`-- store.DeclareGroupConfig
WITH u AS (
    UPDATE %[1]s.worker_config SET metadata = $2::jsonb, updated_at = coalesce($4, now()) WHERE id = $1
)
INSERT INTO %[1]s.worker_config_log (worker_config_id, metadata, declared_by, declared_at)
VALUES ($1, $2::jsonb, $3, coalesce($4, now()))`), id, string(doc), declaredBy, now); err != nil {
				return fmt.Errorf("replace worker %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("declare group config: %w", err)
	}
	return old, changed, nil
}

// ReadGroupConfig reads the group's worker documents: the refresher's poll.
func (st *Store) ReadGroupConfig(ctx context.Context, groupID int64) (map[string][]byte, error) {
	rows, err := st.q().Query(ctx, st.sql(`-- store.ReadGroupConfig
SELECT name, metadata::text FROM %[1]s.worker_config WHERE consumer_group_id = $1`), groupID)
	if err != nil {
		return nil, fmt.Errorf("read group config: %w", err)
	}
	defer rows.Close()
	out := map[string][]byte{}
	for rows.Next() {
		var name string
		var doc []byte
		if err := rows.Scan(&name, &doc); err != nil {
			return nil, fmt.Errorf("read group config: scan: %w", err)
		}
		out[name] = doc
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read group config: %w", err)
	}
	return out, nil
}

// ReadGroupConfigs is ReadGroupConfig for many groups in one statement
// (refresher.Reads: every session of a process).
func (st *Store) ReadGroupConfigs(ctx context.Context, groupIDs []int64) (map[int64]map[string][]byte, error) {
	rows, err := st.q().Query(ctx, st.sql(`-- store.ReadGroupConfigs
SELECT consumer_group_id, name, metadata::text FROM %[1]s.worker_config WHERE consumer_group_id = ANY($1::bigint[])`), groupIDs)
	if err != nil {
		return nil, fmt.Errorf("read group configs: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]map[string][]byte, len(groupIDs))
	for rows.Next() {
		var id int64
		var name string
		var doc []byte
		if err := rows.Scan(&id, &name, &doc); err != nil {
			return nil, fmt.Errorf("read group configs: scan: %w", err)
		}
		if out[id] == nil {
			out[id] = map[string][]byte{}
		}
		out[id][name] = doc
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read group configs: %w", err)
	}
	return out, nil
}

// DeclarationRow is one declaration of a group's config, as the log holds
// it: who stored it, when, and every worker's document in force once it
// was stored (a declaration logs only the documents it changed).
type DeclarationRow struct {
	DeclaredBy string
	DeclaredAt time.Time
	Docs       map[string][]byte
}

// GroupDeclarations lists the group's newest declarations, newest first, at
// most limit. The rows one declaration logged share its declared_by and
// declared_at (one transaction); each worker's document in force then is
// its newest log row at or before the declaration's last one.
func (st *Store) GroupDeclarations(ctx context.Context, groupID int64, limit int) ([]DeclarationRow, error) {
	rows, err := st.q().Query(ctx, st.sql(`-- store.GroupDeclarations
WITH d AS (
    SELECT l.declared_by, l.declared_at, max(l.id) AS last_id
    FROM %[1]s.worker_config_log l JOIN %[1]s.worker_config w ON w.id = l.worker_config_id
    WHERE w.consumer_group_id = $1
    GROUP BY l.declared_by, l.declared_at
    ORDER BY max(l.id) DESC
    LIMIT $2
)
SELECT d.declared_by, d.declared_at, w.name,
       coalesce((SELECT l.metadata::text FROM %[1]s.worker_config_log l
                 WHERE l.worker_config_id = w.id AND l.id <= d.last_id
                 ORDER BY l.id DESC LIMIT 1), '{}')
FROM d CROSS JOIN %[1]s.worker_config w
WHERE w.consumer_group_id = $1
ORDER BY d.last_id DESC, w.name`), groupID, limit)
	if err != nil {
		return nil, fmt.Errorf("group declarations: %w", err)
	}
	var out []DeclarationRow
	var by, worker string
	var at time.Time
	var doc []byte
	_, err = pgx.ForEachRow(rows, []any{&by, &at, &worker, &doc}, func() error {
		if n := len(out); n == 0 || out[n-1].DeclaredBy != by || !out[n-1].DeclaredAt.Equal(at) {
			out = append(out, DeclarationRow{DeclaredBy: by, DeclaredAt: at, Docs: map[string][]byte{}})
		}
		out[len(out)-1].Docs[worker] = append([]byte(nil), doc...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("group declarations: %w", err)
	}
	return out, nil
}

// InstanceRow is a worker_instance of a group.
type InstanceRow struct {
	ID          string
	Worker      string
	DeclaredBy  string
	StartedAt   time.Time
	HeartbeatAt time.Time
	ExpiresAt   time.Time
	Live        bool
}

// GroupInstances lists the group's worker instances, live ones first.
func (st *Store) GroupInstances(ctx context.Context, groupID int64, now Now) ([]InstanceRow, error) {
	rows, err := st.q().Query(ctx, st.sql(`-- store.GroupInstances
SELECT i.id::text, w.name, i.declared_by, i.started_at, i.heartbeat_at, i.expires_at, i.expires_at > coalesce($2, now())
FROM %[1]s.worker_instance i JOIN %[1]s.worker_config w ON w.id = i.worker_config_id
WHERE w.consumer_group_id = $1
ORDER BY i.expires_at > coalesce($2, now()) DESC, w.name, i.started_at`), groupID, now)
	if err != nil {
		return nil, fmt.Errorf("group instances: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstanceRow, error) {
		var i InstanceRow
		err := r.Scan(&i.ID, &i.Worker, &i.DeclaredBy, &i.StartedAt, &i.HeartbeatAt, &i.ExpiresAt, &i.Live)
		return i, err
	})
}
