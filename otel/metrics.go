package sqlstreamsotel

import (
	"context"
	"time"

	"github.com/c1702965/sqlstreams"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Observer implements sqlstreams.Observer with OpenTelemetry metrics: the
// same events the Prometheus collector counts, named in OpenTelemetry's
// style (sqlstreams.handler.attempts, sqlstreams.handler.duration, …), with
// the attributes messaging.destination.name and
// messaging.consumer.group.name (and sqlstreams.outcome on attempts).
type Observer struct {
	sqlstreams.NopObserver
	produced, attempts, dead, redrives, claimed, reclaimed, quarantined, stalls, waits, dropped, reconnects metric.Int64Counter
	handler, latency, claim                                                                                 metric.Float64Histogram
}

// NewObserver returns an Observer for ClientConfig.Observer, on mp (nil:
// otel.GetMeterProvider()).
func NewObserver(mp metric.MeterProvider) (*Observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter("github.com/c1702965/sqlstreams/otel")
	o := &Observer{}
	var err error
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Counter(name, metric.WithDescription(desc))
		}
	}
	histogram := func(dst *metric.Float64Histogram, name, desc string) {
		if err == nil {
			*dst, err = m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"))
		}
	}
	counter(&o.produced, "sqlstreams.messages.produced", "Messages produced.")
	counter(&o.attempts, "sqlstreams.handler.attempts", "Handler attempts, by outcome.")
	counter(&o.dead, "sqlstreams.dead_letters", "Messages that became dead letters.")
	counter(&o.redrives, "sqlstreams.redrives", "Dead letters redriven.")
	counter(&o.claimed, "sqlstreams.ranges.claimed", "Ranges claimed.")
	counter(&o.reclaimed, "sqlstreams.ranges.reclaimed", "Ranges taken over from a lapsed instance.")
	counter(&o.quarantined, "sqlstreams.ranges.quarantined", "Ranges quarantined.")
	counter(&o.stalls, "sqlstreams.delivery.stalls", "Claims held back by an open transaction past StallWarning.")
	counter(&o.waits, "sqlstreams.binding.waits", "Sessions whose binding set waited.")
	counter(&o.dropped, "sqlstreams.alerts.dropped", "Alerts dropped by a full queue.")
	counter(&o.reconnects, "sqlstreams.listener.reconnects", "Notification listener reconnects.")
	histogram(&o.handler, "sqlstreams.handler.duration", "How long handler attempts ran.")
	histogram(&o.latency, "sqlstreams.produce_to_handler.duration", "Time from produce to the start of a handler attempt.")
	histogram(&o.claim, "sqlstreams.claim.duration", "How long claim statements took.")
	if err != nil {
		return nil, err
	}
	return o, nil
}

func groupAttrs(stream, group string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("messaging.destination.name", stream), attribute.String("messaging.consumer.group.name", group))
}

// Produced implements sqlstreams.Observer.
func (o *Observer) Produced(stream string, n int) {
	o.produced.Add(context.Background(), int64(n), metric.WithAttributes(attribute.String("messaging.destination.name", stream)))
}

// AttemptDone implements sqlstreams.Observer.
func (o *Observer) AttemptDone(a sqlstreams.AttemptEvent) {
	ctx := context.Background()
	o.attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("messaging.destination.name", a.Stream),
		attribute.String("messaging.consumer.group.name", a.Group), attribute.String("sqlstreams.outcome", string(a.Outcome))))
	attrs := groupAttrs(a.Stream, a.Group)
	if a.Dead {
		o.dead.Add(ctx, 1, attrs)
	}
	o.handler.Record(ctx, a.Duration.Seconds(), attrs)
	o.latency.Record(ctx, a.SinceProduced.Seconds(), attrs)
}

// Count implements sqlstreams.Observer.
func (o *Observer) Count(stream, group string, e sqlstreams.ObservedEvent, n int) {
	c := map[sqlstreams.ObservedEvent]metric.Int64Counter{
		sqlstreams.EventRangeClaimed: o.claimed, sqlstreams.EventRangeReclaimed: o.reclaimed,
		sqlstreams.EventRangeQuarantined: o.quarantined, sqlstreams.EventDeliveryStall: o.stalls,
		sqlstreams.EventBindingWait: o.waits, sqlstreams.EventRedriven: o.redrives, sqlstreams.EventAlertDropped: o.dropped,
		sqlstreams.EventListenerReconnect: o.reconnects,
	}[e]
	if c == nil {
		return
	}
	if e == sqlstreams.EventListenerReconnect {
		c.Add(context.Background(), int64(n))
		return
	}
	c.Add(context.Background(), int64(n), groupAttrs(stream, group))
}

// ClaimDuration implements sqlstreams.Observer.
func (o *Observer) ClaimDuration(stream, group string, d time.Duration) {
	o.claim.Record(context.Background(), d.Seconds(), groupAttrs(stream, group))
}
