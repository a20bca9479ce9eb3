package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	alertactor "github.com/c1702965/sqlstreams/actors/alerts"
	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/actors/heartbeat"
	"github.com/c1702965/sqlstreams/actors/registrar"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/alert"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/stretchr/testify/require"
)

const waitingLog = "WAITING: consumer group binding set differs from the installed one while live instances hold it; this instance"

// incumbent stands for a live instance of another process: its binding
// attempt (which inserts its instance row) and its heartbeat, stepped by
// the test.
type incumbent struct {
	reg *registrar.Actor
	hb  *heartbeat.Actor
	id  string
}

func (e *env) incumbent(t *testing.T, c *Consumer[order], clk clocks.Clock, patterns []string) (*incumbent, store.BindingResult) {
	t.Helper()
	return e.incumbentTTL(t, c, clk, patterns, 30*time.Second)
}

func (e *env) incumbentTTL(t *testing.T, c *Consumer[order], clk clocks.Clock, patterns []string, ttl time.Duration) (*incumbent, store.BindingResult) {
	t.Helper()
	set, rx := compileBindings(patterns)
	id := engine.NewID()
	wid := c.group.Workers[store.WorkerMessageConsumer]
	in := &incumbent{id: id}
	in.reg = registrar.New(registrar.Config{Store: e.client.store, StreamID: c.group.StreamID, GroupID: c.group.ID,
		GroupName: c.group.Name, Patterns: set, Regexes: rx, DeclaredBy: "incumbent:" + id[:8],
		Instances: []store.InstanceInsert{{ID: id, WorkerConfigID: wid, TTL: ttl}},
		Interval:  10 * time.Second, Clock: clk, Logger: e.client.cfg.Logger, DBNow: engine.DBNow(clk)})
	res, err := in.reg.Step(context.Background())
	require.NoError(t, err)
	in.hb = heartbeat.New(heartbeat.Config{Store: e.client.store, StreamID: c.group.StreamID, WorkerConfigID: wid,
		InstanceID: id, DeclaredBy: "incumbent", TTL: ttl, Clock: clk, Logger: e.client.cfg.Logger,
		DBNow: engine.DBNow(clk), Graceful: func() bool { return true }, Registered: true})
	return in, res
}

func (e *env) ledger(c *Consumer[order]) (installed []string, waitingRows int) {
	e.t.Helper()
	return e.ledgerOf(c.group.StreamID, c.group.ID)
}

func (e *env) ledgerOf(streamID, groupID int64) (installed []string, waitingRows int) {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), fmt.Sprintf(
		"SELECT status, patterns FROM %s.stream_%d_binding_declaration WHERE group_id = $1 ORDER BY id", e.client.Schema(), streamID), groupID)
	require.NoError(e.t, err)
	defer rows.Close()
	for rows.Next() {
		var status string
		var p []string
		require.NoError(e.t, rows.Scan(&status, &p))
		if status == "installed" {
			installed = p
		} else {
			waitingRows++
		}
	}
	require.NoError(e.t, rows.Err())
	return installed, waitingRows
}

func (e *env) liveInstances(c *Consumer[order], now store.Now) int {
	e.t.Helper()
	n := 0
	for _, w := range []string{store.WorkerMessageConsumer, store.WorkerExceptionConsumer} {
		k, err := storetest.LiveInstances(context.Background(), e.client.store, c.group.Workers[w], now)
		require.NoError(e.t, err)
		n += k
	}
	return n
}

func TestFirstInstallAndSameSetJoin(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"orders.eu.#", "orders.us.*"}})
	require.NoError(t, err)
	installed, waits := e.ledger(c)
	require.Equal(t, []string{"orders.eu.#", "orders.us.*"}, installed)
	require.Zero(t, waits)
	// The same set in another order, with a duplicate: a join appends nothing.
	_, err = s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"orders.us.*", "orders.eu.#", "orders.us.*"}})
	require.NoError(t, err)
	rows := 0
	require.NoError(t, e.pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.stream_%d_binding_declaration", e.client.Schema(), c.group.StreamID)).Scan(&rows))
	require.Equal(t, 1, rows)
	set, err := storetest.BindingSet(ctx, e.client.store, c.group.StreamID, c.group.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"orders.eu.#", "orders.us.*"}, set)

	for _, bad := range conformance(t, "invalid-patterns.txt") {
		_, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"ok", bad}})
		require.ErrorIs(t, err, ErrInvalidPattern, "pattern %q", bad)
		require.Contains(t, err.Error(), fmt.Sprintf("%q", bad))
	}
}

