package main

// The latency floor: what this machine's PostgreSQL gives a message that is
// inserted, committed and read back by a LISTENing connection on its NOTIFY,
// with no queue in between. The latency workload states sqlstreams' latency
// beside it, at the same offered loads, in the same run (issue 64): part of
// the tail is the disk's fsync and the server's notification path, which no
// queue on PostgreSQL can go below.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const floorSchema = `
DROP TABLE IF EXISTS bench_floor;
CREATE TABLE bench_floor (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sent_at  bigint NOT NULL,
    payload  json   NOT NULL
) WITH (fillfactor = 100);`

// latencyFloor inserts one row per message at rate per second for dur,
// each in its own transaction that also notifies its id (as a produce
// does), from the same number of senders as the latency workload; one
// LISTENing connection reads each row by id when its notification arrives
// and records the time since its sender started the insert.
func (b *bench) latencyFloor(ctx context.Context, rate int, dur time.Duration, label string) (latencyRun, error) {
	if _, err := b.pool.Exec(ctx, floorSchema); err != nil {
		return latencyRun{}, fmt.Errorf("%s: create table: %w", label, err)
	}
	listener, err := b.pool.Acquire(ctx)
	if err != nil {
		return latencyRun{}, err
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN bench_floor"); err != nil {
		return latencyRun{}, err
	}
	defer func() { _, _ = listener.Exec(context.WithoutCancel(ctx), "UNLISTEN bench_floor") }()

	total := int(float64(rate) * dur.Seconds())
	samples := make([]time.Duration, 0, total)
	var read atomic.Int64
	lctx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	listened := make(chan error, 1)
	go func() {
		conn := listener.Conn()
		for len(samples) < total {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				listened <- err
				return
			}
			id, err := strconv.ParseInt(n.Payload, 10, 64)
			if err != nil {
				listened <- fmt.Errorf("notification %q: %w", n.Payload, err)
				return
			}
			var sent int64
			if err := conn.QueryRow(lctx, "SELECT sent_at FROM bench_floor WHERE id = $1", id).Scan(&sent); err != nil {
				listened <- fmt.Errorf("read row %d: %w", id, err)
				return
			}
			samples = append(samples, wall.Since(time.Unix(0, sent)))
			read.Add(1)
		}
		listened <- nil
	}()

	stop := progress(label, "msgs", int64(total), &read)
	defer stop()
	payload := string(mustJSON(baseOrder))
	produceFor, err := paced(ctx, rate, total, func() error {
		_, err := b.pool.Exec(ctx, `WITH i AS (INSERT INTO bench_floor (sent_at, payload) VALUES ($1, $2) RETURNING id)
SELECT pg_notify('bench_floor', id::text) FROM i`, wall.Now().UnixNano(), payload)
		return err
	})
	if err != nil {
		return latencyRun{}, err
	}
	timeout := wall.Timer(30 * time.Second)
	defer timeout.Stop()
	select {
	case err := <-listened:
		if err != nil {
			return latencyRun{}, fmt.Errorf("%s: %w", label, err)
		}
	case <-timeout.C():
		stopListening()
		<-listened
		return latencyRun{}, fmt.Errorf("%s: %d of %d rows read 30s after the last insert", label, read.Load(), total)
	}
	return summarize(label, samples, float64(total)/produceFor.Seconds()), nil
}

// paced calls send total times at rate per second: a scheduler releases one
// call every 1/rate, and latencySenders goroutines share them so that one
// slow commit does not hold the schedule up. It returns how long the calls
// took to be made.
func paced(ctx context.Context, rate, total int, send func() error) (time.Duration, error) {
	due := make(chan struct{}, total)
	var wg sync.WaitGroup
	errs := make(chan error, latencySenders)
	for range latencySenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range due {
				if err := send(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	start := wall.Now()
	for i := range total {
		if w := start.Add(time.Duration(i) * interval).Sub(wall.Now()); w > 0 {
			sleep(w)
		}
		if ctx.Err() != nil {
			break
		}
		due <- struct{}{}
	}
	close(due)
	wg.Wait()
	took := wall.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return took, err
	}
	if err := ctx.Err(); err != nil {
		return took, errors.New("the schedule was cancelled")
	}
	return took, nil
}

// summarize is a run's percentiles of samples.
func summarize(label string, samples []time.Duration, perSec float64) latencyRun {
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	pct := func(p float64) time.Duration { return samples[int(p*float64(len(samples)-1)+0.5)] }
	r := latencyRun{Label: label, Messages: len(samples), ProducedPerSec: perSec,
		P50ms: ms(pct(0.50)), P99ms: ms(pct(0.99)), P999ms: ms(pct(0.999)), MaxMs: ms(samples[len(samples)-1])}
	fmt.Printf("  %-34s %d msgs at %.0f msg/s: p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms\n", label, r.Messages, r.ProducedPerSec, r.P50ms, r.P99ms, r.P999ms, r.MaxMs)
	return r
}
