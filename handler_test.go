package sqlstreams

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPanicDoesNotKillTheInstance(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	first, second := newCollector(19), newCollector(5)
	sess := consume(t, c, func(_ context.Context, o *order) error {
		switch {
		case o.OrderID == "m-3":
			panic("nil map somewhere")
		case o.Amount < 0:
			second.add(o.OrderID)
		default:
			first.add(o.OrderID)
		}
		return nil
	}, fast())
	e.produceN(s, "m", 20)
	within(t, first.done, "the messages around the panicking one")
	items := make([]BatchItem[order], 5)
	for i := range items {
		items[i] = BatchItem[order]{Msg: order{OrderID: "late-" + string(rune('a'+i)), Amount: -1}}
	}
	_, err := s.ProduceBatch(context.Background(), items, nil)
	require.NoError(t, err)
	within(t, second.done, "messages produced after the panic")
	require.NoError(t, sess.stop(t))

	require.EqualValues(t, 1, c.Stats().Panics)
	xs, err := c.db().ExceptionStates(context.Background())
	require.NoError(t, err)
	require.Len(t, xs, 1)
	require.Contains(t, xs[0].LastError, "handler panic: nil map somewhere")
	require.Contains(t, xs[0].LastError, "goroutine", "the stack is kept")
}

// A handler that ignores its context past Timeout + TimeoutGrace is
// abandoned: the attempt is a timeout failure and the instance keeps
// consuming.
func TestHungHandlerPastTimeoutIsAbandonedAndTheInstanceKeepsConsuming(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	hung := make(chan struct{})
	col := newCollector(10)
	sess := consume(t, c, func(ctx context.Context, o *order) error {
		if o.OrderID == "hang" {
			close(hung)
			<-release // ignores ctx
			return nil
		}
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 5, MessageConcurrency: 1, ClaimPollRate: 5 * time.Millisecond,
		TimeoutGrace: 20 * time.Millisecond, ShutdownTimeout: 50 * time.Millisecond})
	_, err := s.Produce(context.Background(), order{OrderID: "hang"}, &ProduceOptions{Message: &MessageOptions{
		Timeout: 20 * time.Millisecond, Retry: &RetryPolicy{MaxRetries: NoRetries}}})
	require.NoError(t, err)
	within(t, hung, "the hanging handler")
	e.produceN(s, "m", 10) // with one worker, these run only if the hung one was abandoned
	within(t, col.done, "messages after the hung one")
	require.NoError(t, sess.stop(t))

	st := c.Stats()
	require.EqualValues(t, 1, st.Abandoned)
	xs, err := c.db().ExceptionStates(context.Background())
	require.NoError(t, err)
	require.Len(t, xs, 1)
	require.Equal(t, "dead", xs[0].Status)
	require.Contains(t, xs[0].LastError, "handler timed out after 20ms")
	require.Contains(t, xs[0].LastError, "abandoned")
	require.Contains(t, e.logs.Messages(0), "handlers still running after shutdown: they ignore their context and are left behind")
}

func TestTimeoutCancelsTheHandlerContext(t *testing.T) {
	_, s, c := setup(t, nil, "g", 0)
	sawDeadline := make(chan time.Duration, 1)
	sess := consume(t, c, func(ctx context.Context, o *order) error {
		meta, _ := MetaFromContext(ctx)
		sawDeadline <- meta.Timeout
		<-ctx.Done()
		return ctx.Err()
	}, fast())
	_, err := s.Produce(context.Background(), order{OrderID: "slow"}, &ProduceOptions{Message: &MessageOptions{
		Timeout: 30 * time.Millisecond, Retry: &RetryPolicy{MaxRetries: NoRetries}}})
	require.NoError(t, err)
	require.Equal(t, 30*time.Millisecond, within(t, sawDeadline, "the handler"))
	require.NoError(t, sess.stop(t))
	xs, err := c.db().ExceptionStates(context.Background())
	require.NoError(t, err)
	require.Len(t, xs, 1)
	require.Contains(t, xs[0].LastError, "handler timed out after 30ms")
	require.EqualValues(t, 1, c.Stats().TimedOut)
	require.Zero(t, c.Stats().Abandoned, "a handler that honours its context is not abandoned")
}

