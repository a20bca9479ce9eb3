package sqlstreams

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// keyGateGroup is a group "g" of the stream "orders", its store handle and
// range-claimer worker row (wc), with a live instance of that worker (the
// one that asks for the gate) and one of its exception-claimer worker (an
// instance the gate does not wait for, holding leases of its own), for an
// hour.
type keyGateGroup struct {
	e            *env
	c            *Consumer[order]
	g            store.Group
	wc           int64
	ranges, excs string
}

func newKeyGateGroup(t *testing.T) keyGateGroup {
	t.Helper()
	ctx := context.Background()
	e, _, c := setup(t, nil, "g", 0)
	k := keyGateGroup{e: e, c: c, g: c.db(), wc: c.group.Workers[store.WorkerMessageConsumer], ranges: engine.NewID(), excs: engine.NewID()}
	require.NoError(t, e.client.store.InsertInstance(ctx, store.InsertInstanceParams{ID: k.ranges, WorkerConfigID: k.wc, DeclaredBy: "test", TTL: time.Hour}))
	require.NoError(t, e.client.store.InsertInstance(ctx, store.InsertInstanceParams{ID: k.excs, WorkerConfigID: c.group.Workers[store.WorkerExceptionConsumer], DeclaredBy: "test", TTL: time.Hour}))
	return k
}

// deliveries records the messages handled, by id, and signals each one's
// first delivery.
type deliveries struct {
	*collector
	mu    sync.Mutex
	waits map[string]chan struct{}
}

func newDeliveries(want int) *deliveries {
	return &deliveries{collector: newCollector(want), waits: map[string]chan struct{}{}}
}

func (d *deliveries) add(id string) {
	d.collector.add(id)
	d.mu.Lock()
	defer d.mu.Unlock()
	if ch := d.waits[id]; ch != nil && d.count(id) == 1 {
		close(ch)
	}
}

// when returns a channel closed once id has been handled.
func (d *deliveries) when(id string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := d.waits[id]
	if ch == nil {
		ch = make(chan struct{})
		if d.count(id) > 0 {
			close(ch)
		}
		d.waits[id] = ch
	}
	return ch
}

func (d *deliveries) count(id string) int {
	d.collector.mu.Lock()
	defer d.collector.mu.Unlock()
	return d.seen[id]
}

// keyRunner is a handler that records what it handled (deliveries), holds
// "a-1" until release closes (started closes when it begins), and counts
// the calls that began while another message of the same key (the id's
// first letter) ran.
type keyRunner struct {
	*deliveries
	started, release chan struct{}
	mu               sync.Mutex
	running          map[string]int
	overlaps         int
}

func newKeyRunner(want int) *keyRunner {
	return &keyRunner{deliveries: newDeliveries(want), started: make(chan struct{}), release: make(chan struct{}), running: map[string]int{}}
}

