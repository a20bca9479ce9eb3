package claimer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/stretchr/testify/require"
)

// No union window: during a rolling change every claim is filtered by
// exactly one declared set, and every delivered message matches the set of
// the claim that handed it out.
func TestEveryClaimUsesExactlyOneDeclaredSet(t *testing.T) {
	mock := clocks.NewMock()
	e := actortest.New(t, &actortest.Options{Clock: mock})
	ctx := context.Background()
	s := e.Stream("orders", settings.Stream{})
	sets := map[int64][]string{}
	var mu sync.Mutex
	type seen struct {
		decl int64
		rk   string
	}
	var deliveries []seen
	h := func(_ context.Context, d *claimer.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		deliveries = append(deliveries, seen{d.Bindings, d.Msg.RoutingKey})
		return nil
	}
	keys := []string{"a.x", "b.x", "a.y.z", "c", "b.q"}
	produce := func(n int) {
		items := make([]actortest.Msg, n)
		for i := range items {
			items[i] = actortest.Msg{Payload: order{OrderID: fmt.Sprint(i)}, RoutingKey: keys[i%len(keys)]}
		}
		s.Produce(items...)
	}
	g := s.Group("g", groupconfig.Declared{}, "a.#")
	for step, set := range [][]string{{"a.#"}, {"b.*"}, {"a.#", "c"}, nil} {
		if step > 0 {
			g.DeclareBindings(set...) // no live instance: swaps
		}
		inst, _, err := g.DB.BindingLedger(ctx)
		require.NoError(t, err)
		if len(inst.Patterns) == 0 {
			sets[0] = nil // the whole stream: no binding rows
		} else {
			sets[inst.ID] = inst.Patterns
		}
		st := newStepperFor(t, e, g, h)
		produce(23)
		for st.claimRange() > 0 {
		}
	}
	require.NotEmpty(t, deliveries)
	usedSets := map[int64]bool{}
	for _, d := range deliveries {
		set, ok := sets[d.decl]
		require.True(t, ok, "claim used declaration %d, which was never installed", d.decl)
		usedSets[d.decl] = true
		if len(set) > 0 {
			require.True(t, topic.MatchAny(set, d.rk), "%q delivered under %v", d.rk, set)
		}
	}
	require.Len(t, usedSets, 4, "each declared set filtered its own claims")
}