// A worker watches each message's deadline on a timer it reuses: a
// message that timed out leaves nothing behind that would time the next
// one out, and a handler that never looks at its context still gets one
// that reports the deadline once it has passed.
func TestAWorkersNextMessageIsNotTimedOutByTheLastOne(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	col := newCollector(10)
	var errAfter error
	timedOut := make(chan struct{})
	sess := consume(t, c, func(ctx context.Context, o *order) error {
		if o.OrderID == "slow" {
			<-ctx.Done()
			errAfter = ctx.Err()
			close(timedOut)
			return ctx.Err()
		}
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("no deadline")
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		col.add(o.OrderID)
		return nil
	}, &ConsumeOptions{BatchLimit: 20, MessageConcurrency: 1, ClaimPollRate: 5 * time.Millisecond})
	_, err := s.Produce(context.Background(), order{OrderID: "slow"}, &ProduceOptions{Message: &MessageOptions{
		Timeout: 30 * time.Millisecond, Retry: &RetryPolicy{MaxRetries: NoRetries}}})
	require.NoError(t, err)
	within(t, timedOut, "the slow handler's deadline")
	require.ErrorIs(t, errAfter, context.DeadlineExceeded)
	e.produceN(s, "m", 10) // the same single worker runs them, on the same timer
	within(t, col.done, "the messages after the timed-out one")
	require.NoError(t, sess.stop(t))
	require.EqualValues(t, 1, c.Stats().TimedOut, "only the slow message timed out")
	xs, err := c.db().ExceptionStates(context.Background())
	require.NoError(t, err)
	require.Len(t, xs, 1)
}

// A handler's context, and a context derived from it, end when the
// session's stop runs out of its shutdown budget, long before the
// message's deadline.
func TestAStoppingSessionEndsTheHandlersContext(t *testing.T) {
	_, s, c := setup(t, nil, "g", 0)
	started := make(chan struct{})
	ended := make(chan error, 1)
	sess := consume(t, c, func(ctx context.Context, o *order) error {
		derived, cancel := context.WithCancel(ctx)
		defer cancel()
		close(started)
		<-derived.Done()
		ended <- ctx.Err()
		return ctx.Err()
	}, &ConsumeOptions{ClaimPollRate: 5 * time.Millisecond, ShutdownTimeout: 100 * time.Millisecond})
	_, err := s.Produce(context.Background(), order{OrderID: "long"}, &ProduceOptions{Message: &MessageOptions{Timeout: time.Hour}})
	require.NoError(t, err)
	within(t, started, "the handler")
	require.NoError(t, sess.stop(t))
	require.ErrorIs(t, within(t, ended, "the handler's context to end"), context.Canceled)
	require.Zero(t, c.Stats().TimedOut)
}

// A stop whose handler ignores its context, far from its deadline, returns
// within its budget, leaves the handler behind (logged), and loses nothing:
// the message goes to the next session. (Decision 0055 tried running
// handlers on the workers' goroutines, where this needed a watchdog.)
func TestAStopDoesNotWaitForAHandlerThatIgnoresItsContext(t *testing.T) {
	e, s, c := setup(t, nil, "g", 0)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	started := make(chan struct{}, 1)
	sess := consume(t, c, func(ctx context.Context, o *order) error {
		started <- struct{}{}
		<-release // ignores ctx
		return nil
	}, &ConsumeOptions{MessageConcurrency: 1, ClaimPollRate: 5 * time.Millisecond, ShutdownTimeout: 100 * time.Millisecond})
	_, err := s.Produce(context.Background(), order{OrderID: "stuck"}, &ProduceOptions{Message: &MessageOptions{Timeout: time.Hour}})
	require.NoError(t, err)
	within(t, started, "the handler")
	require.NoError(t, sess.stop(t))
	require.Contains(t, e.logs.Messages(0), "handlers still running after shutdown: they ignore their context and are left behind")
	require.Zero(t, c.Stats().Abandoned, "a stop gives up on handlers without counting them abandoned")

	once.Do(func() { close(release) })
	again := make(chan string, 1)
	sess = consume(t, c, func(ctx context.Context, o *order) error {
		select {
		case again <- o.OrderID:
		default:
		}
		return nil
	}, fast())
	require.Equal(t, "stuck", within(t, again, "the message, in the next session"))
	require.NoError(t, sess.stop(t))
}

func TestKeyedConcurrencyNeedsAKey(t *testing.T) {
	e := newEnv(t, nil)
	s := e.stream("orders")
	_, err := s.Produce(context.Background(), order{}, &ProduceOptions{Message: &MessageOptions{Concurrency: Exclusive}})
	require.ErrorIs(t, err, ErrInvalidKey)
	require.Contains(t, err.Error(), "exclusive")
	_, err = s.Produce(context.Background(), order{}, &ProduceOptions{Message: &MessageOptions{Concurrency: "sometimes"}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = s.Consumer("g").Register(context.Background(), &ConsumerConfig{ConcurrencyOverride: "sometimes"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Zero(t, e.count(s))
}