// The whole seed scenario on one mock clock: an incumbent holds S1; a new
// deployment with S2 waits (hours), never claims, never holds an instance
// row, is not ready; when the incumbent's heartbeat lapses it swaps S2 in and
// consumes only what S2 routes; a rollback to S1 waits for it in turn.
func TestChangedSetWaitsForLiveIncumbentsThenSwapsAndRollsBack(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	s := e.stream("orders")
	s1, s2 := []string{"orders.eu.#"}, []string{"orders.us.#"}
	c1, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s1})
	require.NoError(t, err)
	a, res := e.incumbent(t, c1, mock, s1)
	require.Equal(t, store.BindingJoined, res.Outcome)

	_, err = s.ProduceBatch(ctx, []BatchItem[order]{
		{Msg: order{OrderID: "eu-1"}, RoutingKey: "orders.eu.card"},
		{Msg: order{OrderID: "us-1"}, RoutingKey: "orders.us.card"},
		{Msg: order{OrderID: "none"}},
	}, nil)
	require.NoError(t, err)

	c2, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s2})
	require.NoError(t, err, "Register attempts once and returns, even when it must wait")
	ready := NewReadiness()
	got := make(chan string, 10)
	first := e.logs.Next(waitingLog)
	b := consume(t, c2, func(_ context.Context, o *order) error { got <- o.OrderID; return nil },
		&ConsumeOptions{BindingRetryInterval: 10 * time.Second, ClaimPollRate: time.Second, Readiness: ready})
	within(t, first, "the first waiting attempt")
	for range 6 * 60 * 2 { // two hours of mock time, attempt by attempt
		next := e.logs.Next(waitingLog)
		mock.Add(10 * time.Second)
		require.NoError(t, a.hb.Step(ctx))
		within(t, next, "a waiting attempt")
	}
	require.False(t, ready.Ready())
	rec := httptest.NewRecorder()
	ready.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ready", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, 1, e.liveInstances(c2, engine.DBNow(mock)()), "the waiter holds no instance row")
	require.Empty(t, got, "a waiting instance never claims")
	installed, waits := e.ledger(c2)
	require.Equal(t, s1, installed)
	require.Greater(t, waits, 720, "every attempt appends a waiting row")
	listing, err := c2.Bindings(ctx, time.Minute)
	require.NoError(t, err)
	require.Equal(t, s1, listing.Installed.Patterns)
	require.Len(t, listing.Waiting, 1)
	require.Equal(t, "waiting", listing.Waiting[0].Status)
	require.Equal(t, s2, listing.Waiting[0].Patterns)
	waitBegan := listing.Waiting[0].DeclaredAt

	// The incumbent dies: its heartbeat lapses and the waiter swaps.
	for !ready.Ready() {
		next := e.logs.Next(waitingLog)
		mock.Add(10 * time.Second)
		select {
		case <-ready.Done():
		case <-next:
		}
	}
	require.Equal(t, "us-1", within(t, got, "the message S2 routes"))
	installed, _ = e.ledger(c2)
	require.Equal(t, s2, installed)
	listing, err = c2.Bindings(ctx, time.Minute)
	require.NoError(t, err)
	require.Empty(t, listing.Waiting)
	require.Equal(t, waitBegan, listing.Installed.DeclaredAt, "the installed row that ended the wait carries its whole span")
	require.Greater(t, listing.Installed.AttemptAt.Sub(listing.Installed.DeclaredAt), 2*time.Hour)

	// Rollback: the old set waits for the new fleet, and swaps back once it is gone.
	old, res := e.incumbent(t, c1, mock, s1)
	require.Equal(t, store.BindingWaiting, res.Outcome)
	require.NoError(t, b.stop(t)) // a graceful stop gives the instance rows back
	res, err = old.reg.Step(ctx)
	require.NoError(t, err)
	require.Equal(t, store.BindingInstalled, res.Outcome)
	installed, _ = e.ledger(c1)
	require.Equal(t, s1, installed)
	select {
	case id := <-got:
		t.Fatalf("unexpected delivery %s", id)
	default:
	}
}

