package sqlstreams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type PaymentRequestedV1 struct {
	OrderID string `json:"order_id"`
	Cents   int64  `json:"cents"`
}

func (PaymentRequestedV1) SchemaVersion() int { return 1 }

// connect is what your program does once: a pool on your database,
// configured as sqlstreams recommends (ConfigurePool: JIT off, decision
// 0013, and a larger read buffer, decision 0059), and a client on a schema.
// The examples each use a schema of their own, emptied first so that they
// print the same every time.
func connect(schema string) *sqlstreams.Client {
	client, _ := connectPool(schema)
	return client
}

// connectPool is connect, also returning the pool, for an example that
// makes tables of its own.
func connectPool(schema string) (*sqlstreams.Client, *pgxpool.Pool) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("SQLSTREAMS_DATABASE_URL"))
	check(err)
	sqlstreams.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	_, err = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	check(err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // the examples' output is their prints
	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Schema: schema, Logger: quiet})
	check(err)
	return client, pool
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// Produce a message and consume it. Consume blocks until its context
// ends; a service runs it until SIGTERM (see examples/quickstart).
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	client := connect("example_quick")

	payments := sqlstreams.Stream[PaymentRequestedV1](client, "payments.requested")
	check(payments.Register(ctx, nil))
	_, err := payments.Produce(ctx, PaymentRequestedV1{OrderID: "o-1", Cents: 1250},
		&sqlstreams.ProduceOptions{RoutingKey: "payments.card.eu", Key: "customer-7"})
	check(err)

	charge, err := payments.Consumer("charge-cards").Register(ctx, nil)
	check(err)
	err = charge.Consume(ctx, func(ctx context.Context, p *PaymentRequestedV1) error {
		fmt.Printf("charging %s: %d cents\n", p.OrderID, p.Cents)
		stop() // a real service runs until it is told to stop
		return nil
	}, &sqlstreams.ConsumeOptions{BatchLimit: 20})
	check(err)
	// Output: charging o-1: 1250 cents
}

type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
}

// A group with bindings receives only the messages whose routing key
// matches one of its patterns (AMQP topic syntax: '*' is one word, '#' zero
// or more). Routing keys are dot-separated words of letters, digits, '_'
// and '-'.
func Example_bindings() {
	ctx, stop := context.WithCancel(context.Background())
	client := connect("example_bindings")
	orders := sqlstreams.Stream[OrderPlaced](client, "orders")
	check(orders.Register(ctx, nil))
	euBilling, err := orders.Consumer("eu-billing").Register(ctx, &sqlstreams.ConsumerConfig{
		Bindings: []string{"orders.eu.#"},
	})
	check(err)
	for i, rk := range []string{"orders.eu.fr", "orders.us.ny", "orders.eu.de.berlin"} {
		_, err := orders.Produce(ctx, OrderPlaced{OrderID: fmt.Sprint("o-", i)}, &sqlstreams.ProduceOptions{RoutingKey: rk})
		check(err)
	}
	var mu sync.Mutex
	var got []string
	check(euBilling.Consume(ctx, func(ctx context.Context, o *OrderPlaced) error {
		meta, _ := sqlstreams.MetaFromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, o.OrderID+" "+meta.RoutingKey)
		if len(got) == 2 {
			stop()
		}
		return nil
	}, nil))
	slices.Sort(got)
	fmt.Println(got)
	// Output: [o-0 orders.eu.fr o-2 orders.eu.de.berlin]
}

// Messages with a key can be Exclusive (at most one of the key's messages
// in flight across every instance of the group) or Ordered (exclusive, and
// in log order). A producer sets it per message; to make a whole group
// exclusive, whatever its producers set, declare ConcurrencyOverride: it
// replaces every message's Concurrency. Messages without a key are never
// held back.
func Example_keys() {
	ctx, stop := context.WithCancel(context.Background())
	client := connect("example_keys")
	orders := sqlstreams.Stream[OrderPlaced](client, "orders")
	check(orders.Register(ctx, nil))
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		_, err := orders.Produce(ctx, OrderPlaced{OrderID: id, Customer: "c-7"}, &sqlstreams.ProduceOptions{
			Key:     "c-7",
			Message: &sqlstreams.MessageOptions{Concurrency: sqlstreams.Ordered},
		})
		check(err)
	}
	// The recommended way to make a whole group one-at-a-time per key:
	//   &sqlstreams.ConsumerConfig{ConcurrencyOverride: sqlstreams.Exclusive}
	shipping, err := orders.Consumer("shipping").Register(ctx, nil)
	check(err)
	n := 0
	check(shipping.Consume(ctx, func(ctx context.Context, o *OrderPlaced) error {
		fmt.Println("shipping", o.OrderID, "for", o.Customer) // one at a time, in log order
		if n++; n == 3 {
			stop()
		}
		return nil
	}, &sqlstreams.ConsumeOptions{MessageConcurrency: 4}))
	// Output:
	// shipping o-1 for c-7
	// shipping o-2 for c-7
	// shipping o-3 for c-7
}

