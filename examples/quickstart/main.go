// Command quickstart is sqlstreams' quick start, a program to copy: it
// connects to SQLSTREAMS_DATABASE_URL, registers a stream and a consumer
// group, produces a few messages and consumes them, and stops gracefully on
// Ctrl-C or SIGTERM (or, here, once it has consumed what it produced).
//
//	SQLSTREAMS_DATABASE_URL=postgres://localhost/app go run ./examples/quickstart
//
// It is a tool for users: the README's usage section is its core.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OrderPlaced is the message. Its fields are its JSON document; its
// SchemaVersion lets consumers refuse a version they do not read.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

func (OrderPlaced) SchemaVersion() int { return 1 }

func main() {
	schema := flag.String("schema", "quickstart", "the schema sqlstreams keeps its tables in")
	n := flag.Int("n", 5, "messages to produce, then consume")
	flag.Parse()
	// Consume runs until its context ends: here, at Ctrl-C or SIGTERM.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("SQLSTREAMS_DATABASE_URL"), *schema, *n, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, schema string, n int, out io.Writer) error {
	if url == "" {
		return errors.New("set SQLSTREAMS_DATABASE_URL to a PostgreSQL database (postgres://user:pass@host/db)")
	}
	// One pool for the process, configured as sqlstreams recommends:
	// PostgreSQL's JIT off for its short statements (decision 0013) and a
	// larger read buffer a connection (decision 0059).
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	sqlstreams.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The client creates and migrates its schema (ClientConfig.DisableMigrate
	// if your role may not create tables).
	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Schema: schema})
	if err != nil {
		return err
	}
	orders := sqlstreams.Stream[OrderPlaced](client, "orders.placed")
	if err := orders.Register(ctx, nil); err != nil {
		return err
	}
	billing, err := orders.Consumer("billing").Register(ctx, nil)
	if err != nil {
		return err
	}

	for i := range n {
		// ProduceOptions.Tx produces inside your own transaction instead.
		if _, err := orders.Produce(ctx, OrderPlaced{OrderID: fmt.Sprint("o-", i+1), Customer: "c-7", Cents: 1250}, nil); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "produced %d orders\n", n)

	// Consume blocks until its context ends, then lets running handlers
	// finish (ShutdownTimeout) and returns nil. Run it on a goroutine of its
	// own, or as the last call of main. Many processes may run it for one
	// group: they share the work.
	cctx, done := context.WithCancel(ctx)
	defer done()
	var consumed atomic.Int64
	var mu sync.Mutex // handlers run concurrently (ConsumeOptions.MessageConcurrency, 10 by default)
	err = billing.Consume(cctx, func(ctx context.Context, o *OrderPlaced) error {
		mu.Lock()
		fmt.Fprintf(out, "billing %s: %d cents\n", o.OrderID, o.Cents)
		mu.Unlock()
		if consumed.Add(1) == int64(n) {
			done() // a service would run until SIGTERM; the quick start stops here
		}
		return nil // an error is retried on the message's curve, then dead-lettered
	}, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "consumed %d orders; stopped\n", consumed.Load())
	return nil
}