// The public listing shows a waiting declarer as waiting while it retries,
// and as stale once it stopped (the registrar's side of two divergent apps:
// TestDivergentAppsFirstWinsUntouched, in actors/registrar).
func TestABindingWaiterThatStoppedRetryingIsListedStale(t *testing.T) {
	mock := clocks.NewMock()
	e := newEnv(t, &ClientConfig{Clock: mock})
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(context.Background(), &ConsumerConfig{Bindings: []string{"a.#"}})
	require.NoError(t, err)
	_, res := e.incumbent(t, c, mock, []string{"a.#"})
	require.Equal(t, store.BindingJoined, res.Outcome)
	second, res := e.incumbent(t, c, mock, []string{"b.#"})
	require.Equal(t, store.BindingWaiting, res.Outcome)
	mock.Add(10 * time.Second)
	res, err = second.reg.Step(context.Background())
	require.NoError(t, err)
	require.Equal(t, store.BindingWaiting, res.Outcome)

	listing, err := c.Bindings(context.Background(), time.Minute)
	require.NoError(t, err)
	require.Len(t, listing.Waiting, 1)
	require.Equal(t, "waiting", listing.Waiting[0].Status)
	mock.Add(10 * time.Minute) // the second app stops retrying
	listing, err = c.Bindings(context.Background(), time.Minute)
	require.NoError(t, err)
	require.Equal(t, "stale", listing.Waiting[0].Status, "a waiter that stopped retrying shows as stale")
}

// Concurrent installers of different sets on an empty group serialize on
// the group row: exactly one installs, the others wait on it.
func TestConcurrentInstallersEndWithExactlyOneSet(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	// A fresh group without any declaration: start from a second group.
	g2, err := s.Consumer("g2").Register(ctx, nil)
	require.NoError(t, err)
	_ = c
	_, err = e.pool.Exec(ctx, fmt.Sprintf("DELETE FROM %s.stream_%d_binding_declaration WHERE group_id = $1", e.client.Schema(), g2.group.StreamID), g2.group.ID)
	require.NoError(t, err)

	const n = 6
	results := make([]store.BindingResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			set, rx := compileBindings([]string{fmt.Sprintf("set%d.#", i)})
			results[i], errs[i] = g2.db().DeclareBindings(ctx, store.BindingRequest{
				Patterns: set, Regexes: rx, DeclaredBy: fmt.Sprint("installer-", i),
				Instances: []store.InstanceInsert{{ID: engine.NewID(), WorkerConfigID: g2.group.Workers[store.WorkerMessageConsumer], TTL: time.Minute}}})
		}()
	}
	wg.Wait()
	for _, err := range errs { // checked on the test's goroutine
		require.NoError(t, err)
	}
	installedCount := 0
	var winner []string
	for i, r := range results {
		if r.Outcome == store.BindingInstalled {
			installedCount++
			winner = []string{fmt.Sprintf("set%d.#", i)}
		} else {
			require.Equal(t, store.BindingWaiting, r.Outcome)
		}
	}
	require.Equal(t, 1, installedCount)
	set, err := storetest.BindingSet(ctx, e.client.store, g2.group.StreamID, g2.group.ID)
	require.NoError(t, err)
	require.Equal(t, winner, set)
}

func TestGroupWithBindingsNeverGetsMessagesWithoutRoutingKey(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"#"}})
	require.NoError(t, err)
	whole, err := s.Consumer("whole").Register(ctx, nil)
	require.NoError(t, err)
	_, err = s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "keyless"}}, {Msg: order{OrderID: "keyed"}, RoutingKey: "x"}}, nil)
	require.NoError(t, err)
	got := make(chan string, 4)
	all := newCollector(2)
	sess := consume(t, c, func(_ context.Context, o *order) error { got <- o.OrderID; return nil }, fast())
	consume(t, whole, func(_ context.Context, o *order) error { all.add(o.OrderID); return nil }, fast())
	require.Equal(t, "keyed", within(t, got, "the keyed message"))
	within(t, all.done, "a group without bindings gets both")
	require.NoError(t, sess.stop(t))
	require.Empty(t, e.leases(c), "the keyless message was settled without a delivery")
	select {
	case id := <-got:
		t.Fatalf("unexpected delivery %s", id)
	default:
	}
}

