package sqlstreams

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/stretchr/testify/require"
)

func TestHeadersTravelWithTheMessage(t *testing.T) {
	type seen struct {
		id      string
		attempt int
		headers Headers
	}
	var calls []seen
	st, s := newStepper(t, nil, func(o *order, attempt int) error {
		if o.OrderID == "retry" && attempt == 1 {
			return errors.New("once")
		}
		return nil
	})
	ctx := context.Background()
	trace := Headers{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
	_, err := s.Produce(ctx, order{OrderID: "plain"}, &ProduceOptions{Headers: trace})
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "retry"}, &ProduceOptions{Headers: Headers{"tenant": "globex"}})
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "keyed"}, &ProduceOptions{Headers: Headers{"tenant": "initech"}, IdempotencyKey: "k1"})
	require.NoError(t, err)
	tx, err := st.e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.ProduceBatch(ctx, []BatchItem[order]{{Msg: order{OrderID: "in-tx"}, Headers: Headers{"tenant": "umbrella"}},
		{Msg: order{OrderID: "none"}}}, &BatchOptions{Tx: tx})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	st.common.Handler = st.c.adapt(func(ctx context.Context, o *order) error {
		meta, _ := MetaFromContext(ctx)
		calls = append(calls, seen{o.OrderID, meta.Attempt, meta.Headers})
		if o.OrderID == "retry" && meta.Attempt == 1 {
			return errors.New("once")
		}
		return nil
	})
	st = newStepperFor(t, st.e, st.c, st.mock, st.common.Handler)
	require.Equal(t, 5, st.claimRange())
	st.mock.Add(DefaultBindingRetryInterval)
	require.Equal(t, 1, st.retry())
	got := map[string][]Headers{}
	for _, c := range calls {
		got[c.id] = append(got[c.id], c.headers)
	}
	require.Equal(t, []Headers{trace}, got["plain"])
	require.Equal(t, []Headers{{"tenant": "globex"}, {"tenant": "globex"}}, got["retry"], "the retry's attempt has them too")
	require.Equal(t, []Headers{{"tenant": "initech"}}, got["keyed"])
	require.Equal(t, []Headers{{"tenant": "umbrella"}}, got["in-tx"])
	require.Equal(t, []Headers{nil}, got["none"])
}

func TestBadHeadersAreRefusedNamingTheHeader(t *testing.T) {
	e := newEnv(t, nil)
	s := e.stream("orders")
	ctx := context.Background()
	many := Headers{}
	for i := range MaxHeaders + 1 {
		many[strings.Repeat("h", i+1)] = "v"
	}
	for name, c := range map[string]struct {
		h    Headers
		want string
	}{
		"empty name":   {Headers{"": "v"}, `header name ""`},
		"space":        {Headers{"trace parent": "v"}, `header name "trace parent": ASCII letters`},
		"long name":    {Headers{strings.Repeat("n", MaxHeaderNameBytes+1): "v"}, "1 to 128 bytes"},
		"long value":   {Headers{"big": strings.Repeat("v", MaxHeaderValueBytes+1)}, `header "big": a value of 1025 bytes`},
		"control char": {Headers{"secretive": "line\nbreak-s3cr3t"}, `header "secretive": its value holds a control character`},
		"too many":     {many, "33 headers, at most 32"},
	} {
		_, err := s.Produce(ctx, order{OrderID: "x"}, &ProduceOptions{Headers: c.h})
		require.ErrorIs(t, err, ErrInvalidHeader, name)
		require.ErrorContains(t, err, c.want, name)
		require.NotContains(t, err.Error(), "s3cr3t", "an error never carries a header's value")
	}
	require.Zero(t, e.count(s), "nothing was written")
}

// A reclaimed range's messages keep their headers too.
func TestHeadersSurviveAReclaim(t *testing.T) {
	st, s := newStepper(t, nil, func(*order, int) error { return nil })
	ctx := context.Background()
	_, err := s.Produce(ctx, order{OrderID: "x"}, &ProduceOptions{Headers: Headers{"tenant": "acme"}})
	require.NoError(t, err)
	args := store.ClaimParams{Owner: engine.NewID(), Limit: 10, Lease: time.Minute, Now: st.now()}
	r, ok, err := st.c.db().ClaimRange(ctx, args)
	require.NoError(t, err)
	require.True(t, ok)
	require.JSONEq(t, `{"tenant":"acme"}`, string(r.Messages[0].Headers))
	st.mock.Add(2 * time.Minute)
	args.Owner, args.Now = engine.NewID(), st.now()
	r, ok, err = st.c.db().ReclaimRange(ctx, args)
	require.NoError(t, err)
	require.True(t, ok)
	require.JSONEq(t, `{"tenant":"acme"}`, string(r.Messages[0].Headers))
}
