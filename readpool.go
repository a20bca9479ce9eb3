package sqlstreams

import (
	"context"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// ReadFrom says where an operator read (Streams, Groups, a group's Status,
// Inspect, Bindings, DeadLetters, DeadLetter) was served, so that a tool
// showing it can say how stale it may be. Every result of one read carries
// the same values. See ClientConfig.ReadPool.
type ReadFrom struct {
	// FromReplica: the read was served by a standby in recovery (the read
	// pool pointed at a streaming replica).
	FromReplica bool `json:"from_replica,omitempty"`
	// ReplicaLag is the standby's replay lag at the read, now() -
	// pg_last_xact_replay_timestamp() in the read's own transaction: the
	// rows may miss what the primary committed within it. It counts from
	// the last replayed commit, so on a primary with nothing to commit it
	// grows though the standby is current. 0 off a replica.
	ReplicaLag time.Duration `json:"replica_lag,omitempty"`
	// ReplicaLagUnknown: the standby has replayed no transaction since it
	// started (its replay timestamp is null), so its lag cannot be told;
	// ReplicaLag is 0 then.
	ReplicaLagUnknown bool `json:"replica_lag_unknown,omitempty"`
}

func readFrom(r store.Replica) ReadFrom {
	return ReadFrom{FromReplica: r.InRecovery, ReplicaLag: r.Lag, ReplicaLagUnknown: r.LagUnknown}
}

// read runs f on a view of one READ ONLY snapshot of the read pool (the
// primary's pool when ClientConfig.ReadPool is nil).
func (c *Client) read(ctx context.Context, what string, f func(store.View) error) (ReadFrom, error) {
	r, err := c.reads.Read(ctx, what, c.dbNow(), f)
	return readFrom(r), err
}