// Register installed S1, a competitor replaced it with S2 while this process
// had no instance row; Consume re-attempts and (no live incumbent) swaps S1
// back in before consuming.
func TestConsumeReattemptsAfterACompetitorReplacedTheSet(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	mine, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"mine.#"}})
	require.NoError(t, err)
	_, err = s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"theirs.#"}})
	require.NoError(t, err)
	installed, _ := e.ledger(mine)
	require.Equal(t, []string{"theirs.#"}, installed)
	_, err = s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "t"}, RoutingKey: "theirs.x"}, {Msg: order{OrderID: "m"}, RoutingKey: "mine.x"}}, nil)
	require.NoError(t, err)
	got := make(chan string, 4)
	consume(t, mine, func(_ context.Context, o *order) error { got <- o.OrderID; return nil }, fast())
	require.Equal(t, "m", within(t, got, "the message mine.# routes"))
	installed, _ = e.ledger(mine)
	require.Equal(t, []string{"mine.#"}, installed)
}

func TestSQLMatchingPassesConformance(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	cases := conformanceTSV(t)
	require.NotEmpty(t, cases)
	for _, c := range cases {
		p, err := topic.Compile(c[0])
		require.NoError(t, err)
		var got bool
		key := c[1]
		require.NoError(t, e.pool.QueryRow(ctx, "SELECT $1::text IS NOT NULL AND ('.' || $1::text) ~ $2", nullIfNone(key), p.Regex()).Scan(&got))
		require.Equal(t, c[2] == "match", got, "pattern %q key %q", c[0], key)
		require.Equal(t, topic.Match(c[0], noneToEmpty(key)), got, "SQL and Go agree on %q %q", c[0], key)
	}
	// Many '#' against a long key: an automaton, no backtracking blow-up.
	long := ""
	for i := range 400 {
		if i > 0 {
			long += "."
		}
		long += "w"
	}
	pattern := ""
	for range 40 {
		pattern += "#.w."
	}
	pattern += "x"
	p, err := topic.Compile(pattern)
	require.NoError(t, err)
	var got bool
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT ('.' || $1::text) ~ $2", long, p.Regex()).Scan(&got))
	require.False(t, got)
	require.False(t, topic.Match(pattern, long))
}

