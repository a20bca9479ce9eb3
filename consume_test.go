package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/stretchr/testify/require"
)

// collector records deliveries and signals when want distinct messages
// have been handled successfully.
type collector struct {
	mu    sync.Mutex
	seen  map[string]int
	want  int
	done  chan struct{}
	fired bool
}

func newCollector(want int) *collector {
	return &collector{seen: map[string]int{}, want: want, done: make(chan struct{})}
}

func (c *collector) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[id]++
	if !c.fired && len(c.seen) >= c.want {
		c.fired = true
		close(c.done)
	}
}

func (c *collector) duplicates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := 0
	for _, n := range c.seen {
		d += n - 1
	}
	return d
}

// session is one running Consume call owned by a test.
type session struct {
	cancel context.CancelFunc
	done   chan error
	id     chan string
}

func consume[T any](t *testing.T, c *Consumer[T], h Handler[T], opts *ConsumeOptions) *session {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{cancel: cancel, done: make(chan error, 1), id: make(chan string, 1)}
	var o ConsumeOptions
	if opts != nil {
		o = *opts
	}
	hooks := hooks.Hooks{}
	if o.test != nil {
		hooks = *o.test
	}
	hooks.OnStart = func(id string) { // the first incarnation's id; later ones are not waited for
		select {
		case s.id <- id:
		default:
		}
	}
	o.test = &hooks
	go func() { s.done <- c.Consume(ctx, h, &o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(60 * time.Second):
			t.Errorf("Consume did not return after cancel")
		}
	})
	return s
}

// stop cancels the session and waits for Consume to return.
func (s *session) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	err := within(t, s.done, "Consume to return")
	s.done <- err // let the cleanup see it too
	return err
}

func fast() *ConsumeOptions {
	return &ConsumeOptions{BatchLimit: 50, MessageConcurrency: 4, ClaimPollRate: 5 * time.Millisecond}
}

func (e *env) produceN(s *StreamHandle[order], prefix string, n int) {
	e.t.Helper()
	items := make([]BatchItem[order], n)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: fmt.Sprintf("%s-%d", prefix, i), Amount: i}}
	}
	_, err := s.ProduceBatch(context.Background(), items, nil)
	require.NoError(e.t, err)
}

func (e *env) leases(c *Consumer[order]) []store.Lease {
	e.t.Helper()
	l, err := c.db().RangeLeases(context.Background())
	require.NoError(e.t, err)
	return l
}

func (e *env) exceptions(c *Consumer[order]) int64 {
	e.t.Helper()
	n, err := storetest.CountExceptions(context.Background(), e.client.store, c.group.StreamID, c.group.ID)
	require.NoError(e.t, err)
	return n
}

func TestSeveralInstancesShareTheWork(t *testing.T) {
	e, s, c := setup(t, nil, "billing", 0)

	const n = 1000
	col := newCollector(n)
	bad := actortest.NewFailures(t)
	// Each instance's first handler waits until the other is handling too,
	// so the split does not depend on timing.
	handling := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var once [2]sync.Once
	h := func(me int) Handler[order] {
		return func(ctx context.Context, o *order) error {
			info, ok := MetaFromContext(ctx)
			if !ok || info.Group != "billing" {
				bad.Add("handler meta: %+v, %v", info, ok)
			}
			once[me].Do(func() { close(handling[me]) })
			select {
			case <-handling[1-me]:
			case <-ctx.Done():
				return ctx.Err()
			}
			col.add(o.OrderID)
			return nil
		}
	}
	sa, sb := NewSession(), NewSession()
	optsA, optsB := fast(), fast()
	optsA.Session, optsB.Session = sa, sb
	optsA.QueueSize, optsB.QueueSize = 100, 100 // neither can hold the whole backlog
	a := consume(t, c, h(0), optsA)
	b := consume(t, c, h(1), optsB)
	for i := range 10 {
		e.produceN(s, fmt.Sprint("batch", i), n/10)
	}
	within(t, col.done, "all messages")
	require.NoError(t, a.stop(t))
	require.NoError(t, b.stop(t))
	bad.Check(t)

	require.Zero(t, col.duplicates(), "no overlap between instances in the steady state")
	require.Positive(t, sa.Stats().Succeeded, "the first instance did some of the work")
	require.Positive(t, sb.Stats().Succeeded, "the second instance did some of the work")
	require.Empty(t, e.leases(c), "every range committed")
	require.Zero(t, e.exceptions(c))
	st := c.Stats()
	require.EqualValues(t, n, st.Succeeded)
	require.Equal(t, sa.Stats().Succeeded+sb.Stats().Succeeded, st.Succeeded)
	require.Zero(t, st.LeasesLost)
	require.Empty(t, e.logs.Messages(slog.LevelWarn), "steady state logs nothing at warn")
}

