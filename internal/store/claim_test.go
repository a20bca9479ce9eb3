package store

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A claim says whether it took the last claimable position: the claimer
// then probes (a read) before its next claim instead of running a claim
// that would find nothing (a write: a row lock, a transaction id, a
// commit's flush), which every burst cost every stream once.
func TestAClaimSaysWhetherItTookTheLastPosition(t *testing.T) {
	ctx := context.Background()
	st, streamID, groupID := planSetup(t)
	g := st.Group(streamID, groupID)
	produce := func(n int) {
		t.Helper()
		msgs := make([]NewMessage, n)
		for i := range msgs {
			msgs[i] = NewMessage{Version: 1, Payload: []byte(`{"a":1}`)}
		}
		_, err := st.Produce(ctx, nil, StreamRef{ID: streamID}, msgs, nil)
		require.NoError(t, err)
	}
	claim := func(limit int) (Range, bool) {
		t.Helper()
		r, ok, err := g.ClaimRange(ctx, ClaimParams{Owner: "00000000-0000-4000-8000-000000000001", Limit: limit, Lease: time.Minute})
		require.NoError(t, err)
		return r, ok
	}

	produce(5)
	r, ok := claim(2)
	require.True(t, ok)
	require.Len(t, r.Messages, 2)
	require.False(t, r.Drained, "three positions follow the range")
	r, ok = claim(3)
	require.True(t, ok)
	require.Len(t, r.Messages, 3)
	require.True(t, r.Drained, "a full range that took the last position")

	produce(2)
	r, ok = claim(10)
	require.True(t, ok)
	require.Len(t, r.Messages, 2)
	require.True(t, r.Drained, "a short range")
	_, ok = claim(10)
	require.False(t, ok, "nothing left")

	// A position whose transaction is still open is not claimable yet: the
	// range before it is drained as far as the claim could see.
	produce(1)
	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the test's own cleanup
	_, err = tx.Exec(ctx, "INSERT INTO "+st.s+"."+tablePrefix(streamID)+`_log (produced_at, version, payload) VALUES (now(), 1, '{"a":1}')`)
	require.NoError(t, err)
	produce(1) // committed, but after the open transaction's xid
	r, ok = claim(10)
	require.True(t, ok)
	require.Len(t, r.Messages, 1)
	require.True(t, r.Drained, "what follows waits behind an open transaction")
}

