package handlerctx

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/stretchr/testify/require"
)

// closed waits for ch to close, failing after a real-time bound (a signal
// awaited, not a sleep: the closing goroutine may not have run yet).
func closed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not done", what)
	}
}

func open(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: done too early", what)
	default:
	}
}

func newMock() *clocks.Mock {
	m := clocks.NewMock()
	m.Set(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
	return m
}

// Without Done ever called, Err reads the deadline off the clock and keeps
// what it found: a parent canceled later does not change it.
func TestErrFollowsTheDeadlineWithoutDone(t *testing.T) {
	m := newMock()
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := New(parent, m, m.Now(), time.Second)
	d, ok := c.Deadline()
	require.True(t, ok)
	require.Equal(t, m.Now().Add(time.Second), d)
	require.NoError(t, c.Err())
	m.Add(999 * time.Millisecond)
	require.NoError(t, c.Err())
	m.Add(time.Millisecond)
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	cancel()
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded, "Err never changes once set")
	closed(t, c.Done(), "Done after the deadline")
	c.End()
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
}

// Done, once asked for, closes at the deadline on the clock.
func TestDoneClosesAtTheDeadline(t *testing.T) {
	m := newMock()
	c := New(context.Background(), m, m.Now(), time.Second)
	done := c.Done()
	open(t, done, "before the deadline")
	require.NoError(t, c.Err())
	m.Add(time.Second)
	closed(t, done, "at the deadline")
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	require.Equal(t, done, c.Done(), "the same channel every time")
}

// A parent's cancellation reaches the context, with the parent's error,
// whether or not Done was asked for first.
func TestTheParentsCancellationEndsIt(t *testing.T) {
	m := newMock()
	for _, doneFirst := range []bool{true, false} {
		parent, cancel := context.WithCancelCause(context.Background())
		c := New(parent, m, m.Now(), time.Hour)
		var done <-chan struct{}
		if doneFirst {
			done = c.Done()
			open(t, done, "before the parent's cancel")
		}
		cancel(errors.New("stopping"))
		if !doneFirst {
			require.ErrorIs(t, c.Err(), context.Canceled)
			done = c.Done()
		}
		closed(t, done, "after the parent's cancel")
		require.ErrorIs(t, c.Err(), context.Canceled)
	}
}

// End is the CancelFunc (Canceled), Expire the runner's own timer
// (DeadlineExceeded before the clock says so): Done closes, whether built
// before or after, and neither a later deadline nor the other call changes
// the error.
func TestEndAndExpire(t *testing.T) {
	for _, tc := range []struct {
		name      string
		end, then func(*Ctx)
		want      error
	}{
		{"End", (*Ctx).End, (*Ctx).Expire, context.Canceled},
		{"Expire", (*Ctx).Expire, (*Ctx).End, context.DeadlineExceeded},
	} {
		m := newMock()
		c := New(context.Background(), m, m.Now(), time.Hour)
		done := c.Done()
		tc.end(c)
		closed(t, done, tc.name)
		require.ErrorIs(t, c.Err(), tc.want, tc.name)
		m.Add(2 * time.Hour)
		tc.then(c)
		require.ErrorIs(t, c.Err(), tc.want, "%s: a deadline or a second call afterwards changes nothing", tc.name)

		c = New(context.Background(), m, m.Now(), time.Hour)
		tc.end(c)
		require.ErrorIs(t, c.Err(), tc.want, tc.name)
		closed(t, c.Done(), tc.name+": Done built afterwards")
	}
}

// A sooner deadline of the parent's is the context's.
func TestTheParentsSoonerDeadlineWins(t *testing.T) {
	m := newMock()
	parent, cancel := m.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c := New(parent, m, m.Now(), time.Hour)
	d, _ := c.Deadline()
	require.Equal(t, m.Now().Add(time.Second), d)
	m.Add(time.Second)
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
}

type key struct{}

// Values are the parent's; contexts derived from it end with it, and
// context.AfterFunc runs once it ends unless stopped.
func TestDerivedContextsAndAfterFuncs(t *testing.T) {
	m := newMock()
	parent := context.WithValue(context.Background(), key{}, "v")
	c := New(parent, m, m.Now(), time.Hour)
	require.Equal(t, "v", c.Value(key{}))

	child, cancelChild := context.WithCancel(c)
	defer cancelChild()
	timed, cancelTimed := context.WithTimeout(c, time.Hour)
	defer cancelTimed()
	ran := make(chan struct{})
	context.AfterFunc(c, func() { close(ran) })
	stopped := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
	require.True(t, stopped(), "stopped before the context ended")
	open(t, child.Done(), "a derived context before the end")

	c.End()
	closed(t, child.Done(), "a derived context")
	closed(t, timed.Done(), "a derived context with a deadline")
	require.ErrorIs(t, child.Err(), context.Canceled)
	closed(t, ran, "an AfterFunc")
	require.False(t, stopped(), "stop after the end")

	late := make(chan struct{})
	context.AfterFunc(c, func() { close(late) })
	closed(t, late, "an AfterFunc registered after the end")
}

// Done, Err, AfterFunc, End and Expire from many goroutines at once (run
// with -race): every observer sees one error, and Done closed.
func TestConcurrentUse(t *testing.T) {
	m := newMock()
	for range 50 {
		parent, cancel := context.WithCancel(context.Background())
		c := New(parent, m, m.Now(), time.Minute)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch i % 4 {
				case 0:
					<-c.Done()
					errs <- c.Err()
				case 1:
					context.AfterFunc(c, func() {})
					errs <- nil
				case 2:
					c.End()
					errs <- nil
				default:
					cancel()
					errs <- nil
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				require.ErrorIs(t, err, c.Err(), "Done's observers see the one error")
			}
		}
		require.Error(t, c.Err())
		closed(t, c.Done(), "after End or cancel")
		cancel()
	}
}
