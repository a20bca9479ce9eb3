package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Exactly-once effects under faults: consumer processes run a transactional
// handler that inserts one row per message into a table with no unique
// constraint and produces one derived message to a second stream without an
// idempotency key, both in the handler's transaction, some attempts failing
// after writing. Meanwhile consumers are killed (SIGKILL) and replaced,
// frozen past their InstanceTTL (SIGSTOP; their leases are lost and taken
// over), their backends are terminated and PostgreSQL is restarted. At the
// end the effects table holds exactly one row per message and the second
// stream exactly one derived message per message.
//
// make test runs 2,000 messages; SQLSTREAMS_EXACTLY_ONCE=<n> runs n (make
// chaos runs 20,000). A seed picks the faults; SQLSTREAMS_EXACTLY_ONCE_SEED
// replays it.
func TestExactlyOnceUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("kills, freezes and restarts processes and PostgreSQL")
	}
	n := 2000
	if v := os.Getenv("SQLSTREAMS_EXACTLY_ONCE"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, "SQLSTREAMS_EXACTLY_ONCE")
	}
	seed := rand.Uint64()
	if v := os.Getenv("SQLSTREAMS_EXACTLY_ONCE_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "SQLSTREAMS_EXACTLY_ONCE_SEED")
	}
	t.Logf("%d messages, seed %d (SQLSTREAMS_EXACTLY_ONCE_SEED=%d replays the faults)", n, seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	ctx := context.Background()
	e, s, _ := setup(t, nil, "g", 0)
	e.stream("derived")
	_, err := s.Consumer("tx").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	fx := newEffects(t, e)

	const ttl = 2 * time.Second
	env := []string{"SQLSTREAMS_EXACTLY_ONCE_SEED=" + strconv.FormatUint(seed, 10), "SQLSTREAMS_EXACTLY_ONCE_TTL=" + ttl.String()}
	kids := []*child{spawnWith(t, e, "tx", env...), spawnWith(t, e, "tx", env...), spawnWith(t, e, "tx", env...)}
	for _, k := range kids {
		k.next(t, "INSTANCE ")
		go func() { // its lines are not read: nothing waits on them
			for range k.lines {
			}
		}()
	}

	// Produce at about 200 messages a second while the faults happen.
	faults := map[string]int{}
	produced := 0
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	nextFault := time.Now().Add(time.Second)
	for produced < n {
		<-tick.C // the producers' pace (a rate, not a wait for work)
		if _, err := s.Produce(ctx, order{OrderID: fmt.Sprintf("m-%d", produced), Amount: produced}, nil); err == nil {
			produced++
		}
		if time.Now().Before(nextFault) {
			continue
		}
		nextFault = time.Now().Add(time.Duration(700+rng.IntN(1300)) * time.Millisecond)
		switch f := rng.IntN(5); f {
		case 0: // a consumer dies without a word; another starts
			i := rng.IntN(len(kids))
			require.NoError(t, kids[i].cmd.Process.Kill())
			kids[i] = spawnWith(t, e, "tx", env...)
			go func(k *child) {
				for range k.lines {
				}
			}(kids[i])
			faults["consumer killed"]++
		case 1: // a consumer freezes past its TTL: its leases are taken over
			k := kids[rng.IntN(len(kids))]
			require.NoError(t, k.cmd.Process.Signal(syscall.SIGSTOP))
			thaw := time.NewTimer(ttl*2 + ttl/2) // the freeze's length (a deliberate pause of the subject)
			<-thaw.C
			require.NoError(t, k.cmd.Process.Signal(syscall.SIGCONT))
			faults["consumer frozen past its TTL"]++
		case 2: // every consumer connection is cut
			_, err := e.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'exactly-once'")
			require.NoError(t, err)
			faults["backends terminated"]++
		case 3:
			if err := pgtest.Restart(ctx); errors.Is(err, pgtest.ErrExternal) {
				continue
			} else {
				require.NoError(t, err)
			}
			faults["postgres restarted"]++
		default: // a calm second
		}
	}
	t.Logf("produced %d; faults: %v", produced, faults)

	// Every message's effects committed; the fleet may still be taking a
	// frozen or killed consumer's leases over.
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("m-%d", i)
	}
	stuck := time.NewTimer(2 * time.Minute)
	defer stuck.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	for last := -1; ; {
		got := len(fx.counts())
		if got >= n {
			break
		}
		if got != last {
			last = got
			stuck.Reset(2 * time.Minute)
		}
		select {
		case <-poll.C:
		case <-stuck.C:
			t.Fatalf("effects stopped at %d of %d messages for 2 minutes", got, n)
		}
	}
	for _, k := range kids {
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
	}
	fx.requireOnce(want)
	derived := map[string]int{}
	rows, err := e.pool.Query(ctx, fmt.Sprintf("SELECT payload->>'order_id' FROM %s", e.client.store.StreamTable(streamID(t, e, "derived"), "log")))
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, id := range ids {
		derived[id]++
	}
	var dup, missing []string
	for _, id := range want {
		switch derived["from-"+id] {
		case 0:
			missing = append(missing, id)
		case 1:
		default:
			dup = append(dup, id)
		}
	}
	require.Empty(t, missing, "derived messages missing")
	require.Empty(t, dup, "derived messages produced more than once")
	require.Len(t, ids, n, "one derived message a message, and no other")
}

// streamID returns a registered stream's id.
func streamID(t *testing.T, e *env, name string) int64 {
	t.Helper()
	row, err := e.client.store.LookupStream(context.Background(), nil, name)
	require.NoError(t, err)
	return row.ID
}

// childTx is TestChildConsumer's "tx" mode: a transactional session of the
// group "tx" whose handler writes an effect row and a derived message, a
// few attempts failing after their writes.
func childTx(ctx context.Context, schema string, h *hooks.Hooks) error {
	seed, err := strconv.ParseUint(os.Getenv("SQLSTREAMS_EXACTLY_ONCE_SEED"), 10, 64)
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(os.Getenv("SQLSTREAMS_EXACTLY_ONCE_TTL"))
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "exactly-once"
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := NewClient(ctx, pool, &ClientConfig{Schema: schema, Logger: slog.New(lineLogger{})})
	if err != nil {
		return err
	}
	s := Stream[order](client, "orders")
	derived := Stream[order](client, "derived")
	c, err := s.Consumer("tx").Register(ctx, &ConsumerConfig{ExceptionInitialBackoff: 10 * time.Millisecond})
	if err != nil {
		return err
	}
	table := schema + ".effects"
	return c.ConsumeTx(ctx, func(ctx context.Context, tx pgx.Tx, o *order) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (order_id) VALUES ($1)", o.OrderID); err != nil {
			return err
		}
		if _, err := derived.Produce(ctx, order{OrderID: "from-" + o.OrderID}, &ProduceOptions{Tx: tx}); err != nil {
			return err
		}
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s", seed, o.OrderID)
		v := h.Sum64()
		work := time.NewTimer(time.Duration(v%5) * time.Millisecond) // the handler's work
		defer work.Stop()
		select {
		case <-work.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if meta, _ := MetaFromContext(ctx); v%20 == 0 && meta.Attempt == 1 {
			return errors.New("fails once, after writing") // its writes are rolled back
		}
		return nil
	}, &ConsumeOptions{InstanceTTL: ttl, BatchLimit: 50, ClaimPollRate: 20 * time.Millisecond, ConfigRefreshInterval: time.Second,
		test: h})
}
