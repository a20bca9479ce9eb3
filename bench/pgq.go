package main

// The PgQ peer (-only pgq): PgQ, the PostgreSQL-native queue Skype ran at
// scale (Debian's postgresql-15-pgq3, loaded into the benchmark's database
// as the extension pgq). Its producer and consumer are SQL functions; there
// is no client library, so the harness calls them with pgx, as an
// application would, and plays pgqd's part (the ticker) itself.
//
// Producing: the same shape as sqlstreams' batched produce (4 connections,
// 100 events a call): SELECT pgq.insert_event(...) FROM unnest($2) is one
// statement and one transaction per call. A ticker goroutine calls
// pgq.ticker(queue) every pgqTickEvery while the backlog is produced (the
// queue's ticker_max_count and ticker_max_lag are set so that each call
// ticks when events arrived), which cuts the backlog into batches of about
// the events of one interval, as pgqd does every ticker_period.
//
// Consuming: one consumer per run (PgQ gives each consumer one reader; a
// second needs the separate cooperative-consumer package), registered
// before the backlog is produced (a PgQ consumer sees only events after its
// registration), so every run reads the same backlog: next_batch,
// get_batch_events, decode each event into an Order with the decoder
// sqlstreams' typed handlers use in the harness (benchDecoder), finish_batch.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	pgqQueue     = "bench_orders"
	pgqTickEvery = 50 * time.Millisecond // the harness's ticker interval while producing
	pgqTickCount = 1000                  // queue ticker_max_count: a tick is due after this many events
)

func (b *bench) pgqConfig() string {
	return fmt.Sprintf("extension pgq (Debian postgresql-15-pgq3) in the benchmark's database; queue %q with ticker_max_count %d, ticker_max_lag %s; "+
		"no pgqd: the harness calls pgq.ticker(queue) every %s while producing, then once more; "+
		"produce: %d connections, pgq.insert_event for %d events a statement (SELECT ... FROM unnest), each its own transaction; "+
		"consume: 1 consumer per run, registered before the backlog (%d events) is produced, next_batch / get_batch_events / "+
		"decode each ev_data into an Order with sqlstreams.FastJSON (the harness's typed handlers' decoder) / finish_batch",
		pgqQueue, pgqTickCount, pgqTickEvery, pgqTickEvery, produceWorkers, produceBatchLen, b.c.n)
}

// pgq runs the peer, or skips it with the reason when the extension is not
// installed.
func (b *bench) pgq(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgq"); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "58P01" || pe.Code == "0A000" || pe.Code == "42704") {
			fmt.Printf("pgq: skipped, the pgq extension is not installed on the server (%s); on Debian: apt-get install -y postgresql-15-pgq3\n", pe.Message)
			return nil
		}
		return fmt.Errorf("create extension pgq: %w", err)
	}
	defer func() { _, _ = b.pool.Exec(context.Background(), "DROP EXTENSION IF EXISTS pgq CASCADE") }()
	var version string
	if err := b.pool.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'pgq'").Scan(&version); err != nil {
		return err
	}
	cfg := b.pgqConfig()
	b.rep.peer("pgq", "PgQ "+version, nil, cfg)
	fmt.Printf("pgq %s: %s\n", version, cfg)
	produced := b.rep.throughput("pgq_produce", fmt.Sprintf("PgQ insert_event, %d events/statement, %d connections", produceBatchLen, produceWorkers), "msg/s")
	consumed := b.rep.throughput("pgq_consume", "PgQ consumer (1 reader), decode + finish_batch per batch", "msg/s")
	for r := 1; r <= b.c.runs; r++ {
		// A fresh queue per run: its produce is timed against an empty
		// queue, as each sqlstreams produce run starts a fresh stream.
		for _, q := range []string{
			"SELECT pgq.drop_queue($1, true) FROM pgq.queue WHERE queue_name = $1",
			"SELECT pgq.create_queue($1)",
		} {
			if _, err := b.pool.Exec(ctx, q, pgqQueue); err != nil {
				return fmt.Errorf("pgq queue: %w", err)
			}
		}
		for _, kv := range [][2]string{{"ticker_max_count", fmt.Sprint(pgqTickCount)}, {"ticker_max_lag", pgqTickEvery.String()}} {
			if _, err := b.pool.Exec(ctx, "SELECT pgq.set_queue_config($1, $2, $3)", pgqQueue, kv[0], kv[1]); err != nil {
				return fmt.Errorf("pgq queue config %s: %w", kv[0], err)
			}
		}
		consumer := fmt.Sprintf("bench_run%d", r)
		if _, err := b.pool.Exec(ctx, "SELECT pgq.register_consumer($1, $2)", pgqQueue, consumer); err != nil {
			return fmt.Errorf("pgq register_consumer: %w", err)
		}
		label := fmt.Sprintf("pgq produce run %d/%d", r, b.c.runs)
		if err := b.timedRun(ctx, produced, label, b.c.n, func() (float64, error) { return b.pgqProduce(ctx, label) }); err != nil {
			return err
		}
		label = fmt.Sprintf("pgq consume run %d/%d", r, b.c.runs)
		if err := b.timedRun(ctx, consumed, label, b.c.n, func() (float64, error) { return b.pgqConsume(ctx, consumer, label) }); err != nil {
			return err
		}
	}
	_, err := b.pool.Exec(ctx, "SELECT pgq.drop_queue($1, true)", pgqQueue)
	return err
}

