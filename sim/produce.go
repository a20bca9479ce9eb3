package sim

import (
	"context"
	"encoding/json"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
)

// The producers of a world: messages produced at once, or in transactions
// left open to commit later (out of order).

// Produce writes n messages in one transaction. conc "" is parallel; key
// and routing key may be empty.
func (w *World) Produce(ctx context.Context, n int, key string, conc policy.Concurrency, routingKey string) error {
	ms, err := w.produce(ctx, nil, n, key, conc, routingKey)
	if err != nil {
		return err
	}
	w.produced(ms)
	w.tracef("produce m%d..m%d key=%q %s rk=%q", ms[0].n, ms[len(ms)-1].n, key, orParallel(conc), routingKey)
	return nil
}

// openTx is a producer transaction held open across steps: its messages
// exist only when it commits, below positions handed out meanwhile.
type openTx struct {
	tx   pgx.Tx
	msgs []*message
}

// Begin produces n messages in a transaction it leaves open.
func (w *World) Begin(ctx context.Context, n int) error {
	tx, err := w.st.Pool().Begin(ctx)
	if err != nil {
		return err
	}
	ms, err := w.produce(ctx, tx, n, "", "", "")
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	w.open = append(w.open, &openTx{tx: tx, msgs: ms})
	w.tracef("produce m%d..m%d in a transaction left open", ms[0].n, ms[len(ms)-1].n)
	return nil
}

// Commit commits the oldest open producer transaction.
func (w *World) Commit(ctx context.Context) error {
	if len(w.open) == 0 {
		return nil
	}
	o := w.open[0]
	w.open = w.open[1:]
	if err := o.tx.Commit(ctx); err != nil {
		return err
	}
	w.produced(o.msgs)
	w.tracef("commit m%d..m%d", o.msgs[0].n, o.msgs[len(o.msgs)-1].n)
	return nil
}

// Close rolls back open producer transactions (their messages never existed).
func (w *World) Close(ctx context.Context) {
	for _, o := range w.open {
		_ = o.tx.Rollback(ctx)
	}
	w.open = nil
}

func (w *World) produced(ms []*message) {
	for _, m := range ms {
		w.msgs = append(w.msgs, m)
		w.byID[m.id] = m
	}
}

func (w *World) produce(ctx context.Context, q store.Querier, n int, key string, conc policy.Concurrency, routingKey string) ([]*message, error) {
	msgs := make([]store.NewMessage, n)
	var optDoc []byte
	if conc != "" {
		optDoc, _ = json.Marshal(policy.Options{Concurrency: conc})
	}
	first := w.nextMsg
	for i := range msgs {
		payload, _ := json.Marshal(map[string]int{"n": first + i})
		msgs[i] = store.NewMessage{Version: 1, RoutingKey: routingKey, Key: key, Payload: payload, Options: optDoc}
	}
	out, err := w.st.Produce(ctx, q, store.StreamRef{ID: w.streamID}, msgs, w.now())
	if err != nil { // simulated consumers poll: no wake-ups are sent
		return nil, err
	}
	w.nextMsg += n
	ms := make([]*message, len(out))
	for i, p := range out {
		ms[i] = &message{n: first + i, id: p.ID, key: key, routingKey: routingKey, conc: conc}
	}
	return ms, nil
}

func orParallel(c policy.Concurrency) policy.Concurrency {
	if c == "" {
		return policy.Parallel
	}
	return c
}
