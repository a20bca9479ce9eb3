package sqlstreamsprom

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type order struct {
	ID string `json:"id"`
}

// attempts collects (message, attempt) pairs from handlers, for the test's
// goroutine to wait on.
type attempts struct {
	mu   sync.Mutex
	seen map[string]int
	ch   chan struct{}
}

func (a *attempts) add(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen[id]++
	select {
	case a.ch <- struct{}{}:
	default:
	}
	return a.seen[id]
}

// waitFor returns once want(seen) holds.
func (a *attempts) waitFor(t *testing.T, want func(map[string]int) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		a.mu.Lock()
		ok := want(a.seen)
		a.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-a.ch:
		case <-ctx.Done():
			t.Fatalf("handlers did not reach the expected attempts: %v", a.seen)
		}
	}
}

func families(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, f := range mfs {
		out[f.GetName()] = f
	}
	return out
}

// value is the family's sample for the label values (counter, gauge, or a
// histogram's count).
func value(t *testing.T, fs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f, ok := fs[name]
	require.True(t, ok, "family %s is missing", name)
	for _, m := range f.GetMetric() {
		match := true
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("family %s has no series %v", name, labels)
	return 0
}

func TestEveryFamilyAfterFailuresARetryADeadLetterAndARedrive(t *testing.T) {
	ctx := context.Background()
	obs := New(&Options{CacheFor: time.Nanosecond})
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t), Observer: obs})
	require.NoError(t, err)
	obs.Watch(client)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)

	orders := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, orders.Register(ctx, nil))
	billing, err := orders.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{ExceptionInitialBackoff: time.Millisecond})
	require.NoError(t, err)
	for _, id := range []string{"ok", "flaky", "panicky", "later", "bad"} {
		_, err := orders.Produce(ctx, order{ID: id}, nil)
		require.NoError(t, err)
	}
	_, err = orders.Produce(ctx, order{ID: "slow"}, &sqlstreams.ProduceOptions{Message: &sqlstreams.MessageOptions{Timeout: 100 * time.Millisecond}})
	require.NoError(t, err)

	seen := &attempts{seen: map[string]int{}, ch: make(chan struct{}, 1)}
	redriven := false
	var redrivenMu sync.Mutex
	handler := func(ctx context.Context, o *order) error {
		n := seen.add(o.ID)
		switch {
		case o.ID == "flaky" && n == 1:
			return errors.New("flaky")
		case o.ID == "panicky" && n == 1:
			panic("panicky")
		case o.ID == "slow" && n == 1:
			<-ctx.Done()
			return ctx.Err()
		case o.ID == "later" && n == 1:
			return sqlstreams.Delay(time.Millisecond)
		case o.ID == "bad":
			redrivenMu.Lock()
			defer redrivenMu.Unlock()
			if !redriven {
				return sqlstreams.Terminal(errors.New("bad"))
			}
		}
		return nil
	}
	consume := func(want func(map[string]int) bool) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- billing.Consume(cctx, handler, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
		}()
		seen.waitFor(t, want)
		cancel()
		require.NoError(t, <-done)
	}
	consume(func(s map[string]int) bool {
		return s["ok"] == 1 && s["flaky"] == 2 && s["panicky"] == 2 && s["slow"] == 2 && s["later"] == 2 && s["bad"] == 1
	})
	g, err := client.Group(ctx, "orders", "billing")
	require.NoError(t, err)
	st, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Dead)
	fs := families(t, reg)
	labels := map[string]string{"stream": "orders", "group": "billing"}
	require.EqualValues(t, 1, value(t, fs, "sqlstreams_group_dead_letters", labels))

	redrivenMu.Lock()
	redriven = true
	redrivenMu.Unlock()
	ok, err := g.Redrive(ctx, 5)
	require.NoError(t, err)
	require.True(t, ok)
	consume(func(s map[string]int) bool { return s["bad"] == 2 })

	fs = families(t, reg)
	outcome := func(o string) map[string]string {
		return map[string]string{"stream": "orders", "group": "billing", "outcome": o}
	}
	for name, want := range map[string]float64{
		"sqlstreams_handler_attempts_total/success":  6,
		"sqlstreams_handler_attempts_total/error":    1,
		"sqlstreams_handler_attempts_total/panic":    1,
		"sqlstreams_handler_attempts_total/timeout":  1,
		"sqlstreams_handler_attempts_total/terminal": 1,
		"sqlstreams_handler_attempts_total/delay":    1,
	} {
		family, o, _ := strings.Cut(name, "/")
		require.Equal(t, want, value(t, fs, family, outcome(o)), name)
	}
	require.EqualValues(t, 6, value(t, fs, "sqlstreams_messages_produced_total", map[string]string{"stream": "orders"}))
	for name, want := range map[string]float64{
		"sqlstreams_dead_letters_total":                  1,
		"sqlstreams_redrives_total":                      1,
		"sqlstreams_ranges_reclaimed_total":              0,
		"sqlstreams_ranges_quarantined_total":            0,
		"sqlstreams_delivery_stalls_total":               0,
		"sqlstreams_binding_waits_total":                 0,
		"sqlstreams_alerts_dropped_total":                0,
		"sqlstreams_handler_duration_seconds":            11, // every attempt
		"sqlstreams_produce_to_handler_seconds":          11,
		"sqlstreams_group_lag":                           0,
		"sqlstreams_group_oldest_unconsumed_age_seconds": 0,
		"sqlstreams_group_dead_letters":                  0,
		"sqlstreams_group_sessions":                      0,
		"sqlstreams_group_messages":                      0,
		"sqlstreams_group_counts_estimated":              0,
		"sqlstreams_group_waiting_declarers":             0,
	} {
		require.Equal(t, want, value(t, fs, name, labels), name)
	}
	require.GreaterOrEqual(t, value(t, fs, "sqlstreams_ranges_claimed_total", labels), 1.0)
	require.GreaterOrEqual(t, value(t, fs, "sqlstreams_claim_duration_seconds", labels), 1.0)
	require.Zero(t, value(t, fs, "sqlstreams_listener_reconnects_total", nil))
	for name, f := range fs {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				require.Contains(t, []string{"stream", "group", "outcome", "state"}, l.GetName(), "%s has a label beyond stream, group, outcome and state", name)
			}
		}
	}
}

