package clocks

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// Of keeps nil (a config's default applies), makes a *Mock of a
// *clock.Mock (the engine sends its time to the database) and a clock of
// any other, which is not a Mock.
func TestOfKeepsNilAndRecognisesAMock(t *testing.T) {
	require.Nil(t, Of(nil))
	m := clock.NewMock()
	mock, ok := Of(m).(*Mock)
	require.True(t, ok)
	m.Add(time.Hour)
	require.Equal(t, m.Now(), mock.Now(), "the adapter reads the mock it wraps")
	_, ok = Of(clock.New()).(*Mock)
	require.False(t, ok)
	_, ok = Real().(*Mock)
	require.False(t, ok)
}

// A Mock's timers, tickers, AfterFuncs and contexts move only with it, and
// Stop and Reset act on them.
func TestAMocksTimersFireAsItMoves(t *testing.T) {
	m := NewMock()
	start := m.Now()
	timer, ticker := m.Timer(time.Second), m.Ticker(time.Second)
	defer ticker.Stop()
	stopped := m.Timer(time.Second)
	require.True(t, stopped.Stop())
	called := make(chan struct{})
	m.AfterFunc(2*time.Second, func() { close(called) })
	ctx, cancel := m.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	dctx, dcancel := m.WithDeadline(context.Background(), start.Add(3*time.Second))
	defer dcancel()

	m.Add(time.Second)
	require.Equal(t, start.Add(time.Second), <-timer.C())
	require.Equal(t, start.Add(time.Second), <-ticker.C())
	require.Empty(t, stopped.C())
	require.Equal(t, time.Second, m.Since(start))
	require.NoError(t, ctx.Err())

	require.False(t, timer.Reset(time.Second), "a fired timer is not active")
	m.Set(start.Add(2 * time.Second))
	require.Equal(t, start.Add(2*time.Second), <-timer.C())
	require.Equal(t, start.Add(2*time.Second), <-ticker.C())
	<-called
	<-ctx.Done()
	require.NoError(t, dctx.Err())
	m.Add(time.Second)
	<-dctx.Done()
}

// The real clock's timers fire on the wall clock, and its contexts end.
func TestTheRealClocksTimersFire(t *testing.T) {
	c := Real()
	start := c.Now()
	<-c.Timer(time.Millisecond).C()
	tick := c.Ticker(time.Millisecond)
	<-tick.C()
	tick.Stop()
	called := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(called) })
	<-called
	stopped := c.AfterFunc(time.Hour, func() { t.Error("a stopped AfterFunc ran") })
	require.True(t, stopped.Stop())
	ctx, cancel := c.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	dctx, dcancel := c.WithDeadline(context.Background(), c.Now().Add(time.Millisecond))
	defer dcancel()
	<-dctx.Done()
	require.Greater(t, c.Since(start), time.Duration(0))
}
