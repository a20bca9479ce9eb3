package sqlstreams

import (
	"context"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// A client runs one manager, however many Consume sessions it has: the
// workers are the fleet's, and a process of 500 sessions ran 500 managers
// asking for the same slots every TTL/3. Each session's manager (consume
// wraps it in oneManagerAProcess on the client's turn) waits for the turn;
// when the session whose manager runs stops, another takes it.
func TestAClientRunsOneManagerForAllItsSessions(t *testing.T) {
	client, err := NewClient(context.Background(), pgtest.Pool(t), &ClientConfig{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	turn := client.managerTurn
	newSession := func() (chan struct{}, oneManagerAProcess) {
		started := make(chan struct{})
		return started, oneManagerAProcess{turn: turn, svc: serveUntilDone{started: started}}
	}
	aStarted, am := newSession()
	actx, stopA := context.WithCancel(context.Background())
	aDone := make(chan error, 1)
	go func() { aDone <- am.Serve(actx) }()
	within(t, aStarted, "a's manager to start")
	require.Len(t, turn, 1, "a's manager holds the turn")

	// While a's runs, another session's manager does not start: one whose
	// session is already stopping returns without having run.
	cStarted, cm := newSession()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, cm.Serve(stopped), context.Canceled)
	select {
	case <-cStarted:
		t.Fatal("a second manager ran while the first held the turn")
	default:
	}

	// One that waits takes the turn when a's session stops.
	bStarted, bm := newSession()
	bctx, stopB := context.WithCancel(context.Background())
	bDone := make(chan error, 1)
	go func() { bDone <- bm.Serve(bctx) }()
	stopA()
	require.ErrorIs(t, within(t, aDone, "a's manager to stop"), context.Canceled)
	within(t, bStarted, "b's manager to take the turn")
	stopB()
	require.ErrorIs(t, within(t, bDone, "b's manager to stop"), context.Canceled)
	require.Empty(t, turn, "the turn is free once every session stopped")
}

// serveUntilDone is a manager stand-in: it reports its start and serves
// until its context ends.
type serveUntilDone struct{ started chan struct{} }

func (s serveUntilDone) Serve(ctx context.Context) error {
	close(s.started)
	<-ctx.Done()
	return ctx.Err()
}

// Manager.Declare refuses a worker it does not know (the knobs themselves
// reaching a running manager: TestWorkerKnobsFollowRedeclaration, in
// actors/manager).
func TestManagerDeclareRefusesAnUnknownWorker(t *testing.T) {
	e := newEnv(t, nil)
	require.ErrorIs(t, e.client.Manager().Declare(context.Background(), "nope", WorkerConfig{}), ErrInvalidConfig)
}
