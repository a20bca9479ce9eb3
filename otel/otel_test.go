package sqlstreamsotel

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type order struct {
	ID string `json:"id"`
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A produce in a request's span → its send span → the first attempt's
// process span as a child; the retry's process span starts a new trace
// linked to the send span.
func TestSendSpanToProcessSpanAndARetrysLink(t *testing.T) {
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(ctx) }()
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t),
		Tracer: NewTracer(&Options{TracerProvider: tp})})
	require.NoError(t, err)
	orders := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, orders.Register(ctx, nil))
	billing, err := orders.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{ExceptionInitialBackoff: time.Millisecond})
	require.NoError(t, err)

	reqCtx, req := tp.Tracer("test").Start(ctx, "POST /orders")
	_, err = orders.Produce(reqCtx, order{ID: "o-1"}, nil)
	require.NoError(t, err)
	req.End()

	var mu sync.Mutex
	handlerSpans := map[int]trace.SpanContext{}
	done := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		errs <- billing.Consume(cctx, func(ctx context.Context, _ *order) error {
			meta, _ := sqlstreams.MetaFromContext(ctx)
			mu.Lock()
			defer mu.Unlock()
			handlerSpans[meta.Attempt] = trace.SpanContextFromContext(ctx)
			if meta.Attempt == 1 {
				return errors.New("card declined")
			}
			close(done)
			return nil
		}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	select {
	case <-done:
	case err := <-errs:
		t.Fatalf("Consume returned: %v", err)
	}
	cancel()
	require.NoError(t, <-errs)

	var send sdktrace.ReadOnlySpan
	var process []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "send orders":
			send = s
		case "process orders":
			process = append(process, s)
		}
	}
	require.NotNil(t, send, "a send span")
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.Equal(t, req.SpanContext().SpanID(), send.Parent().SpanID(), "the send span is the request's child")
	require.Equal(t, "orders", attr(send, "messaging.destination.name").AsString())
	require.Equal(t, System, attr(send, "messaging.system").AsString())
	require.Len(t, process, 2, "one process span per attempt")

	first, retry := process[0], process[1]
	if attr(first, "sqlstreams.attempt").AsInt64() != 1 {
		first, retry = retry, first
	}
	require.Equal(t, trace.SpanKindConsumer, first.SpanKind())
	require.Equal(t, send.SpanContext().TraceID(), first.SpanContext().TraceID(), "the first attempt is in the producer's trace")
	require.Equal(t, send.SpanContext().SpanID(), first.Parent().SpanID(), "a child of the send span")
	require.Equal(t, "billing", attr(first, "messaging.consumer.group.name").AsString())
	require.Equal(t, "1", attr(first, "messaging.message.id").AsString())
	require.Equal(t, "Error", first.Status().Code.String(), "the failed attempt's span says so")

	require.NotEqual(t, send.SpanContext().TraceID(), retry.SpanContext().TraceID(), "the retry starts a trace of its own")
	require.Len(t, retry.Links(), 1)
	require.Equal(t, send.SpanContext().SpanID(), retry.Links()[0].SpanContext.SpanID(), "linked to the send span")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, first.SpanContext().SpanID(), handlerSpans[1].SpanID(), "the handler runs in its process span")
	require.Equal(t, retry.SpanContext().SpanID(), handlerSpans[2].SpanID())
}

// The trace context rides the message's headers; a message's own header
// of the same name wins, and its other headers are kept.
func TestTraceContextRidesTheHeaders(t *testing.T) {
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider()
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t),
		Tracer: NewTracer(&Options{TracerProvider: tp})})
	require.NoError(t, err)
	orders := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, orders.Register(ctx, nil))
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = orders.ProduceBatch(ctx, []sqlstreams.BatchItem[order]{
		{Msg: order{ID: "a"}, Headers: sqlstreams.Headers{"tenant": "acme"}},
		{Msg: order{ID: "b"}, Headers: sqlstreams.Headers{"tracestate": "mine=1"}},
	}, &sqlstreams.BatchOptions{Tx: tx})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	// Read back what a consumer sees.
	c, err := orders.Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	got := map[string]sqlstreams.Headers{}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	require.NoError(t, c.Consume(cctx, func(ctx context.Context, o *order) error {
		meta, _ := sqlstreams.MetaFromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		got[o.ID] = meta.Headers
		if len(got) == 2 {
			cancel()
		}
		return nil
	}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true}))
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, got["a"]["traceparent"])
	require.Equal(t, "acme", got["a"]["tenant"])
	require.Equal(t, got["a"]["traceparent"], got["b"]["traceparent"], "one send span for the call")
	require.Equal(t, "mine=1", got["b"]["tracestate"], "the message's own header wins")
}

// explosive's payload panics while it is encoded.
type explosive struct{}

func (explosive) MarshalJSON() ([]byte, error) { panic("encoder exploded") }

// A handler that panics is a failed attempt, and its process span says
// so: status Error with an exception event, as for a returned error. So
// does the send span of a produce whose payload panicked while encoding.
func TestAPanicEndsItsSpanWithAnError(t *testing.T) {
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(ctx) }()
	client, err := sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: pgtest.Schema(t),
		Tracer: NewTracer(&Options{TracerProvider: tp})})
	require.NoError(t, err)
	orders := sqlstreams.Stream[order](client, "orders")
	require.NoError(t, orders.Register(ctx, nil))
	billing, err := orders.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{ExceptionInitialBackoff: time.Millisecond})
	require.NoError(t, err)
	_, err = orders.Produce(ctx, order{ID: "o-1"}, nil)
	require.NoError(t, err)

	done := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		errs <- billing.Consume(cctx, func(ctx context.Context, _ *order) error {
			if meta, _ := sqlstreams.MetaFromContext(ctx); meta.Attempt == 1 {
				panic("handler exploded")
			}
			close(done)
			return nil
		}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	select {
	case <-done:
	case err := <-errs:
		t.Fatalf("Consume returned: %v", err)
	}
	cancel()
	require.NoError(t, <-errs)

	exploding := sqlstreams.Stream[explosive](client, "orders")
	require.PanicsWithValue(t, "encoder exploded", func() { _, _ = exploding.Produce(ctx, explosive{}, nil) },
		"the payload's panic reaches the caller unchanged")

	statuses := map[int64]string{}
	var sends []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "process orders":
			statuses[attr(s, "sqlstreams.attempt").AsInt64()] = s.Status().Code.String()
			if attr(s, "sqlstreams.attempt").AsInt64() == 1 {
				require.Contains(t, s.Status().Description, "handler exploded")
				require.NotEmpty(t, s.Events(), "an exception event")
				require.Equal(t, "exception", s.Events()[0].Name)
			}
		case "send orders":
			sends = append(sends, s)
		}
	}
	require.Equal(t, map[int64]string{1: "Error", 2: "Unset"}, statuses, "the panicking attempt's span is an error, the next a success")
	require.Len(t, sends, 2)
	require.Equal(t, "Unset", sends[0].Status().Code.String())
	require.Equal(t, "Error", sends[1].Status().Code.String(), "the send span of the produce that panicked")
	require.Contains(t, sends[1].Status().Description, "encoder exploded")
}
