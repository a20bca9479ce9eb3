package store

import (
	"context"
	"fmt"
	"time"
)

// InsertInstance claims a worker_instance row: this process now does the
// worker's job, alive until expires_at unless renewed.
func (st *Store) InsertInstance(ctx context.Context, id string, workerConfigID int64, declaredBy string, ttl time.Duration, now Now) error {
	if _, err := st.pool.Exec(ctx, st.sql(`-- store.InsertInstance
INSERT INTO %[1]s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
VALUES ($1::uuid, $2, $3, coalesce($4, now()), coalesce($4, now()), coalesce($4, now()) + $5::interval)`),
		id, workerConfigID, declaredBy, now, ttl); err != nil {
		return fmt.Errorf("insert worker instance: %w", err)
	}
	return nil
}

// RenewInstance extends the instance's heartbeat and the leases of every range
// it owns on streamID, in one statement. found=false means the row is gone:
// the instance was lost and must not go on as if it held anything.
func (st *Store) RenewInstance(ctx context.Context, id string, streamID int64, ttl time.Duration, now Now) (found bool, err error) {
	t := st.streamTables(streamID)
	b := st.sql(`-- store.RenewInstance
UPDATE %[1]s.worker_instance SET heartbeat_at = coalesce($2, now()), expires_at = coalesce($2, now()) + $3::interval
WHERE id = $1::uuid`)
	tag, err := st.pool.Exec(ctx, b, id, now, ttl)
	if err != nil {
		return false, fmt.Errorf("renew worker instance: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if _, err := st.pool.Exec(ctx, t.renewRanges, id, now, ttl); err != nil {
		return true, fmt.Errorf("renew range leases: %w", err)
	}
	return true, nil
}

// DeleteInstance gives the instance's row back on a graceful stop.
func (st *Store) DeleteInstance(ctx context.Context, id string) error {
	if _, err := st.pool.Exec(ctx, st.sql(`-- store.DeleteInstance
DELETE FROM %[1]s.worker_instance WHERE id = $1::uuid`), id); err != nil {
		return fmt.Errorf("delete worker instance: %w", err)
	}
	return nil
}

// LiveInstances counts a worker's instances whose heartbeat has not lapsed.
func (st *Store) LiveInstances(ctx context.Context, workerConfigID int64, now Now) (int, error) {
	var n int
	err := st.pool.QueryRow(ctx, st.sql(`-- store.LiveInstances
SELECT count(*) FROM %[1]s.worker_instance WHERE worker_config_id = $1 AND expires_at > coalesce($2, now())`),
		workerConfigID, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count live instances: %w", err)
	}
	return n, nil
}

// ExpireInstanceLeases moves an instance's heartbeat and its range leases into
// the past. Tests and the simulator use it to stand for time passing after a
// process died, instead of waiting out a TTL.
func (st *Store) ExpireInstanceLeases(ctx context.Context, id string, streamID int64) error {
	if _, err := st.pool.Exec(ctx, st.sql(`-- store.ExpireInstanceLeases
UPDATE %[1]s.worker_instance SET expires_at = now() - interval '1 second' WHERE id = $1::uuid`), id); err != nil {
		return fmt.Errorf("expire instance: %w", err)
	}
	if _, err := st.pool.Exec(ctx, st.streamTables(streamID).renewRanges, id, nil, -time.Second); err != nil {
		return fmt.Errorf("expire range leases: %w", err)
	}
	return nil
}

// ExpireOwnedRanges hands every range owned by an instance back at once. A
// claimer that restarts without its in-memory state calls it, so ranges it can
// no longer finish are not kept alive by the heartbeat.
func (st *Store) ExpireOwnedRanges(ctx context.Context, owner string, streamID int64, now Now) error {
	t := st.streamTables(streamID)
	if _, err := st.pool.Exec(ctx, t.renewRanges, owner, now, -time.Millisecond); err != nil {
		return fmt.Errorf("expire owned ranges: %w", err)
	}
	if _, err := st.pool.Exec(ctx, t.releaseOwnedKeys, owner); err != nil {
		return fmt.Errorf("release owned keys: %w", err)
	}
	return nil
}