func (r *keyRunner) handle(ctx context.Context, o *order) error {
	key := o.OrderID[:1]
	r.mu.Lock()
	r.running[key]++
	if r.running[key] > 1 {
		r.overlaps++
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running[key]--
		r.mu.Unlock()
	}()
	if o.OrderID == "a-1" {
		close(r.started)
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.add(o.OrderID)
	return nil
}

// finish releases "a-1" and checks that every message was handled once and
// no two of a key ran at once.
func (r *keyRunner) finish(t *testing.T) {
	t.Helper()
	close(r.release)
	within(t, r.done, "every message")
	require.Zero(t, r.duplicates())
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Zero(t, r.overlaps, "no two messages of a key ran at once")
}

// The group's key gate (decision 0051) and the key leases of other live
// holders exclude each other: the gate is refused while another holder
// has a key, no key is granted to another while the gate is held, and
// giving the gate up writes the keys its holder still runs as rows.
func TestTheKeyGateAndOtherHoldersKeysExcludeEachOther(t *testing.T) {
	k := newKeyGateGroup(t)
	ctx := context.Background()
	e, c, g, wc, a, b := k.e, k.c, k.g, k.wc, k.ranges, k.excs
	excl := func(keys ...string) []store.KeyClaim {
		out := make([]store.KeyClaim, len(keys))
		for i, k := range keys {
			out[i] = store.KeyClaim{Key: k}
		}
		return out
	}
	acquire := func(owner, gate string, keys ...string) map[string]bool {
		t.Helper()
		held, _, err := g.AcquireKeys(ctx, store.AcquireKeys{Want: excl(keys...), Token: engine.NewID(), Owner: owner, TTL: time.Minute,
			Gate: gate, WorkerConfigID: wc})
		require.NoError(t, err)
		return held
	}
	rows := func() map[string]string {
		t.Helper()
		r, err := e.pool.Query(ctx, fmt.Sprintf("SELECT message_key, owner::text FROM %s.stream_%d_key_lease WHERE group_id = $1",
			e.client.Schema(), c.group.StreamID), c.group.ID)
		require.NoError(t, err)
		defer r.Close()
		out := map[string]string{}
		for r.Next() {
			var k, o string
			require.NoError(t, r.Scan(&k, &o))
			out[k] = o
		}
		require.NoError(t, r.Err())
		return out
	}

	// b (another live holder) has k1: the gate is refused, and a gets only
	// the free key, as a row.
	require.Equal(t, map[string]bool{"k1": true}, acquire(b, "", "k1"))
	require.Equal(t, map[string]bool{"k2": true}, acquire(a, engine.NewID(), "k1", "k2"), "the gate refused while b holds a key")
	_, err := g.ReleaseKeys(ctx, nil)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, fmt.Sprintf("DELETE FROM %s.stream_%d_key_lease WHERE group_id = $1 AND message_key <> ''",
		e.client.Schema(), c.group.StreamID), c.group.ID)
	require.NoError(t, err)

	// Nobody else holds anything: a gets the gate, and its keys without a
	// row each.
	gate := engine.NewID()
	held := acquire(a, gate, "k1", "k2")
	require.True(t, held[store.KeyGateKey], "the gate granted")
	require.True(t, held["k1"] && held["k2"])
	require.Equal(t, map[string]string{"": a}, rows(), "no row per key under the gate")

	// While a holds the gate, b gets no key at all, and a second gate is
	// refused.
	require.Empty(t, acquire(b, "", "k3"), "no key for another holder under the gate")
	require.Empty(t, acquire(b, engine.NewID(), "k4"), "nor the gate")

	// Giving the gate up writes the keys a still holds, then frees it: b
	// finds k1 busy, and k3 free.
	freed, missing, err := g.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: gate, Owner: a, TTL: time.Minute,
		Keys: []store.KeyLease{{Key: "k1", Token: engine.NewID()}}})
	require.NoError(t, err)
	require.True(t, freed)
	require.Zero(t, missing)
	require.Equal(t, map[string]string{"": "00000000-0000-0000-0000-000000000000", "k1": a}, rows())
	require.Equal(t, map[string]bool{"k3": true}, acquire(b, "", "k1", "k3"))

	// A second release under the same token (a retry whose first reply was
	// lost) changes nothing.
	freed, _, err = g.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: gate, Owner: a, TTL: time.Minute,
		Keys: []store.KeyLease{{Key: "k9", Token: engine.NewID()}}})
	require.NoError(t, err)
	require.False(t, freed)
	require.NotContains(t, rows(), "k9")
}

