package sqlstreams_test

import (
	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams"
)

// A test that drove the client on a *clock.Mock keeps it, wrapped: the
// library recognises the mock and sends its time to the database, so that
// moving the mock moves leases, retries and schedules too.
func ExampleClockOf() {
	mock := clock.NewMock()
	cfg := &sqlstreams.ClientConfig{Schema: "orders_test", Clock: sqlstreams.ClockOf(mock)}
	_ = cfg // sqlstreams.NewClient(ctx, pool, cfg), then mock.Add(time.Minute) as before
}