// A handler's error is retried on the message's curve; Terminal (or running
// out of retries) makes the message a dead letter of the group. Dead
// letters can be listed, inspected and redriven (put back on the curve from
// attempt zero), here or with `sqlstreams dlq`.
func Example_deadLetters() {
	ctx, stop := context.WithCancel(context.Background())
	client := connect("example_dead")
	payments := sqlstreams.Stream[PaymentRequestedV1](client, "payments")
	check(payments.Register(ctx, nil))
	charge, err := payments.Consumer("charge").Register(ctx, nil)
	check(err)
	_, err = payments.Produce(ctx, PaymentRequestedV1{OrderID: "o-9", Cents: -5}, nil)
	check(err)
	check(charge.Consume(ctx, func(ctx context.Context, p *PaymentRequestedV1) error {
		defer stop()
		return sqlstreams.Terminal(errors.New("negative amount"))
	}, nil))

	dead, err := charge.DeadLetters(context.Background(), 0, 100)
	check(err)
	for _, d := range dead {
		fmt.Printf("dead: message %d after %d attempt(s): %s\n", d.MessageID, d.Attempts, d.LastError)
		ok, err := charge.Redrive(context.Background(), d.MessageID)
		check(err)
		fmt.Println("redriven:", ok)
	}
	// The redriven message runs again; this time the handler accepts it.
	ctx, stop = context.WithCancel(context.Background())
	check(charge.Consume(ctx, func(ctx context.Context, p *PaymentRequestedV1) error {
		meta, _ := sqlstreams.MetaFromContext(ctx)
		fmt.Printf("retried %s, attempt %d\n", p.OrderID, meta.Attempt)
		stop()
		return nil
	}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond}))
	// Output:
	// dead: message 1 after 1 attempt(s): terminal: negative amount
	// redriven: true
	// retried o-9, attempt 1
}

// A group's config is declared by Register and stored on the group: the
// newest declaration wins (a changed one is logged, SQL0059, naming each
// field), and running instances pick it up within ConfigRefreshInterval.
// Inspect shows what is in effect and where each value comes from.
func Example_redeclare() {
	ctx := context.Background()
	client := connect("example_redeclare")
	orders := sqlstreams.Stream[OrderPlaced](client, "orders")
	check(orders.Register(ctx, nil))
	_, err := orders.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{
		Message: &sqlstreams.MessageOptions{Timeout: 10 * time.Second},
	})
	check(err)
	// A later deploy declares a longer timeout and a retry ceiling.
	billing, err := orders.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{
		Message:    &sqlstreams.MessageOptions{Timeout: 20 * time.Second},
		MessageMax: &sqlstreams.MessageOptions{Retry: &sqlstreams.RetryPolicy{MaxRetries: 3}},
	})
	check(err)
	in, err := billing.Inspect(ctx)
	check(err)
	for _, s := range in.Effective {
		if s.Field == "message.timeout" || s.Field == "message.retry.max_retries" {
			fmt.Println(s.Field, s.Value, s.Source)
		}
	}
	// Output:
	// message.timeout 20s declared
	// message.retry.max_retries 3 clamped
}

type DailyReport struct {
	Kind string `json:"kind"`
}

// A schedule produces its payload to a stream at each due time of a cron
// expression, exactly once across the fleet (the manager's scheduler worker
// does it; every Consume session runs a manager unless told not to).
func Example_schedule() {
	ctx := context.Background()
	client := connect("example_schedule")
	reports := sqlstreams.Stream[DailyReport](client, "reports")
	check(reports.Register(ctx, nil))
	check(client.Scheduler("daily-sales").Register(ctx, "reports", "0 6 * * 1-5", DailyReport{Kind: "sales"},
		&sqlstreams.SchedulerConfig{Zone: "Europe/Paris"}))
	schedules, err := client.Schedules(ctx)
	check(err)
	for _, s := range schedules {
		fmt.Println(s.Name, "→", s.Stream, s.Expression, s.Zone)
	}
	// Output: daily-sales → reports 0 6 * * 1-5 Europe/Paris
}

