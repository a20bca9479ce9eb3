package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgcluster"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultDemoDuration = 10 * time.Second

type demoOptions struct {
	duration time.Duration
	rate     int
	schema   string
	backlog  int
}

// OrderPlaced is the demo's message type.
type OrderPlaced struct {
	OrderID  int64  `json:"order_id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

func (OrderPlaced) SchemaVersion() int { return 1 }

// connect returns a pool on SQLSTREAMS_DATABASE_URL, or on a private cluster
// it starts (and the func that stops it).
func connect(ctx context.Context, out io.Writer) (*pgxpool.Pool, func(), error) {
	url := os.Getenv("SQLSTREAMS_DATABASE_URL")
	stop := func() {}
	if url == "" {
		if _, err := pgcluster.FindBinaries(); err != nil {
			return nil, nil, err
		}
		fmt.Fprintln(out, "starting a private PostgreSQL (set SQLSTREAMS_DATABASE_URL to use your own)...")
		c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
		if err != nil {
			return nil, nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		url = c.URL("postgres")
		stop = func() {
			if err := c.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "stop PostgreSQL:", err)
			}
		}
		fmt.Fprintf(out, "PostgreSQL is up on 127.0.0.1:%d (removed when the demo ends)\n", c.Port())
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = 16
	// sqlstreams' statements are short; PostgreSQL's JIT compiles them once
	// a log holds millions of rows, at 25–190 ms a statement (decision 0013).
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return pool, func() { pool.Close(); stop() }, nil
}

// openClient is what the verbs that act on a user's database share: they
// need SQLSTREAMS_DATABASE_URL (a throwaway server would be pointless) and a
// client, whose creation migrates the schema. done closes the pool.
func openClient(ctx context.Context, out io.Writer, verb string, cfg *sqlstreams.ClientConfig) (client *sqlstreams.Client, done func(), err error) {
	if os.Getenv("SQLSTREAMS_DATABASE_URL") == "" {
		return nil, nil, fmt.Errorf("%s needs SQLSTREAMS_DATABASE_URL", verb)
	}
	pool, done, err := connect(ctx, out)
	if err != nil {
		return nil, nil, err
	}
	client, err = sqlstreams.NewClient(ctx, pool, cfg)
	if err != nil {
		done()
		return nil, nil, err
	}
	return client, done, nil
}

func migrate(ctx context.Context, out io.Writer, schema string) error {
	_, done, err := openClient(ctx, out, "migrate", &sqlstreams.ClientConfig{Schema: schema})
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "schema %s is up to date\n", schema)
	return nil
}

// manage runs the schema's maintenance workers (retention, pruning,
// schedules) the way Consume does by default, for deployments that run them
// apart from their consumers; it stops on SIGINT or SIGTERM.
func manage(ctx context.Context, out io.Writer, logger *slog.Logger, schema string, ttl time.Duration) error {
	client, done, err := openClient(ctx, out, "manager", &sqlstreams.ClientConfig{Schema: schema, Logger: logger})
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "manager running on schema %s (stop with Ctrl-C)\n", schema)
	if err := client.Manager().Run(ctx, &sqlstreams.ManagerOptions{InstanceTTL: ttl}); err != nil {
		return err
	}
	fmt.Fprintln(out, "manager stopped")
	return nil
}

// demo produces at a steady rate for a while and consumes with two instances
// of one group, printing a progress line and a summary.
func demo(ctx context.Context, out io.Writer, logger *slog.Logger, o demoOptions) error {
	if o.rate < 1 || o.duration <= 0 {
		return errors.New("demo: -rate and -duration must be positive")
	}
	pool, done, err := connect(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	clk := clock.New()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+o.schema+" CASCADE"); err != nil {
		return fmt.Errorf("reset demo schema: %w", err)
	}
	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Schema: o.schema, Logger: logger, Clock: clk})
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

	var produced, consumed atomic.Int64
	// A backlog first, so the two instances visibly burn it down.
	for sent := 0; sent < o.backlog; {
		n := min(1000, o.backlog-sent)
		items := make([]sqlstreams.BatchItem[OrderPlaced], n)
		for i := range items {
			id := int64(-(sent + i + 1))
			items[i] = sqlstreams.BatchItem[OrderPlaced]{Msg: OrderPlaced{OrderID: id, Customer: "backlog", Cents: 100}}
		}
		if _, err := orders.ProduceBatch(ctx, items, nil); err != nil {
			return err
		}
		sent += n
		produced.Add(int64(n))
	}
	if o.backlog > 0 {
		fmt.Fprintf(out, "produced a backlog of %d messages before starting the consumers\n", o.backlog)
	}
	var perInstance [2]atomic.Int64
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range perInstance {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- billing.Consume(cctx, func(ctx context.Context, m *OrderPlaced) error {
				consumed.Add(1)
				perInstance[i].Add(1)
				return nil
			}, &sqlstreams.ConsumeOptions{BatchLimit: 200, MessageConcurrency: 8, ClaimPollRate: 20 * time.Millisecond})
		}()
	}

	fmt.Fprintf(out, "producing %d msg/s to stream %q for %s; group %q runs 2 instances\n", o.rate, orders.Name(), o.duration, billing.Name())
	start := clk.Now()
	pctx, stopProducer := context.WithTimeout(ctx, o.duration)
	defer stopProducer()
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- produce(ctx, pctx.Done(), clk, orders, o.rate, &produced)
	}()

	tick := clk.Ticker(500 * time.Millisecond)
	defer tick.Stop()
	lastConsumed, lastAt := int64(0), start
	producerDone := pctx.Done()
	for {
		select {
		case <-ctx.Done():
			stopConsumers()
			wg.Wait()
			return ctx.Err()
		case <-producerDone:
			producerDone = nil
		case now := <-tick.C:
			p, c := produced.Load(), consumed.Load()
			rate := float64(c-lastConsumed) / now.Sub(lastAt).Seconds()
			lastConsumed, lastAt = c, now
			fmt.Fprintf(out, "%6.1fs  produced %7d  consumed %7d  backlog %6d  rate %7.0f msg/s\n",
				now.Sub(start).Seconds(), p, c, p-c, rate)
			if producerDone == nil && c >= p {
				stopConsumers()
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						return err
					}
				}
				elapsed := clk.Since(start)
				fmt.Fprintf(out, "\ndone: produced %d, consumed %d (instance 1: %d, instance 2: %d), lost %d, in %.1fs (%.0f msg/s end to end)\n",
					p, c, perInstance[0].Load(), perInstance[1].Load(), p-c, elapsed.Seconds(), float64(c)/elapsed.Seconds())
				st := billing.Stats()
				fmt.Fprintf(out, "ranges committed %d, failures %d, reclaims %d\n", st.Committed, st.Failed, st.Reclaimed)
				if c != p {
					return fmt.Errorf("consumed %d of %d", c, p)
				}
				return nil
			}
		}
	}
}

// produce sends batches every 50ms so the offered rate holds, until stop is
// closed. Each batch runs to its end under ctx (not under stop): a call cut
// off mid-flight may or may not have committed, and the count must be
// exact.
func produce(ctx context.Context, stop <-chan struct{}, clk clock.Clock, s *sqlstreams.StreamHandle[OrderPlaced], rate int, produced *atomic.Int64) error {
	tick := clk.Ticker(50 * time.Millisecond)
	defer tick.Stop()
	start := clk.Now()
	var id int64
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			due := int64(now.Sub(start).Seconds()*float64(rate)) - id
			if due <= 0 {
				continue
			}
			items := make([]sqlstreams.BatchItem[OrderPlaced], due)
			for i := range items {
				id++
				items[i] = sqlstreams.BatchItem[OrderPlaced]{
					Msg:        OrderPlaced{OrderID: id, Customer: fmt.Sprintf("cust-%d", id%97), Cents: 100 + id%5000},
					RoutingKey: "orders.eu", Key: fmt.Sprintf("cust-%d", id%97),
				}
			}
			if _, err := s.ProduceBatch(ctx, items, nil); err != nil {
				if ctx.Err() != nil {
					return nil // interrupted: the run ends without a verdict
				}
				return err
			}
			produced.Add(due)
		}
	}
}
