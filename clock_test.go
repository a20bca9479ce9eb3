package sqlstreams

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// The migration CHANGELOG gives users of clock.NewMock(): ClockOf(mock)
// is a mock the library recognises, whose time every time-dependent
// statement uses; ClockOf(clock.New()) and the default send no time; and
// ClockOf(nil) leaves the default in place.
func TestClockOfAMockSendsItsTimeToTheDatabase(t *testing.T) {
	mock := clock.NewMock()
	mock.Add(time.Hour)
	c := &Client{cfg: (&ClientConfig{Clock: ClockOf(mock)}).withDefaults()}
	require.NotNil(t, c.dbNow())
	require.Equal(t, mock.Now(), *c.dbNow())
	mock.Add(time.Minute)
	require.Equal(t, mock.Now(), *c.dbNow(), "the database's time moves with the mock")

	for _, clk := range []Clock{ClockOf(clock.New()), RealClock(), ClockOf(nil), nil} {
		c := &Client{cfg: (&ClientConfig{Clock: clk}).withDefaults()}
		require.NotNil(t, c.cfg.Clock)
		require.Nil(t, c.dbNow(), "a real clock leaves the time to the database's now()")
	}
}
