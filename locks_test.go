package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// isDeadlock reports PostgreSQL's deadlock_detected (40P01).
func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}

// contend runs each worker's step n times, all workers at once, and returns
// the first deadlock any of them hit (other errors fail the test).
func contend(t *testing.T, n int, workers ...func(i int) error) {
	t.Helper()
	errs := make(chan error, len(workers))
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				if err := w(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if isDeadlock(err) {
			t.Fatalf("deadlock: %v", err)
		}
		require.NoError(t, err)
	}
}

// The statements that hit `deadlock detected` when a stalled instance
// resumed take their row locks in one order (internal/store/locks.go). Two
// instances acquire and release overlapping keys asked for in opposite
// orders, as their claimers ask from their ranges in whatever order the
// messages come; an instance settles an ordered chain (each settlement
// locks its row, then the next one's) while its heartbeat renews every row
// it holds. Before the order, these interleavings deadlocked.
func TestLockOrderHasNoDeadlocks(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	ctx := context.Background()
	g := c.db()
	const keys = 24

	t.Run("acquire_and_release_keys", func(t *testing.T) {
		asc := make([]store.KeyClaim, keys)
		desc := make([]store.KeyClaim, keys)
		for i := range keys {
			asc[i] = store.KeyClaim{Key: fmt.Sprintf("k%02d", i)}
			desc[keys-1-i] = asc[i]
		}
		// Neither owner has a live instance row, so each takes the other's
		// leases over: every acquisition contends with the other's.
		step := func(want []store.KeyClaim) func(int) error {
			owner := engine.NewID()
			return func(int) error {
				token := engine.NewID()
				held, _, err := g.AcquireKeys(ctx, store.AcquireKeys{Want: want, Token: token, Owner: owner, TTL: time.Minute})
				if err != nil {
					return err
				}
				if len(held) == 0 {
					return nil
				}
				return g.ReturnRuns(ctx, []store.ExceptionRun{{Token: token}}, nil)
			}
		}
		contend(t, 300, step(asc), step(desc), step(asc), step(desc))
	})

	t.Run("key_gate_beside_keys", func(t *testing.T) {
		want := make([]store.KeyClaim, keys)
		for i := range keys {
			want[i] = store.KeyClaim{Key: fmt.Sprintf("k%02d", keys-1-i)}
		}
		// The gate is asked for, and given up with its keys written as
		// rows, while other owners lease and release the same keys.
		gate := func() func(int) error {
			owner := engine.NewID()
			return func(int) error {
				token := engine.NewID()
				held, _, err := g.AcquireKeys(ctx, store.AcquireKeys{Want: want, Token: engine.NewID(), Owner: owner, TTL: time.Minute, Gate: token})
				if err != nil || !held[store.KeyGateKey] {
					return err
				}
				kept := make([]store.KeyLease, len(want))
				for i, k := range want {
					kept[i] = store.KeyLease{Key: k.Key, Token: token}
				}
				if _, _, err := g.ReleaseKeyGate(ctx, store.KeyGateRelease{Token: token, Owner: owner, Keys: kept, TTL: time.Minute}); err != nil {
					return err
				}
				_, err = g.ReleaseKeys(ctx, kept)
				return err
			}
		}
		keyed := func() func(int) error {
			owner := engine.NewID()
			return func(int) error {
				token := engine.NewID()
				held, _, err := g.AcquireKeys(ctx, store.AcquireKeys{Want: want, Token: token, Owner: owner, TTL: time.Minute})
				if err != nil || len(held) == 0 {
					return err
				}
				return g.ReturnRuns(ctx, []store.ExceptionRun{{Token: token}}, nil)
			}
		}
		contend(t, 200, gate(), keyed(), gate(), keyed())
	})

	t.Run("settle_a_chain_while_renewing", func(t *testing.T) {
		const chain = 60
		items := make([]BatchItem[order], chain)
		for i := range items {
			items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("o-%d", i)}, Key: "hot"}
		}
		owner := engine.NewID()
		w, err := e.client.store.EnsureFleetWorker(ctx, "locks", []byte(`{}`), nil)
		require.NoError(t, err)
		for round := range 4 {
			_, err := s.ProduceBatch(ctx, items, &BatchOptions{Message: &MessageOptions{Concurrency: Ordered}})
			require.NoError(t, err)
			r, ok, err := g.ClaimRange(ctx, store.ClaimParams{Owner: owner, Limit: chain, Lease: time.Minute})
			require.NoError(t, err)
			require.True(t, ok)
			writes := make([]store.ExceptionWrite, len(r.Messages))
			for i, m := range r.Messages {
				writes[i] = store.ExceptionWrite{Position: m.Position, Key: m.Key, Concurrency: "ordered", Status: "pending"}
			}
			require.NoError(t, g.CommitRange(ctx, store.RangeCommit{RangeID: r.ID, Token: r.Token, Exceptions: writes}))
			runs, err := g.ClaimExceptions(ctx, store.ClaimExceptions{Owner: owner, Limit: 1, Chain: chain, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, runs, chain, "round %d: the key's rows as one chain", round)
			require.NoError(t, e.client.store.InsertInstance(ctx, store.InsertInstanceParams{ID: owner, WorkerConfigID: w.ID, DeclaredBy: "test", TTL: time.Minute}))
			settled := 0
			contend(t, chain, func(i int) error {
				st := store.Settlement{Position: runs[i].Position, Token: runs[i].Token, Delete: true}
				if i+1 < chain {
					st.Next = &runs[i+1]
				}
				_, err := g.SettleException(ctx, st)
				settled++
				return err
			}, func(int) error {
				_, err := e.client.store.RenewInstance(ctx, store.RenewInstanceParams{ID: owner, StreamID: c.group.StreamID, TTL: time.Minute, Leases: true})
				return err
			}, func(int) error {
				_, err := e.client.store.RenewInstance(ctx, store.RenewInstanceParams{ID: owner, StreamID: c.group.StreamID, TTL: time.Minute, Leases: true})
				return err
			})
			require.Equal(t, chain, settled)
			require.NoError(t, e.client.store.DeleteInstance(ctx, owner))
		}
		require.Zero(t, e.exceptions(c), "every row settled")
	})
}
