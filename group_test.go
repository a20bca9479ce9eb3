package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/c1702965/sqlstreams/internal/store/storetest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// groupCount is how many consumer groups the schema holds.
func (e *env) groupCount() int {
	e.t.Helper()
	gs, err := e.client.Groups(context.Background(), "")
	require.NoError(e.t, err)
	return len(gs)
}

func TestGroupHandleCreatesNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	_, err := e.client.Group(ctx, "orders", "billing")
	require.ErrorIs(t, err, ErrNotRegistered, "an unknown stream")
	require.ErrorContains(t, err, `"orders"`)

	s := e.stream("orders")
	_, err = e.client.Group(ctx, "orders", "biling")
	require.ErrorIs(t, err, ErrNotRegistered, "a mistyped group")
	require.ErrorContains(t, err, `"biling"`)
	require.Zero(t, e.groupCount(), "looking a group up created nothing")
	_, err = e.client.Groups(ctx, "ordres")
	require.ErrorIs(t, err, ErrNotRegistered)

	_, err = s.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	e.stream("refunds")
	_, err = e.client.Group(ctx, "refunds", "billing")
	require.ErrorIs(t, err, ErrGroupStream)
	_, err = e.client.Group(ctx, "orders", "bad name")
	require.ErrorIs(t, err, ErrInvalidName)

	g, err := e.client.Group(ctx, "orders", "billing")
	require.NoError(t, err)
	require.Equal(t, "billing", g.Name())
	require.Equal(t, "orders", g.Stream())
	require.Equal(t, 1, e.groupCount())

	streams, err := e.client.Streams(ctx)
	require.NoError(t, err)
	require.Len(t, streams, 2)
	require.Equal(t, "orders", streams[0].Name)
	require.Equal(t, []string{"billing"}, streams[0].Groups)
	require.Equal(t, "refunds", streams[1].Name)
	require.Empty(t, streams[1].Groups)
	gs, err := e.client.Groups(ctx, "refunds")
	require.NoError(t, err)
	require.Empty(t, gs)
}

func TestGroupStatusReportsLagOldestAgeAndDeadLetters(t *testing.T) {
	st, s := newStepper(t, nil, func(o *order, _ int) error {
		if o.OrderID == "bad" {
			return Terminal(errors.New("card stolen"))
		}
		return nil
	})
	ctx := context.Background()
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)

	empty, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, empty.Lag)
	require.Zero(t, empty.Head)
	require.True(t, empty.OldestUnconsumed.IsZero())

	produced := st.mock.Now()
	var last Produced
	for _, id := range []string{"a", "bad", "c", "d"} {
		last, err = s.Produce(ctx, order{OrderID: id}, nil)
		require.NoError(t, err)
	}
	st.mock.Add(90 * time.Second)
	before, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, before.Lag, "four messages after the committed position")
	require.EqualValues(t, 4, before.Available)
	require.False(t, before.Estimated)
	require.Equal(t, last.ID, before.Head.ID)
	require.True(t, before.OldestUnconsumed.Equal(produced), "%s vs %s", before.OldestUnconsumed, produced)
	require.Equal(t, 90*time.Second, before.OldestAge)

	// Past its bound the count is an estimate, and says so.
	capped, err := g.status(ctx, 3)
	require.NoError(t, err)
	require.EqualValues(t, 4, capped.Lag, "3 counted, 1 estimated from the ids")
	require.True(t, capped.Estimated)

	require.Equal(t, 4, st.claimRange())
	after, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, after.Lag, "a dead letter does not hold the committed position back")
	require.Equal(t, last.ID, after.Committed.ID)
	require.EqualValues(t, 1, after.Dead)
	require.Zero(t, after.Retrying)
	require.Zero(t, after.InFlight)
	require.True(t, after.OldestUnconsumed.IsZero())

	dead, err := g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	d, err := g.DeadLetter(ctx, dead[0].MessageID)
	require.NoError(t, err)
	require.Contains(t, d.LastError, "card stolen")
	require.JSONEq(t, `{"order_id":"bad","amount":0}`, string(d.Payload))
	require.Len(t, d.Deliveries, 1, "the failures delivery log recorded the attempt")
	require.Equal(t, 1, d.Deliveries[0].Attempt)
	_, err = g.DeadLetter(ctx, last.ID)
	require.ErrorIs(t, err, ErrNotRegistered, "a settled message is not a dead letter")

	ok, err := g.Redrive(ctx, dead[0].MessageID)
	require.NoError(t, err)
	require.True(t, ok)
	redriven, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, redriven.Dead)
	require.EqualValues(t, 1, redriven.Retrying)
	require.EqualValues(t, 1, redriven.Lag, "the redriven message is left to handle, and only it")
}