// However a gate request and another holder's key acquisition interleave,
// never both are granted: each locks the gate row first (a share lock for
// the key, an exclusive one for the gate), so the later one's statement
// sees the earlier one's commit.
func TestAKeyGateRaceGrantsOneSide(t *testing.T) {
	k := newKeyGateGroup(t)
	ctx := context.Background()
	g, wc, a, b := k.g, k.wc, k.ranges, k.excs
	type result struct {
		held map[string]bool
		err  error
	}
	const rounds = 100
	gates, keys := 0, 0
	for round := range rounds {
		gate, token := engine.NewID(), engine.NewID()
		start := make(chan struct{})
		res := make(chan result, 2)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			held, _, err := g.AcquireKeys(ctx, store.AcquireKeys{Want: []store.KeyClaim{{Key: "hot"}}, Token: engine.NewID(), Owner: a,
				TTL: time.Minute, Gate: gate, WorkerConfigID: wc})
			res <- result{held, err}
		}()
		go func() {
			defer wg.Done()
			<-start
			held, _, err := g.AcquireKeys(ctx, store.AcquireKeys{Want: []store.KeyClaim{{Key: fmt.Sprintf("k%d", round)}}, Token: token,
				Owner: b, TTL: time.Minute})
			res <- result{held, err}
		}()
		close(start)
		wg.Wait()
		close(res)
		var gated, keyed bool
		for r := range res {
			require.NoError(t, r.err)
			gated = gated || r.held[store.KeyGateKey]
			keyed = keyed || r.held[fmt.Sprintf("k%d", round)]
		}
		require.False(t, gated && keyed, "round %d: the gate and another holder's key were both granted", round)
		if gated {
			gates++
			_, _, err := g.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: gate, Owner: a})
			require.NoError(t, err)
		}
		if keyed {
			keys++
			_, err := g.ReleaseKeys(ctx, []store.KeyLease{{Key: fmt.Sprintf("k%d", round), Token: token}})
			require.NoError(t, err)
		}
	}
	t.Logf("%d rounds: the gate won %d, the key %d", rounds, gates, keys)
	require.Equal(t, rounds, gates+keys, "one side is granted each round")
}

