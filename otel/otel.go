// Package sqlstreamsotel traces sqlstreams with OpenTelemetry, and counts
// it with OpenTelemetry metrics. It is a module of its own
// (github.com/c1702965/sqlstreams/otel), so that the library's module needs
// no OpenTelemetry.
//
//	tr := sqlstreamsotel.NewTracer(nil)   // the global TracerProvider and W3C propagator
//	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Tracer: tr})
//
// Every Produce or ProduceBatch call runs in a "send {stream}" span (kind
// producer) whose W3C traceparent and tracestate ride every message of the
// call in its headers. Every handler attempt runs in a "process {stream}"
// span (kind consumer): on the first attempt a child of the producer's span,
// on a retry a new trace linked to it (a retry may run hours later, and
// nesting it under a finished request would misrepresent both). Attributes
// follow the OpenTelemetry messaging conventions: messaging.system,
// messaging.destination.name, messaging.operation.type and .name,
// messaging.consumer.group.name, messaging.message.id,
// messaging.batch.message_count.
//
// It is an API for users.
package sqlstreamsotel

import (
	"context"
	"strconv"

	"github.com/c1702965/sqlstreams"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// System is the messaging.system attribute's value.
const System = "sqlstreams"

// Options configure a Tracer; nil means the defaults.
type Options struct {
	// TracerProvider makes the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in message headers.
	// Default W3C trace context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// Tracer implements sqlstreams.Tracer.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// NewTracer returns a Tracer for ClientConfig.Tracer.
func NewTracer(opts *Options) *Tracer {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.TraceContext{}
	}
	return &Tracer{tracer: o.TracerProvider.Tracer("github.com/c1702965/sqlstreams/otel"), prop: o.Propagator}
}

// StartSend implements sqlstreams.Tracer.
func (t *Tracer) StartSend(ctx context.Context, stream string, messages int) (context.Context, sqlstreams.Headers, func(error)) {
	ctx, span := t.tracer.Start(ctx, "send "+stream, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", System),
		attribute.String("messaging.destination.name", stream),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.operation.name", "send"),
		attribute.Int("messaging.batch.message_count", messages),
	))
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	return ctx, sqlstreams.Headers(carrier), func(err error) { end(span, err) }
}

// StartProcess implements sqlstreams.Tracer.
func (t *Tracer) StartProcess(ctx context.Context, meta sqlstreams.Meta) (context.Context, func(error)) {
	producer := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(meta.Headers)))
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("messaging.system", System),
		attribute.String("messaging.destination.name", meta.Stream),
		attribute.String("messaging.consumer.group.name", meta.Group),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.message.id", strconv.FormatInt(meta.ID, 10)),
		attribute.Int("sqlstreams.attempt", meta.Attempt),
	)}
	switch {
	case producer.IsValid() && meta.Attempt <= 1:
		ctx = trace.ContextWithRemoteSpanContext(ctx, producer)
	case producer.IsValid():
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: producer}))
	}
	ctx, span := t.tracer.Start(ctx, "process "+meta.Stream, opts...)
	return ctx, func(err error) { end(span, err) }
}

func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
