package actortest

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A group registered here is declared as Register declares it: its config
// reads back as declared, its binding set is installed, and a produce
// stores each message's payload, keys and options document.
func TestAGroupIsRegisteredAndProducedToAsThePublicAPIDoes(t *testing.T) {
	ctx := context.Background()
	e := New(t, nil)
	require.NotNil(t, e.Mock)
	require.Equal(t, Epoch, *e.Now(), "the mock clock reaches the database")
	s := e.Stream("orders", settings.Stream{RetentionTTL: "1h0m0s"})
	cfg := groupconfig.Declared{Message: policy.Options{MaxRetries: 3}, ExceptionInitialBackoff: time.Second}
	g := s.Group("g", cfg, "orders.#")

	docs, err := e.Store.ReadGroupConfig(ctx, g.ID())
	require.NoError(t, err)
	back, err := groupconfig.FromDocs(docs)
	require.NoError(t, err)
	require.Equal(t, cfg, back)
	require.Equal(t, 3, g.Policy().Message.MaxRetries)
	installed, _, err := g.DB.BindingLedger(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"orders.#"}, installed.Patterns)

	excl := policy.Options{Concurrency: policy.Exclusive}
	msgs := append(Keyed(2, 2, excl), Msg{Payload: Order{OrderID: "r"}, RoutingKey: "orders.eu"})
	ps := s.Produce(msgs...)
	require.Len(t, ps, 3)
	r, ok, err := g.DB.ClaimRange(ctx, store.ClaimParams{Owner: store.NewID(), Limit: 10, Lease: time.Minute, Now: e.Now()})
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, r.Messages, 3)
	require.Equal(t, []bool{false, false, true}, []bool{r.Messages[0].Matched, r.Messages[1].Matched, r.Messages[2].Matched},
		"the group's bindings route only the routed message")
	var o Order
	require.NoError(t, json.Unmarshal(r.Messages[2].Payload, &o))
	require.Equal(t, Order{OrderID: "r"}, o)
	require.Empty(t, r.Messages[2].Options)

	whole := s.Group("whole", groupconfig.Declared{})
	r, ok, err = whole.DB.ClaimRange(ctx, store.ClaimParams{Owner: store.NewID(), Limit: 10, Lease: time.Minute, Now: e.Now()})
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, r.Messages, 3)
	require.Equal(t, "k1", r.Messages[1].Key)
	got, err := policy.Parse(r.Messages[1].Options)
	require.NoError(t, err)
	require.Equal(t, excl, got)
	require.Len(t, whole.Leases(), 1)
	require.Empty(t, whole.States())
}

// The sink fails a test on a warning without a registered code; a coded
// one passes, and Next signals it.
func TestLogsKeepRecordsAndSignal(t *testing.T) {
	logs := &Logs{}
	logger := slog.New(logs)
	next := logs.Next("hello")
	logger.Info("hello there")
	<-next
	logger.Warn("uncoded")
	require.Equal(t, []string{"uncoded"}, logs.Messages(slog.LevelWarn))
	require.Len(t, logs.uncoded, 1, "NewLogs's cleanup would fail the test")
	_, ok := logs.Record("hello there")
	require.True(t, ok)
}
