// Package sqlstreamsprom exports sqlstreams' metrics to Prometheus. It is
// a module of its own (github.com/c1702965/sqlstreams/prometheus), so that
// the library's module needs no metrics library.
//
//	obs := sqlstreamsprom.New(nil)
//	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Observer: obs})
//	obs.Watch(client) // the gauges read through the read-only group handle
//	prometheus.MustRegister(obs)
//
// Counters and histograms come from the client's events (Observer);
// gauges — lag and the messages behind it by state, oldest-unconsumed age,
// dead letters, sessions and waiting declarers per group — are read on
// scrape through the read-only group handle and cached for
// Options.CacheFor, so that however often Prometheus scrapes, the database
// pays one status read per group per CacheFor (a handful of index reads
// each; the counts read at most sqlstreams.StatusCountBound log positions).
// Labels are stream and group names, and a handful of fixed values
// (outcome, state).
//
// It is an API for users.
package sqlstreamsprom

import (
	"context"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Collector. nil means the defaults.
type Options struct {
	// CacheFor is how long the gauges read from the database are reused.
	// Default 15s (a common scrape interval).
	CacheFor time.Duration
	// ReadTimeout bounds one scrape's database reads. Default 5s.
	ReadTimeout time.Duration
	// Clock drives the cache. Default sqlstreams.RealClock().
	Clock sqlstreams.Clock
}

// Collector is a sqlstreams.Observer and a prometheus.Collector.
type Collector struct {
	sqlstreams.NopObserver
	opts Options

	produced, attempts, dead, redrives, claimed, reclaimed, quarantined, stalls, waits, dropped *prometheus.CounterVec
	reconnects                                                                                  prometheus.Counter
	handlerDuration, latency, claimDuration                                                     *prometheus.HistogramVec

	lag, messages, estimated, oldest, deadNow, sessions, waiters *prometheus.Desc

	seen sync.Map // "stream\x00group" → struct{}: label sets whose families exist

	mu     sync.Mutex
	client *sqlstreams.Client
	cached []prometheus.Metric
	at     time.Time
}

const ns = "sqlstreams"

var groupLabels = []string{"stream", "group"}

// New returns a Collector. Give it to ClientConfig.Observer, then call
// Watch with the client for the gauges.
func New(opts *Options) *Collector {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.CacheFor <= 0 {
		o.CacheFor = 15 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 5 * time.Second
	}
	if o.Clock == nil {
		o.Clock = sqlstreams.RealClock()
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, groupLabels)
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, groupLabels, nil)
	}
	return &Collector{
		opts:            o,
		produced:        counter("messages_produced_total", "Messages produced, by stream.", "stream"),
		attempts:        counter("handler_attempts_total", "Handler attempts, by outcome: success, error, panic, timeout, terminal, delay.", "stream", "group", "outcome"),
		dead:            counter("dead_letters_total", "Messages that became dead letters.", groupLabels...),
		redrives:        counter("redrives_total", "Dead letters redriven.", groupLabels...),
		claimed:         counter("ranges_claimed_total", "Ranges of new positions claimed.", groupLabels...),
		reclaimed:       counter("ranges_reclaimed_total", "Ranges taken over from an instance whose lease lapsed.", groupLabels...),
		quarantined:     counter("ranges_quarantined_total", "Ranges split into exception rows after too many reclaims.", groupLabels...),
		stalls:          counter("delivery_stalls_total", "Claims held back by an open transaction past StallWarning.", groupLabels...),
		waits:           counter("binding_waits_total", "Sessions whose binding set waited for live instances holding another.", groupLabels...),
		dropped:         counter("alerts_dropped_total", "Alerts not produced because the session's alert queue was full.", groupLabels...),
		reconnects:      prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "listener_reconnects_total", Help: "Reconnects of the client's notification listener."}),
		handlerDuration: histogram("handler_duration_seconds", "How long handler attempts ran.", prometheus.ExponentialBuckets(0.001, 4, 10)),
		latency:         histogram("produce_to_handler_seconds", "Time from a message's produce to the start of a handler attempt.", prometheus.ExponentialBuckets(0.001, 4, 12)),
		claimDuration:   histogram("claim_duration_seconds", "How long claim statements took.", prometheus.ExponentialBuckets(0.0005, 4, 10)),
		lag:             desc("group_lag", "Messages the group has left to handle: available, in flight, retrying and quarantined (dead letters are not lag)."),
		messages: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "group_messages"),
			"Messages the group has left, by state: available (not claimed yet), in_flight (claimed, not settled), retrying, quarantined.",
			append(append([]string{}, groupLabels...), "state"), nil),
		estimated: desc("group_counts_estimated", "1 when the available or in-flight count passed sqlstreams.StatusCountBound and is an estimate from the message ids."),
		oldest:    desc("group_oldest_unconsumed_age_seconds", "Age of the oldest message after the committed position (0: none)."),
		deadNow:   desc("group_dead_letters", "Dead letters the group holds now."),
		sessions:  desc("group_sessions", "Live Consume sessions of the group (each holds one instance row per worker)."),
		waiters:   desc("group_waiting_declarers", "Declarers waiting to change the group's binding set."),
	}
}

// Watch lets the collector read the gauges through client's read-only
// group handle. Without it, only the counters and histograms are exported.
func (c *Collector) Watch(client *sqlstreams.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.client, c.cached = client, nil
}