func TestGroupStatusListsLiveMembers(t *testing.T) {
	st, _ := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	in, _ := st.e.incumbent(t, st.c, st.mock, nil)
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	s, err := g.Status(ctx)
	require.NoError(t, err)
	require.Len(t, s.Members, 1)
	require.Equal(t, []string{in.id}, s.Members[0].Instances)
	require.True(t, s.Members[0].Live)
	st.mock.Add(time.Minute)
	s, err = g.Status(ctx)
	require.NoError(t, err)
	require.Empty(t, s.Members, "a lapsed instance is not live")
}

// readOnlyClient is a client whose every connection is in READ ONLY mode
// (default_transaction_read_only): any write it attempts fails.
func readOnlyClient(t *testing.T, e *env) *Client {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c, err := NewClient(context.Background(), pool, &ClientConfig{Schema: e.client.Schema(), DisableMigrate: true,
		Clock: e.client.cfg.Clock, Logger: e.client.cfg.Logger})
	require.NoError(t, err)
	return c
}

func TestReadMethodsNeverWrite(t *testing.T) {
	st, s := newStepper(t, &ConsumerConfig{Bindings: []string{"orders.#"}}, func(*order, int) error {
		return Terminal(errors.New("no"))
	})
	ctx := context.Background()
	_, err := s.Produce(ctx, order{OrderID: "x"}, &ProduceOptions{RoutingKey: "orders.eu"})
	require.NoError(t, err)
	st.claimRange()
	ro := readOnlyClient(t, st.e)

	_, err = ro.Streams(ctx)
	require.NoError(t, err)
	_, err = ro.Groups(ctx, "orders")
	require.NoError(t, err)
	g, err := ro.Group(ctx, "orders", "g")
	require.NoError(t, err)
	status, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, status.Dead)
	_, err = g.Inspect(ctx)
	require.NoError(t, err)
	_, err = g.Bindings(ctx, 0)
	require.NoError(t, err)
	dead, err := g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	_, err = g.DeadLetter(ctx, dead[0].MessageID)
	require.NoError(t, err)
	dry, err := g.Seek(ctx, SeekBeginning(), &SeekOptions{DryRun: true})
	require.NoError(t, err, "a dry run is a read")
	require.EqualValues(t, 1, dry.Dead)

	// The pool really is read-only: an action fails on it.
	_, err = g.Redrive(ctx, dead[0].MessageID)
	require.ErrorContains(t, err, "read-only transaction")
}

func TestSeekIsRefusedWhileTheGroupIsLive(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	st.e.produceN(s, "m", 3)
	st.claimRange()
	st.e.incumbent(t, st.c, st.mock, nil)
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	before, err := g.Status(ctx)
	require.NoError(t, err)
	for _, dry := range []bool{true, false} {
		_, err = g.Seek(ctx, SeekBeginning(), &SeekOptions{DryRun: dry})
		require.ErrorIs(t, err, ErrGroupActive)
		require.ErrorContains(t, err, "1 live instance")
	}
	after, err := g.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Cursor, after.Cursor, "nothing moved")

	st.mock.Add(time.Minute) // the instance lapses
	res, err := g.Seek(ctx, SeekBeginning(), nil)
	require.NoError(t, err)
	require.Zero(t, res.After.ID, "before message 1")
	replay, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, replay.Lag)
	require.Equal(t, 3, st.claimRange(), "every message is delivered again")
}