// A range its owner handed back (ReleaseRange) or expired (ExpireOwnedRanges,
// a claimer's restart) stays expired when the owner's heartbeat renews its
// leases afterwards: the owner keeps its id while a stopping session retries
// its hand-back, and the renewal used to extend every range it owned,
// those it had let go included, so a peer's sweep found nothing to take over.
func TestARenewalDoesNotReviveARangeItsOwnerLetGo(t *testing.T) {
	ctx := context.Background()
	st, streamID, groupID := planSetup(t)
	g := st.Group(streamID, groupID)
	const owner = "00000000-0000-4000-8000-000000000001"
	msgs := make([]NewMessage, 4)
	for i := range msgs {
		msgs[i] = NewMessage{Version: 1, Payload: []byte(`{"a":1}`)}
	}
	_, err := st.Produce(ctx, nil, StreamRef{ID: streamID}, msgs, nil)
	require.NoError(t, err)
	claim := func() Range {
		t.Helper()
		r, ok, err := g.ClaimRange(ctx, ClaimParams{Owner: owner, Limit: 2, Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)
		return r
	}
	expired := func() bool {
		t.Helper()
		e, err := g.LeasesExpired(ctx, nil)
		require.NoError(t, err)
		return e
	}

	r := claim()
	require.NoError(t, g.ReleaseRange(ctx, Release{RangeID: r.ID, Token: r.Token}))
	require.True(t, expired(), "the hand-back expired the range")
	for _, kinds := range []LeaseKinds{RangeLeases, AllLeases} {
		require.NoError(t, st.RenewLeases(ctx, RenewLeasesParams{Kinds: kinds, InstanceID: owner, StreamID: streamID, TTL: time.Minute}))
		require.True(t, expired(), "a renewal (kinds %d) after the hand-back leaves it expired", kinds)
	}

	// A live range of the same owner is still renewed, and a restart's
	// expiry is not undone either.
	live := claim()
	require.NoError(t, st.RenewLeases(ctx, RenewLeasesParams{Kinds: RangeLeases, InstanceID: owner, StreamID: streamID, TTL: time.Minute}))
	reclaimed, ok, err := g.ReclaimRange(ctx, ClaimParams{Owner: "00000000-0000-4000-8000-000000000002", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, r.ID, reclaimed.ID, "the handed-back range is taken over, not the live one")
	require.NoError(t, st.ExpireOwnedRanges(ctx, owner, streamID, nil))
	require.NoError(t, st.RenewLeases(ctx, RenewLeasesParams{Kinds: AllLeases, InstanceID: owner, StreamID: streamID, TTL: time.Minute}))
	reclaimed, ok, err = g.ReclaimRange(ctx, ClaimParams{Owner: "00000000-0000-4000-8000-000000000002", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, ok, "the range a restart expired stays expired after a renewal")
	require.Equal(t, live.ID, reclaimed.ID)
}

// A range shorter than the claim's limit (a stream's few messages, over many
// streams; a quiet stream's trickle) holds its messages in buffers sized for
// them, not for a full batch: buffers sized for the limit allocated, zeroed
// and left for the collector five times the bytes they held over 1,000
// streams (BENCHMARKS.md at af43cd7).
func TestAShortRangeAllocatesForItsMessages(t *testing.T) {
	ctx := context.Background()
	st, streamID, groupID := planSetup(t)
	g := st.Group(streamID, groupID)
	payload := []byte(`{"a":"` + strings.Repeat("x", 1000) + `"}`)
	const short, limit = 200, 1000
	msgs := make([]NewMessage, 2*short)
	for i := range msgs {
		msgs[i] = NewMessage{Version: 1, Payload: payload}
	}
	_, err := st.Produce(ctx, nil, StreamRef{ID: streamID}, msgs, nil)
	require.NoError(t, err)
	claim := func(limit int) Range {
		t.Helper()
		r, ok, err := g.ClaimRange(ctx, ClaimParams{Owner: "00000000-0000-4000-8000-000000000001", Limit: limit, Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, ok)
		return r
	}
	require.Len(t, claim(short).Messages, short) // the statements prepared, the connection's buffers grown

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := claim(limit)
	runtime.ReadMemStats(&after)
	require.Len(t, r.Messages, short)
	require.True(t, r.Drained)
	held := short * len(payload)
	allocated := int(after.TotalAlloc - before.TotalAlloc)
	t.Logf("a range of %d messages (%d payload bytes) under a limit of %d: %d bytes allocated", short, held, limit, allocated)
	require.Less(t, allocated, 2*held, "a range of %d messages claimed with a limit of %d", short, limit)
}

// A claim into a SlabPool copies its payloads into slabs a recycled range
// gave back, not into fresh memory (after an idle spell, fresh memory was
// scavenged and faulted in again: decision 0060), and each
// message still reads as produced.
func TestAClaimReusesARecycledRangesSlabs(t *testing.T) {
	ctx := context.Background()
	st, streamID, groupID := planSetup(t)
	g := st.Group(streamID, groupID)
	const per = 50
	msgs := make([]NewMessage, 2*per)
	for i := range msgs {
		msgs[i] = NewMessage{Version: 1, Payload: []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("y", 500)))}
	}
	_, err := st.Produce(ctx, nil, StreamRef{ID: streamID}, msgs, nil)
	require.NoError(t, err)
	pool := NewSlabPool(1 << 20)
	claim := func() Range {
		t.Helper()
		r, ok, err := g.ClaimRange(ctx, ClaimParams{Owner: "00000000-0000-4000-8000-000000000001", Limit: per, Lease: time.Minute, Slabs: pool})
		require.NoError(t, err)
		require.True(t, ok)
		require.Len(t, r.Messages, per)
		return r
	}
	first := claim()
	require.NotEmpty(t, first.slabs)
	used := base(first.slabs[0])
	require.Equal(t, string(msgs[0].Payload), string(first.Messages[0].Payload))
	first.Recycle(pool)
	require.Positive(t, pool.Held())
	require.Nil(t, first.slabs, "a recycled range gives its slabs once")

	second := claim()
	require.Equal(t, used, base(second.slabs[0]), "the second claim copies into the first one's slab")
	for i, m := range second.Messages {
		require.Equal(t, string(msgs[per+i].Payload), string(m.Payload), "message %d", per+i)
	}
}

// A claim's transaction commits without waiting for the disk (decision
// 0090), and only it: the setting is local to the claim's transaction, so
// the connection's next transaction (a settlement, a key lease) commits
// durably again.
func TestTheClaimAloneCommitsAsynchronously(t *testing.T) {
	ctx := context.Background()
	pool := ownPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	st, streamID, groupID := planSetupOn(t, pool)
	_, err := pool.Exec(ctx, fmt.Sprintf("INSERT INTO %s.%s_log (produced_at, version, payload) VALUES (now(), 1, '{}')", st.s, tablePrefix(streamID)))
	require.NoError(t, err)
	claim := st.stream(streamID).sql(claimSQL)
	owner := "00000000-0000-4000-8000-000000000001"
	_, err = pool.Exec(ctx, "SET synchronous_commit = on") // the test cluster's default is off; a durable server's is on
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, claim, groupID, 100, nil, owner, time.Minute)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, n, "the claim took the message's range")
	var inside, after string
	require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&inside))
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
	require.Equal(t, "off", inside, "the claim's transaction commits without waiting for the disk")
	require.Equal(t, "on", after, "the connection's next transaction commits durably")
}