func TestSystemProducesAlerts(t *testing.T) {
	mock := clocks.NewMock()
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	require.NoError(t, e.client.System().Register(ctx))
	alerts := Stream[Alert](e.client, AlertStream)
	watch, err := alerts.Consumer(AlertGroupBindings).Register(ctx, &ConsumerConfig{Bindings: AlertBindings(AlertGroupBindings)})
	require.NoError(t, err)
	installed, _ := e.ledgerOf(watch.group.StreamID, watch.group.ID)
	require.Equal(t, AlertBindings(AlertGroupBindings), installed, "the user's consumer joined the seeded set")

	s := e.stream("orders")
	c, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"a.#"}})
	require.NoError(t, err)
	_, _ = e.incumbent(t, c, mock, []string{"a.#"})
	c2, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: []string{"b.#"}})
	require.NoError(t, err)

	// The watcher runs, and the client's notification listener listens,
	// before the alert is published: with the mock clock no poll ever
	// fires, so the alert's produce must wake the watcher (a watcher
	// started after the waiting attempt could claim before the alert's
	// commit and then wait forever: once in a loaded suite run).
	listening := hubHooks(e).Listening.C()
	got := make(chan Alert, 4)
	ws := consume(t, watch, func(_ context.Context, a *Alert) error { got <- *a; return nil }, &ConsumeOptions{DisableManager: true})
	within(t, listening, "the notification listener")
	first := e.logs.Next(waitingLog)
	// The mock clock moves minutes ahead below (the stall): the waiting
	// session must not retry, swap and start a manager meanwhile, whose
	// retention DDL on the alert stream would race the watcher's claims, and
	// whose backoff timers would then wait on the mock clock.
	consume(t, c2, func(context.Context, *order) error { return nil }, &ConsumeOptions{BindingRetryInterval: 24 * time.Hour, DisableManager: true})
	within(t, first, "the waiting attempt")
	a := within(t, got, "the binding alert")
	require.Equal(t, AlertBindingWaiting, a.Kind)
	require.Equal(t, "g", a.Group)
	require.Equal(t, []string{"b.#"}, a.Wanted)
	require.Equal(t, []string{"a.#"}, a.Installed)
	require.Equal(t, 1, a.LiveInstances)
	require.Equal(t, 1, a.LiveSessions, "one session holds the installed set")
	require.NoError(t, ws.stop(t))

	// A stalled producer raises the other alert.
	stallWatch, err := alerts.Consumer(AlertGroupDelivery).Register(ctx, &ConsumerConfig{Bindings: AlertBindings(AlertGroupDelivery)})
	require.NoError(t, err)
	other, err := e.stream("other").Consumer("o").Register(ctx, nil)
	require.NoError(t, err)
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = Stream[order](e.client, "other").Produce(ctx, order{OrderID: "late"}, &ProduceOptions{Tx: tx})
	require.NoError(t, err)
	e.produceN(Stream[order](e.client, "other"), "after", 1)
	st := newStepperFor(t, e, other, mock, func(context.Context, *claimer.Delivery) error { return nil })
	var dropped atomic.Int64
	queue := alert.NewQueue(&dropped)
	cl := claimer.New(claimer.Config{Common: st.common, BatchLimit: 10, QueueSize: 10, StallAfter: 30 * time.Second, Alerts: queue})
	publisher := alertactor.New(queue, e.client.publishAlerts("other", "o", nil), slog.New(e.logs))
	stallBegan := mock.Now() // the first claim below finds the stall
	for i := 0; ; i++ {
		require.Less(t, i, 5)
		_, err := cl.Claim(ctx)
		require.NoError(t, err)
		mock.Add(31 * time.Second)
		select {
		case ev := <-queue.C():
			publisher.Step(ctx, ev) // what the session's alerts actor does
		default:
			continue
		}
		break
	}
	require.Zero(t, dropped.Load())
	require.NoError(t, tx.Rollback(ctx)) // the gate holds every stream while it is open
	stallGot := make(chan Alert, 2)
	consume(t, stallWatch, func(_ context.Context, a *Alert) error { stallGot <- *a; return nil }, &ConsumeOptions{DisableManager: true})
	sa := within(t, stallGot, "the stall alert")
	require.Equal(t, AlertDeliveryStalled, sa.Kind)
	require.Contains(t, sa.Detail, "behind an open transaction")
	require.True(t, sa.Since.Equal(stallBegan), "the alert's since is when the stall began (%s), not %s", stallBegan, sa.Since)
	require.False(t, sa.Since.IsZero())
	raw, _ := json.Marshal(sa)
	require.NotContains(t, string(raw), "late", "no payloads in alerts")
}

// conformanceTSV reads the shared bindings.tsv: pattern, key, expected.
func conformanceTSV(t *testing.T) [][3]string {
	t.Helper()
	var out [][3]string
	for _, line := range strings.Split(readConformance(t, "bindings.tsv"), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			continue // comments and blank lines
		}
		out = append(out, [3]string{f[0], f[1], f[2]})
	}
	return out
}

func nullIfNone(key string) *string {
	if key == "(none)" {
		return nil
	}
	return &key
}

func noneToEmpty(key string) string {
	if key == "(none)" {
		return ""
	}
	return key
}

// Register's one attempt and Consume's attempts are one declarer's retries:
// declared_at is Register's when it waited (seed 000), so the row that ends
// the wait records the whole wait, not the part since Consume began.
func TestDeclaredAtCarriesFromRegisterIntoConsume(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	s := e.stream("orders")
	s1, s2 := []string{"orders.eu.#"}, []string{"orders.us.#"}
	c1, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s1})
	require.NoError(t, err)
	a, res := e.incumbentTTL(t, c1, mock, s1, 3*time.Hour)
	require.Equal(t, store.BindingJoined, res.Outcome)

	registeredAt := mock.Now()
	c2, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s2})
	require.NoError(t, err)
	mock.Add(time.Hour) // Consume starts an hour after Register waited
	first := e.logs.Next(waitingLog)
	b := consume(t, c2, func(context.Context, *order) error { return nil },
		&ConsumeOptions{BindingRetryInterval: 10 * time.Second, ClaimPollRate: time.Second})
	within(t, first, "Consume's first waiting attempt")
	listing, err := c2.Bindings(ctx, time.Minute)
	require.NoError(t, err)
	require.Len(t, listing.Waiting, 1)
	require.True(t, registeredAt.Equal(listing.Waiting[0].DeclaredAt), "declared_at %s, want Register's %s", listing.Waiting[0].DeclaredAt, registeredAt)

	// (TestChangedSetWaitsForLiveIncumbentsThenSwapsAndRollsBack shows the
	// installed row that ends a wait keeps the waiting rows' declared_at.)
	require.NoError(t, a.hb.Step(ctx))
	require.NoError(t, b.stop(t))
}

