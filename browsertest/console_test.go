package browsertest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/console"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type order struct {
	ID string `json:"id"`
}

// browser starts headless Chromium (the system binary) and returns a
// chromedp context on it, cancelled when t ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("Chromium is not installed: apt-get install -y chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.Headless,
		chromedp.DisableGPU, chromedp.WindowSize(1400, 1000))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to sandbox as root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start Chromium")
	return ctx
}

// text reads the visible text of the first element matching css.
func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(css)))
	require.NoError(t, err, css)
	return s
}

// open loads url.
func open(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url)), url)
}

// count counts the elements matching css.
func count(t *testing.T, ctx context.Context, css string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", css)))
	require.NoError(t, err)
	return n
}

// screenshot writes the page to artifacts/<test>-<name>.png.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("SQLSTREAMS_TEST_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	file := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name+".png")
	require.NoError(t, os.WriteFile(file, png, 0o644))
	t.Logf("screenshot: %s", file)
}

type fixture struct {
	client   *sqlstreams.Client
	stream   *sqlstreams.StreamHandle[order]
	billing  *sqlstreams.Consumer[order]
	poisoned atomic.Bool // while set, "poison" fails terminally
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	f := &fixture{client: client, stream: sqlstreams.Stream[order](client, "orders")}
	require.NoError(t, f.stream.Register(ctx, nil))
	f.billing, err = f.stream.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{Bindings: []string{"orders.#"},
		DeliveryLog: sqlstreams.DeliveryLogAll})
	require.NoError(t, err)
	f.poisoned.Store(true)
	return f
}

func (f *fixture) produce(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		_, err := f.stream.Produce(context.Background(), order{ID: id}, &sqlstreams.ProduceOptions{RoutingKey: "orders.eu"})
		require.NoError(t, err)
	}
}

// consume runs the group until its handler has been called calls times
// (then the session drains: every outcome is settled when it returns).
func (f *fixture) consume(t *testing.T, calls int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- f.billing.Consume(ctx, func(_ context.Context, o *order) error {
			defer func() {
				if n.Add(1) == calls {
					cancel()
				}
			}()
			if o.ID == "poison" && f.poisoned.Load() {
				return sqlstreams.Terminal(errors.New("poison: card declined"))
			}
			return nil
		}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	limit, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-limit.Done():
		t.Fatalf("the group's handler was not called %d times within a minute", calls)
	}
}

func (f *fixture) serve(t *testing.T, a console.Access) string {
	t.Helper()
	srv := httptest.NewServer(console.New(f.client, &console.Options{Authorize: func(*http.Request) console.Access { return a }}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestGroupPageShowsTheLagStatusReports(t *testing.T) {
	f := newFixture(t)
	f.produce(t, "a", "b", "c", "d", "e")
	url := f.serve(t, console.Access{Read: true})
	st, err := f.billing.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 5, st.Lag)
	ctx := browser(t)
	open(t, ctx, url+"/streams/orders/groups/billing")
	require.Equal(t, fmt.Sprint(st.Lag), text(t, ctx, "#lag"))
	require.Equal(t, "5", text(t, ctx, "#available"), "none claimed yet")
	require.Equal(t, "0", text(t, ctx, "#in-flight"))
	require.Equal(t, "0", text(t, ctx, "#dead"))
	require.Equal(t, "0", text(t, ctx, "#sessions"))
	screenshot(t, ctx, "group")
	open(t, ctx, url+"/")
	require.Equal(t, "5", text(t, ctx, `tr[data-group="billing"] .lag`))
	screenshot(t, ctx, "streams")
}

func TestAWaiterAppearsOnTheBindingsTable(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := sqlstreams.NewReadiness()
	done := make(chan error, 1)
	go func() {
		done <- f.billing.Consume(ctx, func(context.Context, *order) error { return nil }, &sqlstreams.ConsumeOptions{Readiness: ready, DisableManager: true})
	}()
	require.NoError(t, ready.Wait(ctx))
	_, err := f.stream.Consumer("billing").Register(context.Background(), &sqlstreams.ConsumerConfig{Bindings: []string{"orders.us.#"}})
	require.NoError(t, err)
	url := f.serve(t, console.Access{Read: true})
	b := browser(t)
	open(t, b, url+"/streams/orders/groups/billing")
	waiter := text(t, b, "#bindings tr.waiter")
	require.Contains(t, waiter, "waiting")
	require.Contains(t, waiter, "orders.us.#")
	screenshot(t, b, "waiter")
	cancel()
	require.NoError(t, <-done)
}

func TestADeadLetterIsRedrivenFromItsPageAndConsumed(t *testing.T) {
	f := newFixture(t)
	f.produce(t, "ok", "poison")
	f.consume(t, 2)
	st, err := f.billing.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Dead)
	dead, err := f.billing.DeadLetters(context.Background(), 0, 10)
	require.NoError(t, err)
	id := dead[0].MessageID

	url := f.serve(t, console.Access{Read: true, Payloads: true, Actions: true})
	b := browser(t)
	open(t, b, fmt.Sprintf("%s/streams/orders/groups/billing/dead/%d", url, id))
	require.Contains(t, text(t, b, "#last-error"), "poison: card declined")
	require.JSONEq(t, `{"id":"poison"}`, text(t, b, "#payload"))
	screenshot(t, b, "dead-letter")
	require.NoError(t, chromedp.Do(b, chromedp.Click(chromedp.CSS("#redrive")), chromedp.WaitVisible(chromedp.CSS("#flash"))))
	require.Equal(t, "redrove 1 dead letter(s)", text(t, b, "#flash"))
	screenshot(t, b, "redriven")

	f.poisoned.Store(false) // the card works now
	f.consume(t, 1)
	st, err = f.billing.Status(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Dead)
	require.Zero(t, st.Lag, "the redriven message was consumed")
}

func TestWithoutTheGrantThereIsNoRedrive(t *testing.T) {
	f := newFixture(t)
	f.produce(t, "poison")
	f.consume(t, 1)
	dead, err := f.billing.DeadLetters(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	url := f.serve(t, console.Access{Read: true})
	b := browser(t)
	open(t, b, fmt.Sprintf("%s/streams/orders/groups/billing/dead/%d", url, dead[0].MessageID))
	require.Zero(t, count(t, b, "#redrive"), "no redrive button without Access.Actions")
	require.Equal(t, 1, count(t, b, "#payload-hidden"), "no payload without Access.Payloads")
	screenshot(t, b, "read-only")
	// The POST is refused too, whatever the page offers.
	status, err := chromedp.Run(b, chromedp.Evaluate[int](fmt.Sprintf(`fetch("/streams/orders/groups/billing/redrive",
		{method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "id=%d"}).then(r => r.status)`, dead[0].MessageID),
		chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status)
	st, err := f.billing.Status(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Dead, "still dead")
}