// An operator's view of a group needs no message type and writes nothing:
// Group's reads run in READ ONLY transactions, and an unknown name is
// ErrNotRegistered rather than a new group. `sqlstreams groups describe`
// prints the same.
func Example_groupStatus() {
	ctx := context.Background()
	client := connect("example_status")
	orders := sqlstreams.Stream[OrderPlaced](client, "orders")
	check(orders.Register(ctx, nil))
	_, err := orders.Consumer("billing").Register(ctx, nil)
	check(err)
	for i := range 3 {
		_, err := orders.Produce(ctx, OrderPlaced{OrderID: fmt.Sprint("o-", i)}, nil)
		check(err)
	}

	g, err := client.Group(ctx, "orders", "billing")
	check(err)
	st, err := g.Status(ctx)
	check(err)
	fmt.Printf("lag %d: available %d, in flight %d, retrying %d; dead %d; sessions %d\n",
		st.Lag, st.Available, st.InFlight, st.Retrying, st.Dead, len(st.Members))
	_, err = client.Group(ctx, "orders", "biling")
	fmt.Println(errors.Is(err, sqlstreams.ErrNotRegistered))
	// Output:
	// lag 3: available 3, in flight 0, retrying 0; dead 0; sessions 0
	// true
}

// Consumers decode payloads with the client's Decoder: StandardJSON
// (encoding/json, as producers encode) unless ClientConfig.Decoder says
// otherwise. Unknown fields are ignored, and a type mismatch is a
// *json.UnmarshalTypeError naming the field. FastJSON (go-json) is the
// faster opt-in, which differs from encoding/json at a few edges its
// comment lists.
func Example_decoder() {
	var ok PaymentRequestedV1
	err := sqlstreams.StandardJSON{}.Unmarshal([]byte(`{"order_id":"o-1","cents":1999,"note":"unknown field"}`), &ok)
	fmt.Println(ok, err)

	var bad PaymentRequestedV1
	err = sqlstreams.StandardJSON{}.Unmarshal([]byte(`{"order_id":"o-2","cents":"lots"}`), &bad)
	var mismatch *json.UnmarshalTypeError
	fmt.Println(errors.As(err, &mismatch), mismatch.Field)

	// go-json for every consumer of this client:
	cfg := &sqlstreams.ClientConfig{Decoder: sqlstreams.FastJSON{}}
	fmt.Println(cfg.Decoder.Unmarshal([]byte(`{"cents":5}`), &ok), ok.Cents)
	// Output:
	// {o-1 1999} <nil>
	// true cents
	// <nil> 5
}

type ReceiptIssuedV1 struct {
	OrderID string `json:"order_id"`
}

func (ReceiptIssuedV1) SchemaVersion() int { return 1 }

// A transactional handler: the row it writes, the message it produces to a
// second stream and its message's settlement commit together, exactly once,
// whatever happens to the process or the database between them.
func Example_transactional() {
	ctx, stop := context.WithCancel(context.Background())
	client, pool := connectPool("example_tx")
	payments := sqlstreams.Stream[PaymentRequestedV1](client, "payments.requested")
	check(payments.Register(ctx, nil))
	receipts := sqlstreams.Stream[ReceiptIssuedV1](client, "receipts.issued")
	check(receipts.Register(ctx, nil))
	_, err := pool.Exec(ctx, "CREATE TABLE example_tx.charges (order_id text PRIMARY KEY, cents bigint NOT NULL)")
	check(err)
	_, err = payments.Produce(ctx, PaymentRequestedV1{OrderID: "o-1", Cents: 1250}, nil)
	check(err)

	charge, err := payments.Consumer("charge-cards").Register(ctx, nil)
	check(err)
	err = charge.ConsumeTx(ctx, func(ctx context.Context, tx pgx.Tx, p *PaymentRequestedV1) error {
		if _, err := tx.Exec(ctx, "INSERT INTO example_tx.charges (order_id, cents) VALUES ($1, $2)", p.OrderID, p.Cents); err != nil {
			return err
		}
		if _, err := receipts.Produce(ctx, ReceiptIssuedV1{OrderID: p.OrderID}, &sqlstreams.ProduceOptions{Tx: tx}); err != nil {
			return err
		}
		fmt.Printf("charged %s in the transaction that settles it\n", p.OrderID)
		stop()
		return nil
	}, nil)
	check(err)
	var n int
	check(pool.QueryRow(context.Background(), "SELECT count(*) FROM example_tx.charges").Scan(&n))
	fmt.Println("charges:", n)
	// Output:
	// charged o-1 in the transaction that settles it
	// charges: 1
}
