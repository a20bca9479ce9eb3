package shutdown

import (
	"context"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/stretchr/testify/require"
)

// What a session does last runs until the plan's deadline after a graceful
// stop, and not at all after an abrupt one.
func TestEndContextEndsAtThePlansDeadline(t *testing.T) {
	clk := clocks.NewMock()
	p := New(clk)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the session's own context has ended: the end context ignores that

	ended, stop := p.EndContext(ctx, clk)
	defer stop()
	require.Error(t, ended.Err(), "the plan has not begun (an abrupt stop): done at once")

	p.Begin(10 * time.Second)
	ectx, stop2 := p.EndContext(ctx, clk)
	defer stop2()
	require.NoError(t, ectx.Err(), "a graceful stop: time left")
	deadline, ok := ectx.Deadline()
	require.True(t, ok)
	require.Equal(t, p.Deadline(), deadline)
	require.Equal(t, clk.Now().Add(10*time.Second+Grace), deadline, "ShutdownTimeout plus Grace")
	clk.Add(10*time.Second + Grace)
	<-ectx.Done()
}