// System().Register seeds an alert group's config only while none is
// stored: a config an operator declared for it is kept, whole, run after
// run, and nothing is logged as a redeclaration (it used to be reset to the
// empty document every time, an SQL0059 flip-flop).
func TestSystemRegisterKeepsAnAlertGroupsConfig(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	require.NoError(t, e.client.System().Register(ctx))
	alerts := Stream[Alert](e.client, AlertStream)
	mine := &ConsumerConfig{Bindings: AlertBindings(AlertGroupDelivery), Message: &MessageOptions{Retry: &RetryPolicy{MaxRetries: 7}}}
	c, err := alerts.Consumer(AlertGroupDelivery).Register(ctx, mine)
	require.NoError(t, err)
	before, err := c.Inspect(ctx)
	require.NoError(t, err)
	warned := len(e.logs.Messages(slog.LevelWarn))
	for range 2 { // a process restarting twice
		require.NoError(t, e.client.System().Register(ctx))
	}
	after, err := c.Inspect(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Config, after.Config, "the operator's config stays")
	require.Len(t, after.Log, len(before.Log), "nothing was redeclared")
	require.Equal(t, 7, after.Config.Message.Retry.MaxRetries)
	for _, m := range e.logs.Messages(slog.LevelWarn)[warned:] {
		require.NotContains(t, m, "redeclared")
	}
}

// A session that waited for its binding set reads the group config again
// before its first claim (seed 001: the staleness window is the refresh
// interval): a Timeout redeclared during a two-hour wait applies to the
// first message, though the next periodic refresh is an hour away.
func TestTheConfigIsReadAgainWhenABindingWaitEnds(t *testing.T) {
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, &ClientConfig{Clock: mock})
	ctx := context.Background()
	s := e.stream("orders")
	s1, s2 := []string{"orders.eu.#"}, []string{"orders.us.#"}
	c1, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s1})
	require.NoError(t, err)
	a, _ := e.incumbentTTL(t, c1, mock, s1, 3*time.Hour)
	_, err = s.Produce(ctx, order{OrderID: "us-1"}, &ProduceOptions{RoutingKey: "orders.us.card"})
	require.NoError(t, err)

	c2, err := s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s2, Message: &MessageOptions{Timeout: 5 * time.Second}})
	require.NoError(t, err)
	timeouts := make(chan time.Duration, 1)
	first := e.logs.Next(waitingLog)
	b := consume(t, c2, func(ctx context.Context, _ *order) error {
		meta, _ := MetaFromContext(ctx)
		timeouts <- meta.Timeout
		return nil
	}, &ConsumeOptions{BindingRetryInterval: 10 * time.Second, ConfigRefreshInterval: time.Hour})
	within(t, first, "the first waiting attempt")
	for range 6 * 60 * 2 { // two hours of waiting
		next := e.logs.Next(waitingLog)
		mock.Add(10 * time.Second)
		within(t, next, "a waiting attempt")
	}
	// Meanwhile the group's config is redeclared.
	_, err = s.Consumer("g").Register(ctx, &ConsumerConfig{Bindings: s2, Message: &MessageOptions{Timeout: 9 * time.Second}})
	require.NoError(t, err)
	require.NoError(t, e.client.store.DeleteInstance(ctx, a.id)) // the incumbent leaves
	mock.Add(10 * time.Second)                                   // the next attempt installs
	require.Equal(t, 9*time.Second, within(t, timeouts, "the first message"), "the first claim runs the config declared during the wait")
	require.NoError(t, b.stop(t))
}