func TestFanOutToGroups(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	e.produceN(s, "m", 200)
	var cols []*collector
	for _, g := range []string{"g1", "g2", "g3"} {
		c, err := s.Consumer(g).Register(ctx, nil)
		require.NoError(t, err)
		col := newCollector(200)
		cols = append(cols, col)
		consume(t, c, func(_ context.Context, o *order) error { col.add(o.OrderID); return nil }, fast())
	}
	for _, col := range cols {
		within(t, col.done, "each group gets every message")
	}
}

func TestStartHeadSkipsExistingMessages(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	e.produceN(s, "old", 20)
	c, err := s.Consumer("late").Register(ctx, &ConsumerConfig{Start: StartHead})
	require.NoError(t, err)
	e.produceN(s, "new", 5)
	got := make(chan string, 100)
	consume(t, c, func(_ context.Context, o *order) error { got <- o.OrderID; return nil }, fast())
	for range 5 {
		id := within(t, got, "new message")
		require.Contains(t, id, "new-")
	}
	// Redeclaring with another Start changes nothing and says so.
	_, err = s.Consumer("late").Register(ctx, &ConsumerConfig{Start: StartBeginning})
	require.NoError(t, err)
	_, ok := e.logs.Record("consumer group Start differs from the one its cursor was created with; Start is read only at creation")
	require.True(t, ok)
	_, err = s.Consumer("late").Register(ctx, &ConsumerConfig{Start: "middle"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = Stream[order](e.client, "other").Consumer("late").Register(ctx, nil)
	require.Error(t, err)
}

func TestGroupOnAnotherStreamIsRefused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.stream("a")
	b := e.stream("b")
	_, err := Stream[order](e.client, "a").Consumer("g").Register(ctx, nil)
	require.NoError(t, err)
	_, err = b.Consumer("g").Register(ctx, nil)
	require.ErrorIs(t, err, ErrGroupStream)
	_, err = b.Consumer("bad name").Register(ctx, nil)
	require.ErrorIs(t, err, ErrInvalidName)
}

func TestFailuresPanicsAndBadPayloadsBecomeExceptionRows(t *testing.T) {
	e, _, c := setup(t, nil, "g", 30)
	ctx := context.Background()
	// Another schema version on the same stream.
	_, err := Stream[orderV2](e.client, "orders").Produce(ctx, orderV2{OrderID: "v2"}, nil)
	require.NoError(t, err)

	col := newCollector(30) // the v2 message never reaches the handler
	sess := consume(t, c, func(_ context.Context, o *order) error {
		defer col.add(o.OrderID)
		switch o.OrderID {
		case "m-3":
			return errors.New("card declined")
		case "m-7":
			panic("handler bug")
		}
		return nil
	}, fast())
	within(t, col.done, "every v1 message handled")
	require.NoError(t, sess.stop(t))
	require.Empty(t, e.leases(c))
	require.EqualValues(t, 3, e.exceptions(c))

	var lastErr string
	require.NoError(t, e.pool.QueryRow(ctx, fmt.Sprintf(
		"SELECT x.last_error FROM %s.stream_%d_exception x JOIN %s.stream_%d_log m ON m.id = x.message_id WHERE m.payload->>'order_id' = 'm-7'",
		e.client.Schema(), c.group.StreamID, e.client.Schema(), c.group.StreamID)).Scan(&lastErr))
	require.Contains(t, lastErr, "handler panic: handler bug")
	require.Contains(t, lastErr, "goroutine", "the stack is kept")
	require.EqualValues(t, 3, c.Stats().Failed)
}

func TestConsumeRejectsBadOptions(t *testing.T) {
	e := newEnv(t, nil)
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(context.Background(), nil)
	require.NoError(t, err)
	h := func(context.Context, *order) error { return nil }
	for _, o := range []*ConsumeOptions{{BatchLimit: -1}, {BatchLimit: 10, QueueSize: 5}, {InstanceTTL: time.Millisecond}, {MessageConcurrency: -2}} {
		require.ErrorIs(t, c.Consume(context.Background(), h, o), ErrInvalidConfig)
	}
	require.ErrorIs(t, c.Consume(context.Background(), nil, nil), ErrInvalidConfig)
}

// A consumer of json.RawMessage receives each payload exactly as produced,
// without the decoder's pass, in its own copy (the claim's buffer is shared
// and reused).
func TestRawMessageConsumerGetsThePayloadAsProduced(t *testing.T) {
	e, s, _ := setup(t, nil, "typed", 0)
	ctx := context.Background()
	want := map[string]string{}
	for i := range 20 {
		o := order{OrderID: fmt.Sprintf("raw-%d", i), Amount: i}
		_, err := s.Produce(ctx, o, nil)
		require.NoError(t, err)
		b, err := json.Marshal(o)
		require.NoError(t, err)
		want[o.OrderID] = string(b)
	}
	raw, err := Stream[json.RawMessage](e.client, "orders").Consumer("raw").Register(ctx, nil)
	require.NoError(t, err)
	col := newCollector(len(want))
	var mu sync.Mutex
	var kept []json.RawMessage
	sess := consume(t, raw, func(_ context.Context, m *json.RawMessage) error {
		var o order
		if err := json.Unmarshal(*m, &o); err != nil {
			return err
		}
		mu.Lock()
		kept = append(kept, *m) // retained past the handler
		mu.Unlock()
		col.add(o.OrderID)
		return nil
	}, fast())
	within(t, col.done, "every message handled")
	require.NoError(t, sess.stop(t))
	require.Len(t, kept, len(want))
	for _, m := range kept {
		var o order
		require.NoError(t, json.Unmarshal(m, &o))
		require.Equal(t, want[o.OrderID], string(m), "the retained bytes are still the message's own")
	}
}

// A Consume call is one session (seed 001): a Session's counters start at
// zero and stay readable after the call returns, while Consumer.Stats adds
// up every session, so metrics built on it only go up. A Session serves one
// call.
func TestEachSessionCountsFromZero(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	run := func(prefix string, n int) *Session {
		e.produceN(s, prefix, n)
		handled := make(chan struct{}, n)
		sess := NewSession()
		b := consume(t, c, func(context.Context, *order) error { handled <- struct{}{}; return nil }, &ConsumeOptions{Session: sess})
		for range n {
			within(t, handled, "a delivery")
		}
		require.NoError(t, b.stop(t))
		return sess
	}
	first := run("a", 3)
	second := run("b", 5)
	require.EqualValues(t, 3, first.Stats().Succeeded)
	require.EqualValues(t, 5, second.Stats().Succeeded, "the second session counts from zero")
	require.EqualValues(t, 8, c.Stats().Succeeded, "the consumer's counters are cumulative")
	require.EqualValues(t, first.Stats().Claimed+second.Stats().Claimed, c.Stats().Claimed)

	err := c.Consume(context.Background(), func(context.Context, *order) error { return nil }, &ConsumeOptions{Session: first})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "ConsumeOptions.Session")
}

// The registrar runs under a supervisor like every other actor: a panic in
// a binding-declaration attempt restarts it, and the session goes on to
// consume.
func TestARegistrarPanicIsRestarted(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	e.produceN(s, "m", 1)
	var panicked atomic.Bool
	handled := make(chan struct{}, 1)
	restarted := e.logs.Next("actor panicked; restarting")
	b := consume(t, c, func(context.Context, *order) error { handled <- struct{}{}; return nil },
		&ConsumeOptions{test: &hooks.Hooks{Step: func(site hooks.Site) error {
			if site == hooks.Registrar && panicked.CompareAndSwap(false, true) {
				hooks.Inject(site) // a registrar attempt panics
			}
			return nil
		}}})
	within(t, restarted, "the panic, logged by the supervisor")
	within(t, handled, "a delivery after the registrar restarted")
	require.NoError(t, b.stop(t))
}