func TestSeekTargets(t *testing.T) {
	st, s := newStepper(t, nil, func(o *order, _ int) error {
		if strings.HasPrefix(o.OrderID, "dead") {
			return Terminal(errors.New("no"))
		}
		return nil
	})
	ctx := context.Background()
	g, err := st.e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	var ids []Produced
	for i, id := range []string{"a", "dead1", "c", "d"} {
		if i == 2 {
			st.mock.Add(time.Hour)
		}
		p, err := s.Produce(ctx, order{OrderID: id}, nil)
		require.NoError(t, err)
		ids = append(ids, p)
	}
	cut := st.mock.Now()
	require.Equal(t, 4, st.claimRange())

	// A dry run moves nothing and reports what would go.
	dry, err := g.Seek(ctx, SeekBeginning(), &SeekOptions{DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Equal(t, ids[3].ID, dry.BeforeCursor.ID)
	require.Equal(t, ids[0].ID-1, dry.After.ID)
	require.EqualValues(t, 1, dry.Dead, "the dead letter after the target would be dropped")
	s1, err := g.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, ids[3].ID, s1.Cursor.ID)
	require.EqualValues(t, 1, s1.Dead)

	// To a time: the first message produced at or after it.
	res, err := g.Seek(ctx, SeekTime(cut), nil)
	require.NoError(t, err)
	require.Equal(t, ids[2].ID-1, res.After.ID)
	require.Zero(t, res.Dead, "the dead letter is before the target and stays")
	s2, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, s2.Lag)
	require.EqualValues(t, 1, s2.Dead)

	// To a message id: delivered again from there, its dead letter dropped.
	res, err = g.Seek(ctx, SeekID(ids[1].ID), nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Dead)
	require.Equal(t, 3, st.claimRange())
	s3, err := g.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, s3.Dead, "dead again, once")

	// To the head: nothing left.
	st.e.produceN(s, "later", 2)
	_, err = g.Seek(ctx, SeekHead(), nil)
	require.NoError(t, err)
	s4, err := g.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, s4.Lag)
	require.Zero(t, st.claimRange())

	// Targets outside the log are refused, and bad ones are errors.
	_, err = g.Seek(ctx, SeekID(ids[3].ID+100), nil)
	require.ErrorIs(t, err, ErrSeekTarget)
	require.ErrorContains(t, err, "has not been produced")
	require.NoError(t, storetest.DeleteLogBelow(ctx, st.e.client.store, st.c.group.StreamID, ids[1].ID))
	_, err = g.Seek(ctx, SeekID(ids[0].ID), nil)
	require.ErrorIs(t, err, ErrSeekTarget)
	require.ErrorContains(t, err, "before the retained log")
	_, err = g.Seek(ctx, SeekID(0), nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = g.Seek(ctx, SeekTo{}, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestDeclareRoundTripsWhatInspectShows(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	cfg := &ConsumerConfig{Message: &MessageOptions{Timeout: 10 * time.Second, Retry: &RetryPolicy{MaxRetries: 3, BaseDelay: 2 * time.Second}},
		MessageMax: &MessageOptions{Timeout: time.Minute}, ConcurrencyOverride: Exclusive, ExceptionInitialBackoff: 3 * time.Second,
		MaxRangeReclaims: 2, DeliveryLog: DeliveryLogAll, Bindings: []string{"orders.#"}}
	_, err := s.Consumer("g").Register(ctx, cfg)
	require.NoError(t, err)
	g, err := e.client.Group(ctx, "orders", "g")
	require.NoError(t, err)
	in, err := g.Inspect(ctx)
	require.NoError(t, err)
	doc, err := json.Marshal(in.Config)
	require.NoError(t, err)
	require.JSONEq(t, `{"message":{"timeout":"10s","retry":{"max_retries":3,"base_delay":"2s"}},
		"message_max":{"timeout":"1m0s"},"concurrency_override":"exclusive","exception_initial_backoff":"3s",
		"max_range_reclaims":2,"delivery_log":"all","bindings":["orders.#"]}`, string(doc))

	var back ConsumerConfig
	require.NoError(t, json.Unmarshal(doc, &back))
	d, err := g.Declare(ctx, back)
	require.NoError(t, err)
	require.Empty(t, d.Changes, "what Inspect shows declares as no change")
	require.Empty(t, sql0059(e))

	back.Message.Timeout = 20 * time.Second
	back.Bindings = nil // left as it is
	d, err = g.Declare(ctx, back)
	require.NoError(t, err)
	require.Len(t, d.Changes, 1)
	require.Contains(t, d.Changes[0], "message.timeout")
	require.NotEmpty(t, sql0059(e))
	in, err = g.Inspect(ctx)
	require.NoError(t, err)
	require.Equal(t, 20*time.Second, in.Config.Message.Timeout)
	require.Equal(t, []string{"orders.#"}, in.Config.Bindings, "the binding set did not change")

	back.Bindings = []string{"orders.eu"}
	_, err = g.Declare(ctx, back)
	require.ErrorIs(t, err, ErrBindingsChange)
	back.Bindings = nil
	back.Message.Timeout = -time.Second
	_, err = g.Declare(ctx, back)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestConsumerConfigDocumentIsStrict(t *testing.T) {
	for doc, want := range map[string]string{
		`{"messge":{}}`: `unknown field "messge"`,
		`{"message":{"timeout":"1s","retries":3}}`:       `message: json: unknown field "retries"`,
		`{"message":{"retry":{"max_retry":1}}}`:          `unknown field "max_retry"`,
		`{"exception_initial_backoff":"soon"}`:           `exception_initial_backoff "soon"`,
		`{"message":{"timeout":"ten"}}`:                  `timeout`,
		`{"bindings":"orders.#"}`:                        `bindings`,
		`{"start":"beginning","max_range_reclaims":"2"}`: `max_range_reclaims`,
	} {
		var c ConsumerConfig
		err := json.Unmarshal([]byte(doc), &c)
		require.ErrorIs(t, err, ErrInvalidConfig, doc)
		require.ErrorContains(t, err, want, doc)
	}
}

// sql0059 lists the SQL0059 lines logged.
func sql0059(e *env) []string {
	var out []string
	for _, m := range e.logs.Messages(slog.LevelWarn) {
		if strings.HasPrefix(m, "SQL0059") {
			out = append(out, m)
		}
	}
	return out
}