// The dashboard graphs only metrics the collector exports.
func TestDashboardReferencesOnlyExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	known := map[string]bool{}
	ch := make(chan *prometheus.Desc, 64)
	New(nil).Describe(ch)
	close(ch)
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		known[fq.FindStringSubmatch(d.String())[1]] = true
	}
	name := regexp.MustCompile(`sqlstreams_[a-z_]+`)
	refs := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if strings.HasSuffix(m, suffix) && !known[m] {
						base = strings.TrimSuffix(m, suffix)
					}
				}
				require.True(t, known[base], "panel %q references %s, which the collector does not export", p.Title, m)
				refs++
			}
		}
	}
	require.Greater(t, refs, 10)
}

// The gauges count a group's Consume sessions, not its worker rows (two a
// session), and its messages by state (issue 60).
func TestGaugesCountSessionsAndMessagesByState(t *testing.T) {
	ctx := context.Background()
	obs := New(&Options{CacheFor: time.Nanosecond})
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t), Observer: obs})
	require.NoError(t, err)
	obs.Watch(client)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	orders := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, orders.Register(ctx, nil))
	billing, err := orders.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	for range 3 {
		_, err := orders.Produce(ctx, order{ID: "o"}, nil)
		require.NoError(t, err)
	}
	started := make(chan struct{}, 3)
	release := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- billing.Consume(cctx, func(context.Context, *order) error {
			started <- struct{}{}
			<-release
			return nil
		}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	for range 3 {
		<-started
	}
	fs := families(t, reg)
	labels := map[string]string{"stream": "orders", "group": "billing"}
	state := func(s string) map[string]string {
		return map[string]string{"stream": "orders", "group": "billing", "state": s}
	}
	require.EqualValues(t, 1, value(t, fs, "sqlstreams_group_sessions", labels), "one session, though it holds two worker rows")
	require.EqualValues(t, 3, value(t, fs, "sqlstreams_group_messages", state("in_flight")))
	require.EqualValues(t, 0, value(t, fs, "sqlstreams_group_messages", state("available")))
	require.EqualValues(t, 0, value(t, fs, "sqlstreams_group_messages", state("retrying")))
	require.EqualValues(t, 3, value(t, fs, "sqlstreams_group_lag", labels))
	require.EqualValues(t, 0, value(t, fs, "sqlstreams_group_counts_estimated", labels))
	close(release)
	cancel()
	require.NoError(t, <-done)
}