// A session alone in its group takes the key gate at its first keyed claim
// and runs its exclusive keys without a lease row each, one message of a
// key at a time.
func TestASoleSessionRunsItsExclusiveKeysUnderTheKeyGate(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	_, err := s.ProduceBatch(ctx, []BatchItem[order]{
		{Msg: order{OrderID: "a-1"}, Key: "a"}, {Msg: order{OrderID: "a-2"}, Key: "a"}, {Msg: order{OrderID: "b-1"}, Key: "b"},
	}, &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.NoError(t, err)
	col := newKeyRunner(3)
	consume(t, c, col.handle, &ConsumeOptions{BatchLimit: 10, ClaimPollRate: 5 * time.Millisecond})
	within(t, col.started, "a-1 running")
	within(t, col.when("b-1"), "b-1, another key, beside it")
	require.Zero(t, col.count("a-2"), "a-2 waits for a-1, its key's running message")
	var keyRows int
	var gateOwner string
	require.NoError(t, e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE message_key <> ''),
       coalesce(max(owner::text) FILTER (WHERE message_key = ''), '')
FROM %s.stream_%d_key_lease WHERE group_id = $1`, e.client.Schema(), c.group.StreamID), c.group.ID).Scan(&keyRows, &gateOwner))
	require.Zero(t, keyRows, "no lease row per key under the gate")
	require.NotEqual(t, "00000000-0000-0000-0000-000000000000", gateOwner, "the gate is held")
	require.Positive(t, c.Stats().KeyGates)
	col.finish(t)
}

// A second session of the group makes the first give its key gate up: the
// key the first still runs becomes a lease row, so the second never runs
// that key's next message beside it, and takes the other keys.
func TestASecondSessionMakesTheFirstGiveItsKeyGateUp(t *testing.T) {
	ctx := context.Background()
	client, counter, s, c := countedGroup(t)
	excl := &BatchOptions{Message: &MessageOptions{Concurrency: Exclusive}}
	_, err := s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "a-1"}, Key: "a"}}, excl)
	require.NoError(t, err)

	col := newKeyRunner(3)
	opts := &ConsumeOptions{BatchLimit: 10, ClaimPollRate: 5 * time.Millisecond}
	consume(t, c, col.handle, opts)
	within(t, col.started, "a-1 running in the first session")
	require.Positive(t, c.Stats().KeyGates, "the first session, alone, took the gate")

	gaveUp := counter.When("store.ReleaseKeyGate", 1)
	consume(t, c, col.handle, opts)
	within(t, gaveUp, "the first session giving its gate up to the second")
	_, err = s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "a-2"}, Key: "a"}, {Msg: order{OrderID: "b-1"}, Key: "b"}}, excl)
	require.NoError(t, err)
	within(t, col.when("b-1"), "b-1, a free key")
	require.Zero(t, col.count("a-2"), "a-2 waits while a-1 runs")
	var owner string
	require.NoError(t, client.store.Pool().QueryRow(ctx, fmt.Sprintf("SELECT owner::text FROM %s.stream_%d_key_lease WHERE group_id = $1 AND message_key = 'a'",
		client.Schema(), c.group.StreamID), c.group.ID).Scan(&owner), "a-1's key is a lease row now")
	require.NotEqual(t, "00000000-0000-0000-0000-000000000000", owner)

	col.finish(t)
}

// A range claimed while the claimer holds the key gate places each keyed
// message as it comes, with no acquisition: a key new to the claimer runs
// at once under the gate, a key whose earlier message still runs waits
// behind it in log order, and a key the claimer holds for an ordered
// message (never shared) parks the message as busy until the key is free.
func TestARangeClaimedUnderAHeldKeyGatePlacesEachKey(t *testing.T) {
	ctx := context.Background()
	_, counter, s, c := countedGroup(t)
	excl, ord := &MessageOptions{Concurrency: Exclusive}, &MessageOptions{Concurrency: Ordered}
	_, err := s.ProduceBatch(ctx, []BatchItem[order]{
		{Msg: order{OrderID: "a-1"}, Key: "a", Message: excl},
		{Msg: order{OrderID: "o-1"}, Key: "o", Message: ord},
	}, nil)
	require.NoError(t, err)

	d := newDeliveries(6)
	release := make(chan struct{})
	started := map[string]chan struct{}{"a-1": make(chan struct{}), "o-1": make(chan struct{})}
	var mu sync.Mutex
	running, overlaps := map[string]int{}, 0
	var seen []string
	consume(t, c, func(ctx context.Context, o *order) error {
		key := o.OrderID[:1]
		mu.Lock()
		if running[key]++; running[key] > 1 {
			overlaps++
		}
		seen = append(seen, o.OrderID)
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[key]--
			mu.Unlock()
		}()
		if ch := started[o.OrderID]; ch != nil {
			close(ch)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		d.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 3, ClaimPollRate: 5 * time.Millisecond})
	within(t, started["a-1"], "a-1 running, under the gate")
	within(t, started["o-1"], "o-1 running, its ordered key leased")
	require.Positive(t, c.Stats().KeyGates, "the gate granted with the first range's keys")

	// The next range: under the held gate.
	_, err = s.ProduceBatch(ctx, []BatchItem[order]{
		{Msg: order{OrderID: "a-2"}, Key: "a"},
		{Msg: order{OrderID: "c-1"}, Key: "c"},
		{Msg: order{OrderID: "o-2"}, Key: "o"},
		{Msg: order{OrderID: "c-2"}, Key: "c"},
	}, &BatchOptions{Message: excl})
	require.NoError(t, err)
	within(t, d.when("c-1"), "c-1, a key new to the claimer, at once")
	within(t, d.when("c-2"), "c-2, behind c-1")
	require.Zero(t, d.count("a-2"), "a-2 waits behind a-1")
	require.Zero(t, d.count("o-2"), "o-2 waits: its key is held for an ordered message")
	require.Positive(t, c.Stats().Deferred, "o-2 parked as busy")
	require.Equal(t, 1, counter.BatchesOf("store.AcquireKeys"), "the second range's keys taken with no statement")

	close(release)
	within(t, d.done, "every message")
	require.Zero(t, d.duplicates())
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, overlaps, "no two messages of a key ran at once")
	require.Less(t, slices.Index(seen, "a-1"), slices.Index(seen, "a-2"), "a key's messages in log order: %v", seen)
	require.Less(t, slices.Index(seen, "c-1"), slices.Index(seen, "c-2"), "a key's messages in log order: %v", seen)
}