// touch makes every per-group family export a series for stream and group
// (at zero) from the first event or scrape that names them: a family a
// dashboard graphs exists before its first occurrence.
func (c *Collector) touch(stream, group string) {
	if _, ok := c.seen.Load(stream + "\x00" + group); ok {
		return
	}
	c.seen.Store(stream+"\x00"+group, struct{}{})
	c.produced.WithLabelValues(stream)
	if group == "" {
		return
	}
	for _, o := range []sqlstreams.AttemptOutcome{sqlstreams.OutcomeSuccess, sqlstreams.OutcomeError, sqlstreams.OutcomePanic,
		sqlstreams.OutcomeTimeout, sqlstreams.OutcomeTerminal, sqlstreams.OutcomeDelay} {
		c.attempts.WithLabelValues(stream, group, string(o))
	}
	for _, v := range []*prometheus.CounterVec{c.dead, c.redrives, c.claimed, c.reclaimed, c.quarantined, c.stalls, c.waits, c.dropped} {
		v.WithLabelValues(stream, group)
	}
	for _, h := range []*prometheus.HistogramVec{c.handlerDuration, c.latency, c.claimDuration} {
		h.WithLabelValues(stream, group)
	}
}

// Produced implements sqlstreams.Observer.
func (c *Collector) Produced(stream string, n int) {
	c.touch(stream, "")
	c.produced.WithLabelValues(stream).Add(float64(n))
}

// AttemptDone implements sqlstreams.Observer.
func (c *Collector) AttemptDone(a sqlstreams.AttemptEvent) {
	c.touch(a.Stream, a.Group)
	c.attempts.WithLabelValues(a.Stream, a.Group, string(a.Outcome)).Inc()
	if a.Dead {
		c.dead.WithLabelValues(a.Stream, a.Group).Inc()
	}
	c.handlerDuration.WithLabelValues(a.Stream, a.Group).Observe(a.Duration.Seconds())
	c.latency.WithLabelValues(a.Stream, a.Group).Observe(a.SinceProduced.Seconds())
}

// Count implements sqlstreams.Observer.
func (c *Collector) Count(stream, group string, e sqlstreams.ObservedEvent, n int) {
	var v *prometheus.CounterVec
	switch e {
	case sqlstreams.EventRangeClaimed:
		v = c.claimed
	case sqlstreams.EventRangeReclaimed:
		v = c.reclaimed
	case sqlstreams.EventRangeQuarantined:
		v = c.quarantined
	case sqlstreams.EventDeliveryStall:
		v = c.stalls
	case sqlstreams.EventBindingWait:
		v = c.waits
	case sqlstreams.EventRedriven:
		v = c.redrives
	case sqlstreams.EventAlertDropped:
		v = c.dropped
	case sqlstreams.EventListenerReconnect:
		c.reconnects.Add(float64(n))
		return
	default:
		return // an event this version does not export
	}
	c.touch(stream, group)
	v.WithLabelValues(stream, group).Add(float64(n))
}

// ClaimDuration implements sqlstreams.Observer.
func (c *Collector) ClaimDuration(stream, group string, d time.Duration) {
	c.touch(stream, group)
	c.claimDuration.WithLabelValues(stream, group).Observe(d.Seconds())
}

func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.produced, c.attempts, c.dead, c.redrives, c.claimed, c.reclaimed, c.quarantined,
		c.stalls, c.waits, c.dropped, c.reconnects, c.handlerDuration, c.latency, c.claimDuration}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{c.lag, c.messages, c.estimated, c.oldest, c.deadNow, c.sessions, c.waiters} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauges := c.gauges() // first: it names the groups whose families exist
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
	for _, m := range gauges {
		ch <- m
	}
}

// gauges reads every group's status, at most once per CacheFor. A failed
// read exports what it could (a scrape never fails for a database outage:
// the counters still tell the story).
func (c *Collector) gauges() []prometheus.Metric {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		return nil
	}
	now := c.opts.Clock.Now()
	if c.cached != nil && now.Sub(c.at) < c.opts.CacheFor {
		return c.cached
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.ReadTimeout)
	defer cancel()
	groups, err := c.client.Groups(ctx, "")
	if err != nil {
		return c.cached
	}
	out := []prometheus.Metric{}
	for _, gi := range groups {
		g, err := c.client.Group(ctx, gi.Stream, gi.Name)
		if err != nil {
			continue
		}
		s, err := g.Status(ctx)
		if err != nil {
			continue
		}
		c.touch(gi.Stream, gi.Name)
		labels := []string{gi.Stream, gi.Name}
		estimated := 0.0
		if s.Estimated {
			estimated = 1
		}
		out = append(out,
			prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(s.Lag), labels...),
			prometheus.MustNewConstMetric(c.estimated, prometheus.GaugeValue, estimated, labels...),
			prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, s.OldestAge.Seconds(), labels...),
			prometheus.MustNewConstMetric(c.deadNow, prometheus.GaugeValue, float64(s.Dead), labels...),
			prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(len(s.Members)), labels...))
		for _, m := range []struct {
			state string
			n     int64
		}{{"available", s.Available}, {"in_flight", s.InFlight}, {"retrying", s.Retrying}, {"quarantined", s.Quarantined}} {
			out = append(out, prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(m.n), gi.Stream, gi.Name, m.state))
		}
		if b, err := g.Bindings(ctx, 0); err == nil {
			waiting := 0
			for _, w := range b.Waiting {
				if w.Status == "waiting" {
					waiting++
				}
			}
			out = append(out, prometheus.MustNewConstMetric(c.waiters, prometheus.GaugeValue, float64(waiting), labels...))
		}
	}
	c.cached, c.at = out, now
	return out
}
