package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/console"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type order struct {
	ID string `json:"id"`
}

// fixture: stream orders, group billing with dead letters, consumed.
func fixture(t *testing.T, dead int) (*sqlstreams.Client, *sqlstreams.Consumer[order]) {
	t.Helper()
	ctx := context.Background()
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	s := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	c, err := s.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{Bindings: []string{"orders.#"}})
	require.NoError(t, err)
	n := dead + 2
	for i := range n {
		id := "ok"
		if i < dead {
			id = "poison"
		}
		_, err := s.Produce(ctx, order{ID: id}, &sqlstreams.ProduceOptions{RoutingKey: "orders.eu", Headers: sqlstreams.Headers{"tenant": "acme"}})
		require.NoError(t, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	var seen atomic.Int64
	require.NoError(t, c.Consume(cctx, func(_ context.Context, o *order) error {
		if seen.Add(1) == int64(n) {
			cancel()
		}
		if o.ID == "poison" {
			return sqlstreams.Terminal(errors.New("poison <script>alert(1)</script>"))
		}
		return nil
	}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true}))
	return client, c
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	res, err := c.Get(u)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(b)
}

func server(t *testing.T, client *sqlstreams.Client, opts *console.Options) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(console.New(client, opts))
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return srv, &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func TestDenyByDefault(t *testing.T) {
	client, _ := fixture(t, 1)
	srv, c := server(t, client, nil)
	code, body := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "not configured")
	require.Contains(t, body, "Authorize")
	srv2, c2 := server(t, client, &console.Options{Authorize: func(*http.Request) console.Access { return console.Access{} }})
	code, _ = get(t, c2, srv2.URL+"/streams/orders/groups/billing")
	require.Equal(t, http.StatusForbidden, code)
}

func TestPagesShowWhatStatusReports(t *testing.T) {
	client, consumer := fixture(t, 3)
	srv, c := server(t, client, &console.Options{DeadLetterPage: 2,
		Authorize: func(*http.Request) console.Access { return console.Access{Read: true} }})
	st, err := consumer.Status(context.Background())
	require.NoError(t, err)

	code, body := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<h2 id="stream-orders">orders</h2>`)
	require.Regexp(t, `data-group="billing"`, body)

	code, body = get(t, c, srv.URL+"/streams/orders/groups/billing")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="lag">`+itoa(st.Lag)+`<`)
	require.Contains(t, body, `id="dead">3<`)
	require.Contains(t, body, "<code>orders.#</code>")
	require.Contains(t, body, "message.timeout")
	require.NotContains(t, body, "<script>alert(1)</script>", "errors are escaped")
	require.Contains(t, body, "poison &lt;script&gt;")
	require.Contains(t, body, `id="next"`, "three dead letters, pages of two")
	require.NotContains(t, body, "redrive-all", "no actions without Access.Actions")
	m := regexp.MustCompile(`href="\?after=(\d+)"`).FindStringSubmatch(body)
	require.NotNil(t, m)
	code, body = get(t, c, srv.URL+"/streams/orders/groups/billing?after="+m[1])
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `id="next"`)

	code, body = get(t, c, srv.URL+"/streams/orders/groups/billing/dead/1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="payload-hidden"`, "payloads need Access.Payloads")
	require.NotContains(t, body, `"poison"`)
	require.NotContains(t, body, "acme", "nor do headers")
	require.Regexp(t, `<td class="n">1</td><td>dead</td>`, body, "the delivery history")

	code, _ = get(t, c, srv.URL+"/streams/orders/groups/biling")
	require.Equal(t, http.StatusNotFound, code)
	res, err := c.PostForm(srv.URL+"/streams/orders/groups/billing/redrive", url.Values{"all": {"1"}})
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode, "a read-only request cannot act")
}

func TestRedriveNeedsActionsAndACSRFToken(t *testing.T) {
	client, consumer := fixture(t, 2)
	srv, c := server(t, client, &console.Options{
		Authorize: func(*http.Request) console.Access { return console.Access{Read: true, Payloads: true, Actions: true} }})
	code, body := get(t, c, srv.URL+"/streams/orders/groups/billing/dead/1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<pre id="payload">{&#34;id&#34;:&#34;poison&#34;}</pre>`)
	require.Contains(t, body, `<tr><td>tenant</td><td>acme</td></tr>`, "its headers")
	token := regexp.MustCompile(`name="csrf" value="([0-9a-f]{32})"`).FindStringSubmatch(body)
	require.NotNil(t, token)

	post := func(form url.Values, origin string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/streams/orders/groups/billing/redrive", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		res, err := c.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res
	}
	require.Equal(t, http.StatusForbidden, post(url.Values{"id": {"1"}}, "").StatusCode, "no token")
	require.Equal(t, http.StatusForbidden, post(url.Values{"id": {"1"}, "csrf": {strings.Repeat("0", 32)}}, "").StatusCode, "a wrong token")
	require.Equal(t, http.StatusForbidden, post(url.Values{"id": {"1"}, "csrf": {token[1]}}, "https://evil.example").StatusCode, "cross-origin")
	st, err := consumer.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Dead, "nothing was redriven")

	res := post(url.Values{"id": {"1"}, "csrf": {token[1]}}, srv.URL)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Contains(t, res.Header.Get("Location"), "redrove+1+dead+letter")
	st, err = consumer.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Dead)
	res = post(url.Values{"all": {"1"}, "csrf": {token[1]}}, "")
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	st, err = consumer.Status(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Dead)
}

func TestAWaiterAppearsOnTheGroupPage(t *testing.T) {
	client, consumer := fixture(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := sqlstreams.NewReadiness()
	done := make(chan error, 1)
	go func() {
		done <- consumer.Consume(ctx, func(context.Context, *order) error { return nil }, &sqlstreams.ConsumeOptions{Readiness: ready, DisableManager: true})
	}()
	require.NoError(t, ready.Wait(ctx))
	_, err := sqlstreams.Stream[order](client, "orders").Consumer("billing").Register(context.Background(),
		&sqlstreams.ConsumerConfig{Bindings: []string{"orders.us.#"}})
	require.NoError(t, err, "the changed set waits for the live instance")
	srv, c := server(t, client, &console.Options{Authorize: func(*http.Request) console.Access { return console.Access{Read: true} }})
	_, body := get(t, c, srv.URL+"/streams/orders/groups/billing")
	require.Regexp(t, `<tr class="waiter waiting"><td>waiting</td><td><code>orders.us.#</code>`, body)
	cancel()
	require.NoError(t, <-done)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Ages are rounded for people, as the CLI rounds them: to the second under
// an hour (issue 60: "4m39.652s").
func TestPagesRoundAges(t *testing.T) {
	ctx := context.Background()
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t), Clock: mock})
	require.NoError(t, err)
	s := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, s.Register(ctx, nil))
	_, err = s.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{ID: "o-1"}, nil)
	require.NoError(t, err)
	mock.Add(4*time.Minute + 39652*time.Millisecond)
	srv, c := server(t, client, &console.Options{Authorize: func(*http.Request) console.Access { return console.Access{Read: true} }})
	for _, page := range []string{"/", "/streams/orders/groups/billing"} {
		code, body := get(t, c, srv.URL+page)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "<td>4m40s</td>", page)
		require.NotContains(t, body, "4m39.652s", page)
	}
}
