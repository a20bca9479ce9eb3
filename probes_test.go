package sqlstreams

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// probe returns the status code of GET url.
func probe(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	_ = res.Body.Close()
	return res.StatusCode
}

// /readyz follows the database (false once it has been unreachable for
// longer than InstanceTTL, true when it is back); /livez never does.
func TestReadyzFollowsTheDatabaseAndLivezDoesNot(t *testing.T) {
	skipOutageWhenShort(t)
	_, _, c := setup(t, &ClientConfig{Retry: Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}}, "g", 0)
	ready := NewReadiness()
	mux := http.NewServeMux()
	mux.Handle("/readyz", ready.Handler())
	mux.Handle("/livez", ready.LiveHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	require.Equal(t, http.StatusServiceUnavailable, probe(t, srv.URL+"/readyz"), "no session yet")
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/livez"), "live before any session")

	sess := consume(t, c, func(context.Context, *order) error { return nil }, &ConsumeOptions{
		ClaimPollRate: 20 * time.Millisecond, InstanceTTL: time.Second, Readiness: ready, DisableManager: true})
	waitLevel(t, ready, true, "ready while consuming")
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/readyz"))
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/livez"))

	start := pgtest.StopFor(t, "fast")
	waitLevel(t, ready, false, "not ready once the database has been unreachable for longer than InstanceTTL")
	require.Equal(t, http.StatusServiceUnavailable, probe(t, srv.URL+"/readyz"))
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/livez"), "a database outage does not make the process look wedged")
	start()
	waitLevel(t, ready, true, "ready again once the database is back")
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/readyz"))
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/livez"))
	require.NoError(t, sess.stop(t))
	require.Equal(t, http.StatusOK, probe(t, srv.URL+"/livez"))
}

// Several sessions on one Readiness are ready when all are: one waiting on
// a binding change keeps it not ready.
func TestSeveralSessionsAreReadyWhenAllAre(t *testing.T) {
	e, s, a := setup(t, nil, "a", 0)
	ctx := context.Background()
	b, err := s.Consumer("b").Register(ctx, &ConsumerConfig{Bindings: []string{"orders.eu"}})
	require.NoError(t, err)
	e.incumbent(t, b, clocks.Real(), []string{"orders.eu"})
	waiting, err := s.Consumer("b").Register(ctx, &ConsumerConfig{Bindings: []string{"orders.us"}})
	require.NoError(t, err)

	ready := NewReadiness()
	sa := consume(t, a, func(context.Context, *order) error { return nil }, &ConsumeOptions{Readiness: ready, DisableManager: true})
	waitLevel(t, ready, true, "one session, consuming")
	sb := consume(t, waiting, func(context.Context, *order) error { return nil }, &ConsumeOptions{Readiness: ready, DisableManager: true,
		BindingRetryInterval: time.Hour})
	waitLevel(t, ready, false, "a second session waits on its binding change")
	require.True(t, ready.Live(), "waiting is not wedged")
	require.NoError(t, sb.stop(t))
	waitLevel(t, ready, true, "the waiting session is gone")
	require.NoError(t, sa.stop(t))
}

// A claim loop busy in one step for longer than WedgedAfter is wedged; one
// that waits for its next event is not, however long.
func TestAWedgedLoopFailsLiveness(t *testing.T) {
	mock := clocks.NewMock()
	h := outage.NewHealth(mock, time.Second)
	r := NewReadiness()
	defer r.attach(h)()
	h.Working("range claimer")
	mock.Add(WedgedAfter)
	require.True(t, r.Live(), "at the bound, not past it")
	mock.Add(time.Millisecond)
	require.False(t, r.Live())
	rec := httptest.NewRecorder()
	r.LiveHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/livez", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Contains(t, rec.Body.String(), "wedged: range claimer busy since")
	h.Waiting("range claimer")
	mock.Add(time.Hour)
	require.True(t, r.Live(), "waiting is not wedged")
}
