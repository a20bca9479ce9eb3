package store

import (
	"context"
	"fmt"
	"time"
)

// InsertInstanceParams are InsertInstance's.
type InsertInstanceParams struct {
	ID             string // the instance's id, a UUID
	WorkerConfigID int64
	DeclaredBy     string
	TTL            time.Duration
	Now            Now
}

// InsertInstance claims a worker_instance row: this process now does the
// worker's job, alive until expires_at unless renewed.
func (st *Store) InsertInstance(ctx context.Context, p InsertInstanceParams) error {
	if _, err := st.pool.Exec(ctx, st.sql(`-- store.InsertInstance
INSERT INTO %[1]s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
VALUES ($1::uuid, $2, $3, coalesce($4, now()), coalesce($4, now()), coalesce($4, now()) + $5::interval)`),
		p.ID, p.WorkerConfigID, p.DeclaredBy, p.Now, p.TTL); err != nil {
		return fmt.Errorf("insert worker instance: %w", err)
	}
	return nil
}

// RenewInstanceParams are RenewInstance's.
type RenewInstanceParams struct {
	ID       string
	StreamID int64
	TTL      time.Duration
	Now      Now
	// Leases: renew the leases of every range and exception row the
	// instance owns on StreamID too.
	Leases bool
}

// RenewInstance extends the instance's heartbeat and, with Leases, the
// leases of every range and exception row it owns on StreamID (a heartbeat
// whose claimer holds nothing skips that second statement: an idle
// session's beat is one statement). It renews only a live row: live=false
// means the row lapsed (its expires_at passed: the fleet may have taken
// over its leases already) or is gone, and the instance must not go on as
// if it held anything; its session registers again as a new incarnation.
func (st *Store) RenewInstance(ctx context.Context, p RenewInstanceParams) (live bool, err error) {
	b := st.sql(`-- store.RenewInstance
UPDATE %[1]s.worker_instance SET heartbeat_at = coalesce($2, now()), expires_at = coalesce($2, now()) + $3::interval
WHERE id = $1::uuid AND expires_at > coalesce($2, now())`)
	tag, err := st.pool.Exec(ctx, b, p.ID, p.Now, p.TTL)
	if err != nil {
		return false, fmt.Errorf("renew worker instance: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if !p.Leases {
		return true, nil
	}
	return true, st.RenewLeases(ctx, RenewLeasesParams{InstanceID: p.ID, StreamID: p.StreamID, TTL: p.TTL, Now: p.Now})
}

// RenewInstancesParams are RenewInstances'.
type RenewInstancesParams struct {
	// Instances are the rows to renew, each by its own TTL.
	Instances []InstanceRenewal
	// Watch are the workers (worker_config ids) whose instances that lapsed
	// within LapsedWithin are reported.
	Watch        []int64
	LapsedWithin time.Duration
	Now          Now
}

// InstanceRenewal is one row RenewInstances renews.
type InstanceRenewal struct {
	ID  string
	TTL time.Duration
}

// RenewInstances is RenewInstance's first statement for many instances at
// once (heartbeat.Beats: every session of a process in one statement): it
// extends each live row by its ttl and returns the ids it renewed; an id
// missing from the result lapsed or is gone. Each process renews only its own
// rows and one batch at a time, so no lock order is needed.
//
// It also reports which of the workers Watch have an instance that lapsed
// within the last LapsedWithin (its holder died or stalled): the sessions
// of those workers sweep for its leases (decision 0040).
func (st *Store) RenewInstances(ctx context.Context, p RenewInstancesParams) (live map[string]bool, lapsed map[int64]bool, err error) {
	ids, ttls := make([]string, len(p.Instances)), make([]time.Duration, len(p.Instances))
	for i, in := range p.Instances {
		ids[i], ttls[i] = in.ID, in.TTL
	}
	rows, err := st.pool.Query(ctx, st.sql(`-- store.RenewInstances
WITH renewed AS (
    UPDATE %[1]s.worker_instance w
    SET heartbeat_at = coalesce($3, now()), expires_at = coalesce($3, now()) + u.ttl
    FROM unnest($1::uuid[], $2::interval[]) AS u(id, ttl)
    WHERE w.id = u.id AND w.expires_at > coalesce($3, now())
    RETURNING w.id
), lapsed AS (
    SELECT DISTINCT i.worker_config_id FROM %[1]s.worker_instance i
    WHERE i.worker_config_id = ANY($4::bigint[])
      AND i.expires_at <= coalesce($3, now()) AND i.expires_at > coalesce($3, now()) - $5::interval
)
SELECT id::text, NULL::bigint FROM renewed
UNION ALL
SELECT NULL, worker_config_id FROM lapsed`), ids, ttls, p.Now, p.Watch, p.LapsedWithin)
	if err != nil {
		return nil, nil, fmt.Errorf("renew worker instances: %w", err)
	}
	live, lapsed = make(map[string]bool, len(ids)), map[int64]bool{}
	for rows.Next() {
		var id *string
		var worker *int64
		if err := rows.Scan(&id, &worker); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("renew worker instances: %w", err)
		}
		if id != nil {
			live[*id] = true
		}
		if worker != nil {
			lapsed[*worker] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("renew worker instances: %w", err)
	}
	return live, lapsed, nil
}

// LeaseKinds says which of its leases an instance's renewal renews. A
// session's range claimer and exception claimer are two instances, and
// each takes one kind of lease only: ranges, or exception rows.
type LeaseKinds uint8

const (
	RangeLeases     LeaseKinds = 1 << iota // the range claimer's
	ExceptionLeases                        // the exception claimer's
	AllLeases       = RangeLeases | ExceptionLeases
)

// RenewLeasesParams are RenewLeases'.
type RenewLeasesParams struct {
	// Kinds are the kinds of lease the instance takes (zero: AllLeases).
	Kinds      LeaseKinds
	InstanceID string
	StreamID   int64
	TTL        time.Duration
	Now        Now
}

// RenewLeases is RenewInstance's second statement: it extends the leases
// of the kinds the instance takes (ranges, exception rows) it owns on
// StreamID. A statement over one table is the cheaper to plan, and over
// 1,000 streams a stream's statements are planned afresh on most calls:
// the statement over both tables planned for 3.5 ms a call there (decision
// 0042).
func (st *Store) RenewLeases(ctx context.Context, p RenewLeasesParams) error {
	stmt := renewRangesSQL
	switch p.Kinds {
	case RangeLeases:
		stmt = renewRangeLeasesSQL
	case ExceptionLeases:
		stmt = renewExceptionLeasesSQL
	}
	if _, err := st.onLane(p.InstanceID).Exec(ctx, st.stream(p.StreamID).sql(stmt), oneShot, p.InstanceID, p.Now, p.TTL); err != nil {
		return fmt.Errorf("renew leases: %w", err)
	}
	return nil
}

// DeleteInstance gives the instance's row back on a graceful stop.
func (st *Store) DeleteInstance(ctx context.Context, id string) error {
	if _, err := st.pool.Exec(ctx, st.sql(`-- store.DeleteInstance
DELETE FROM %[1]s.worker_instance WHERE id = $1::uuid`), id); err != nil {
		return fmt.Errorf("delete worker instance: %w", err)
	}
	return nil
}

// ExpireOwnedRanges hands every range owned by an instance back at once. A
// claimer that restarts without its in-memory state calls it, so ranges it can
// no longer finish are not kept alive by the heartbeat.
func (st *Store) ExpireOwnedRanges(ctx context.Context, owner string, streamID int64, now Now) error {
	r := st.stream(streamID)
	if _, err := st.pool.Exec(ctx, r.sql(renewRangesSQL), owner, now, -time.Millisecond); err != nil {
		return fmt.Errorf("expire owned ranges: %w", err)
	}
	if _, err := st.pool.Exec(ctx, r.sql(releaseOwnedKeysSQL), owner, keyGateFree); err != nil {
		return fmt.Errorf("release owned keys: %w", err)
	}
	return nil
}

// The lease statements of an instance.

// Everything an instance holds lives exactly as long as its heartbeat.
// Key leases are not renewed here: a key is held while its owner's
// worker_instance is live (see acquireKeys), so a beat never locks
// the key rows a commit is deleting (the two used to deadlock).
// Ranges, then exception rows, each in the lock order (locks.go): the
// exception rows are locked only once the ranges are done (xl reads r).
// A row another transaction has locked is skipped, never waited for: the
// heartbeat's beats and renewals share one loop, and a renewal waiting on
// a lock held up the beat that finds the incarnation lapsed. The next
// renewal, a third of the TTL later, takes the row.
// A range whose lease has already expired is not renewed: its owner let it
// go (a hand-back, a restarted claimer's ExpireOwnedRanges) and keeps the
// owner column, so a renewal while the owner's session is still stopping
// would revive it and hide it from the peers' sweeps; one that lapsed on
// its own is a peer's to take over.
var renewRangesSQL = perStream(`-- store.RenewLeases
WITH rl AS (
    SELECT id FROM {s}.{t}_range WHERE owner = $1::uuid AND expires_at >= coalesce($2, now())
    ORDER BY id FOR UPDATE SKIP LOCKED
), r AS (
    UPDATE {s}.{t}_range SET expires_at = coalesce($2, now()) + $3::interval
    WHERE id IN (SELECT id FROM rl) AND owner = $1::uuid
    RETURNING 1
), xl AS (
    SELECT group_id, message_xid, message_id FROM {s}.{t}_exception
    WHERE owner = $1::uuid AND status IN ('running', 'queued') AND (SELECT count(*) FROM r) >= 0
    ORDER BY group_id, message_xid, message_id FOR UPDATE SKIP LOCKED
)
UPDATE {s}.{t}_exception x SET expires_at = coalesce($2, now()) + $3::interval
FROM xl
WHERE x.group_id = xl.group_id AND x.message_xid = xl.message_xid AND x.message_id = xl.message_id
  AND x.owner = $1::uuid AND x.status IN ('running', 'queued')`)

// renewRangesSQL's first half, for a range claimer's instance.
var renewRangeLeasesSQL = perStream(`-- store.RenewLeases
WITH rl AS (
    SELECT id FROM {s}.{t}_range WHERE owner = $1::uuid AND expires_at >= coalesce($2, now())
    ORDER BY id FOR UPDATE SKIP LOCKED
)
UPDATE {s}.{t}_range SET expires_at = coalesce($2, now()) + $3::interval
WHERE id IN (SELECT id FROM rl) AND owner = $1::uuid`)

// renewRangesSQL's second half, for an exception claimer's instance.
var renewExceptionLeasesSQL = perStream(`-- store.RenewLeases
WITH xl AS (
    SELECT group_id, message_xid, message_id FROM {s}.{t}_exception
    WHERE owner = $1::uuid AND status IN ('running', 'queued')
    ORDER BY group_id, message_xid, message_id FOR UPDATE SKIP LOCKED
)
UPDATE {s}.{t}_exception x SET expires_at = coalesce($2, now()) + $3::interval
FROM xl
WHERE x.group_id = xl.group_id AND x.message_xid = xl.message_xid AND x.message_id = xl.message_id
  AND x.owner = $1::uuid AND x.status IN ('running', 'queued')`)

// A key gate the owner held is freed, not deleted (KeyGateKey).
var releaseOwnedKeysSQL = perStream(`-- store.ExpireOwnedRanges
WITH kl AS (
    SELECT group_id, message_key FROM {s}.{t}_key_lease WHERE owner = $1::uuid
    ORDER BY group_id, message_key FOR UPDATE
), gf AS (
    UPDATE {s}.{t}_key_lease l SET token = $2::uuid, owner = $2::uuid, expires_at = '-infinity'
    FROM kl WHERE kl.message_key = '' AND l.group_id = kl.group_id AND l.message_key = ''
)
DELETE FROM {s}.{t}_key_lease l USING kl
WHERE kl.message_key <> '' AND l.group_id = kl.group_id AND l.message_key = kl.message_key`)
