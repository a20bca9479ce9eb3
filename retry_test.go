package sqlstreams

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

// stepper drives a group's two claimers through their step functions with a
// mock clock: no goroutines of ours, no real time.
type stepper struct {
	t      *testing.T
	e      *env
	c      *Consumer[order]
	mock   *clocks.Mock
	ranges *claimer.Actor
	exc    *claimer.ExceptionActor
	common claimer.Common
	stats  *claimer.Stats
	calls  []call
}

type call struct {
	id      string
	attempt int
	at      time.Time
}

func newStepper(t *testing.T, cfg *ConsumerConfig, h func(o *order, attempt int) error) (*stepper, *StreamHandle[order]) {
	t.Helper()
	mock := clocks.NewMock()
	mock.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, &ClientConfig{Clock: mock})
	s := e.stream("orders")
	c, err := s.Consumer("g").Register(context.Background(), cfg)
	require.NoError(t, err)
	var st *stepper
	st = newStepperFor(t, e, c, mock, c.adapt(func(ctx context.Context, o *order) error {
		meta, _ := MetaFromContext(ctx)
		st.calls = append(st.calls, call{id: o.OrderID, attempt: meta.Attempt, at: mock.Now()})
		return h(o, meta.Attempt)
	}))
	return st, s
}

// newStepperFor drives c's claimers with handler h, under the group config
// c was registered with.
func newStepperFor(t *testing.T, e *env, c *Consumer[order], mock *clocks.Mock, h claimer.Handler) *stepper {
	t.Helper()
	st := &stepper{t: t, e: e, c: c, mock: mock}
	common := e.common(c, mock, h)
	st.stats, st.common = common.Stats, common
	st.ranges = claimer.New(claimer.Config{Common: common, BatchLimit: 10, QueueSize: 20, StallAfter: time.Hour})
	ec := common
	ec.InstanceID = engine.NewID() // its own, as a session's exception claimer has
	st.exc = claimer.NewExceptionActor(claimer.ExceptionConfig{Common: ec})
	return st
}

// now is the mock clock's time as the database sees it.
func (st *stepper) now() store.Now { return engine.DBNow(st.mock)() }

// claimRange claims and runs one range to its commit.
func (st *stepper) claimRange() int {
	st.t.Helper()
	jobs, err := st.ranges.Claim(context.Background())
	require.NoError(st.t, err)
	return st.runAll(jobs)
}

// retry claims and runs the due exception rows; it returns how many ran.
func (st *stepper) retry() int {
	st.t.Helper()
	ctx := context.Background()
	jobs, err := st.exc.Claim(ctx)
	require.NoError(st.t, err)
	n := 0
	for ; len(jobs) > 0; n++ { // a chain's next row starts as the one before settles
		more, err := st.exc.Outcome(ctx, st.exc.Run(ctx, jobs[0]))
		require.NoError(st.t, err)
		jobs = append(jobs[1:], more...)
	}
	return n
}

// drainRanges claims and runs ranges until a claim finds nothing.
func (st *stepper) drainRanges() {
	st.t.Helper()
	for {
		jobs, err := st.ranges.Claim(context.Background())
		require.NoError(st.t, err)
		if len(jobs) == 0 {
			return
		}
		st.runAll(jobs)
	}
}

// runAll runs jobs and the jobs their outcomes release, to the end.
func (st *stepper) runAll(jobs []claimer.Job) int {
	st.t.Helper()
	ctx := context.Background()
	n := 0
	for len(jobs) > 0 {
		j := jobs[0]
		jobs = jobs[1:]
		more, err := st.ranges.Outcome(ctx, st.ranges.Run(ctx, j))
		require.NoError(st.t, err)
		jobs = append(jobs, more...)
		n++
	}
	return n
}

func (st *stepper) states() []store.ExceptionState {
	st.t.Helper()
	xs, err := st.c.db().ExceptionStates(context.Background())
	require.NoError(st.t, err)
	return xs
}

func TestRedriveBringsADeadLetterBack(t *testing.T) {
	fail := true
	st, s := newStepper(t, nil, func(*order, int) error {
		if fail {
			return Terminal(errors.New("bad"))
		}
		return nil
	})
	p, err := s.Produce(context.Background(), order{OrderID: "o1"}, nil)
	require.NoError(t, err)
	st.claimRange()
	require.Equal(t, "dead", st.states()[0].Status)

	fail = false
	ok, err := st.c.Redrive(context.Background(), p.ID+1000)
	require.NoError(t, err)
	require.False(t, ok, "only dead letters are redriven")
	ok, err = st.c.Redrive(context.Background(), p.ID)
	require.NoError(t, err)
	require.True(t, ok)
	xs := st.states()
	require.Equal(t, "pending", xs[0].Status)
	require.Zero(t, xs[0].Attempts, "back on the curve from attempt zero")
	require.Equal(t, 1, st.retry())
	require.Empty(t, st.states(), "a success deletes the row")
	require.Len(t, st.calls, 2)
	require.Equal(t, 1, st.calls[1].attempt, "a redriven message starts again at attempt 1")
}

// An unknown delivery-log mode is refused at Register (the modes
// themselves: the claimer's TestDeliveryLogModes).
func TestAnUnknownDeliveryLogModeIsRefused(t *testing.T) {
	_, err := newEnv(t, nil).stream("x").Consumer("g").Register(context.Background(), &ConsumerConfig{DeliveryLog: "verbose"})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