// pgqProduce inserts n events from produceWorkers connections while a ticker
// goroutine ticks the queue; it returns events per second.
func (b *bench) pgqProduce(ctx context.Context, label string) (float64, error) {
	n := b.c.n
	var done atomic.Int64
	stop := progress(label, "msgs", int64(n), &done)
	defer stop()
	tickCtx, stopTicks := context.WithCancel(ctx)
	ticks := make(chan error, 1)
	go func() { ticks <- b.pgqTicker(tickCtx) }()
	start := wall.Now()
	var wg sync.WaitGroup
	errs := make(chan error, produceWorkers)
	var next atomic.Int64
	payloads := make([]string, produceBatchLen)
	for i := range payloads {
		payloads[i] = string(payloadJSON)
	}
	for range produceWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(produceBatchLen) - produceBatchLen
				if lo >= int64(n) {
					return
				}
				k := min(int64(produceBatchLen), int64(n)-lo)
				if _, err := b.pool.Exec(ctx, "SELECT pgq.insert_event($1, 'order', d) FROM unnest($2::text[]) AS d", pgqQueue, payloads[:k]); err != nil {
					errs <- fmt.Errorf("pgq insert_event: %w", err)
					return
				}
				done.Add(k)
			}
		}()
	}
	wg.Wait()
	elapsed := wall.Since(start)
	stopTicks()
	tickErr := <-ticks
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if tickErr != nil {
		return 0, tickErr
	}
	// The last events' tick, not timed (pgqd would make it within its
	// period): the consumer's last batch ends there.
	if _, err := b.pool.Exec(ctx, "SELECT pgq.force_tick($1)", pgqQueue); err != nil {
		return 0, err
	}
	if _, err := b.pool.Exec(ctx, "SELECT pgq.ticker($1)", pgqQueue); err != nil {
		return 0, err
	}
	return report1(label, "msgs", n, elapsed), nil
}

// pgqTicker plays pgqd: pgq.ticker(queue) every pgqTickEvery until ctx ends.
func (b *bench) pgqTicker(ctx context.Context) error {
	t := wall.Ticker(pgqTickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		if _, err := b.pool.Exec(ctx, "SELECT pgq.ticker($1)", pgqQueue); err != nil && ctx.Err() == nil {
			return fmt.Errorf("pgq ticker: %w", err)
		}
	}
}

// pgqConsume reads the whole backlog as consumer on one connection, batch
// by batch, and returns events per second.
func (b *bench) pgqConsume(ctx context.Context, consumer, label string) (float64, error) {
	n := b.c.n
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var read atomic.Int64
	stop := progress(label, "msgs", int64(n), &read)
	defer stop()
	deadline := wall.Now().Add(burnTimeout)
	start := wall.Now()
	var o Order
	for read.Load() < int64(n) {
		if wall.Now().After(deadline) {
			return 0, fmt.Errorf("%s: timed out after %s with %d of %d read", label, burnTimeout, read.Load(), n)
		}
		var batch *int64
		if err := conn.QueryRow(ctx, "SELECT pgq.next_batch($1, $2)", pgqQueue, consumer).Scan(&batch); err != nil {
			return 0, fmt.Errorf("pgq next_batch: %w", err)
		}
		if batch == nil {
			return 0, fmt.Errorf("%s: no batch after %d of %d events (the last tick is missing)", label, read.Load(), n)
		}
		rows, err := conn.Query(ctx, "SELECT ev_data FROM pgq.get_batch_events($1)", *batch)
		if err != nil {
			return 0, fmt.Errorf("pgq get_batch_events: %w", err)
		}
		var k int64
		var data []byte
		_, err = pgx.ForEachRow(rows, []any{&data}, func() error {
			o = Order{}
			if err := (benchDecoder{}).Unmarshal(data, &o); err != nil {
				return err
			}
			k++
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("pgq batch %d: %w", *batch, err)
		}
		if _, err := conn.Exec(ctx, "SELECT pgq.finish_batch($1)", *batch); err != nil {
			return 0, fmt.Errorf("pgq finish_batch: %w", err)
		}
		read.Add(k)
	}
	elapsed := wall.Since(start)
	if got := read.Load(); got != int64(n) {
		return 0, fmt.Errorf("%s: read %d events, produced %d", label, got, n)
	}
	return report1(label, "msgs", n, elapsed), nil
}
