package sqlstreams_test

import (
	"context"
	"fmt"
	"log"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

type PaymentRequestedV1 struct {
	OrderID string `json:"order_id"`
	Cents   int64  `json:"cents"`
}

func (PaymentRequestedV1) SchemaVersion() int { return 1 }

// databaseURL stands for your own connection string; it also clears the
// example's schema so the example runs the same every time.
func databaseURL() string {
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS example CASCADE"); err != nil {
		log.Fatal(err)
	}
	return pgtest.URL()
}

func Example() {
	ctx, stop := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, databaseURL())
	check(err)
	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Schema: "example"})
	check(err)

	payments := sqlstreams.Stream[PaymentRequestedV1](client, "payments.requested")
	check(payments.Register(ctx, nil))
	_, err = payments.Produce(ctx, PaymentRequestedV1{OrderID: "o-1", Cents: 1250},
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

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
