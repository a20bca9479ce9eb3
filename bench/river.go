package main

// The River peer (-only river): the burn-down of a backlog of N jobs that
// carry the same ~1 KB Order as sqlstreams' messages, by one River client
// with a no-op worker, on the same server and database, in the same run.
// River is a job queue, not a log: a job is consumed once, so every run
// inserts its own backlog (not timed) into an emptied job table.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const (
	riverSchema      = "river_bench" // River's tables go in a schema of their own
	riverInsertBatch = 1000          // jobs per InsertMany call
)

// riverFetchCooldown and riverFetchPollInterval replace River's defaults
// (100 ms and 1 s) by its minimum and a short fallback poll: with the
// defaults a burn-down would wait on River's throttle, not on its work.
const (
	riverFetchCooldown     = time.Millisecond
	riverFetchPollInterval = 5 * time.Millisecond
)

// riverOrder is the job's args: the harness's Order, so River stores the
// same JSON bytes as sqlstreams does (json.Marshal of the same fields).
type riverOrder Order

func (riverOrder) Kind() string { return "bench_order" }

// riverNoop is the no-op worker; River hands it the decoded args, as
// sqlstreams hands its handler a decoded *Order.
type riverNoop struct {
	river.WorkerDefaults[riverOrder]
	n      int64
	worked atomic.Int64
	lastAt atomic.Int64 // wall clock (ns) of the n-th Work call
}

func (w *riverNoop) Work(ctx context.Context, job *river.Job[riverOrder]) error {
	if w.worked.Add(1) == w.n {
		w.lastAt.Store(wall.Now().UnixNano())
	}
	return nil
}

func (b *bench) riverConfig() string {
	return fmt.Sprintf("1 client, queue %q MaxWorkers %d, FetchCooldown %s, FetchPollInterval %s, LISTEN/NOTIFY on (not PollOnly), Schema %q, JobTimeout -1, no-op worker; backlog inserted with InsertMany, %d jobs per call, before Start (a run after the first deletes the completed jobs and tops the backlog up)",
		river.QueueDefault, b.c.riverWorkers, riverFetchCooldown, riverFetchPollInterval, riverSchema, riverInsertBatch) +
		fmt.Sprintf("; each run times the first %d completions of a backlog of %d jobs", b.c.peerCount(), b.c.n)
}

func (b *bench) river(ctx context.Context) error {
	driver := riverpgxv5.New(b.pool)
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+riverSchema); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: riverSchema, Logger: b.logger})
	if err != nil {
		return err
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	cfg := b.riverConfig()
	b.rep.peer("river", "River", []string{"github.com/riverqueue/river", "github.com/riverqueue/river/riverdriver/riverpgxv5"},
		fmt.Sprintf("%s; %d migrations applied by rivermigrate", cfg, len(res.Versions)))
	fmt.Printf("river burn-down: %s\n", cfg)

	result := b.rep.throughput("river_burndown", fmt.Sprintf("River burn-down, 1 client, MaxWorkers %d", b.c.riverWorkers), "jobs/s")
	for r := 1; r <= b.c.runs; r++ {
		label := fmt.Sprintf("river burn-down run %d/%d", r, b.c.runs)
		rate, err := b.riverBurnDown(ctx, driver, label)
		if err != nil {
			return err
		}
		result.add(label, rate)
	}
	_, err = b.pool.Exec(ctx, "TRUNCATE "+riverSchema+".river_job")
	return err
}

// riverBurnDown brings the job table to a backlog of n available jobs, then
// times a fresh client from Start until River reports the m-th job
// completed. River sends a completion event only after its completer has
// committed the job's completed state, so the figure counts durable
// completions. A run after the first deletes the completed jobs and tops the
// backlog up to n again (not timed): every run starts from n available jobs
// in a vacuumed table, as the first, without inserting n jobs each time.
func (b *bench) riverBurnDown(ctx context.Context, driver *riverpgxv5.Driver, label string) (float64, error) {
	n, m := b.c.n, b.c.peerCount() // the backlog, and the jobs timed
	if _, err := b.pool.Exec(ctx, "DELETE FROM "+riverSchema+".river_job WHERE state <> 'available'"); err != nil {
		return 0, err
	}
	var left int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+riverSchema+".river_job").Scan(&left); err != nil {
		return 0, err
	}
	worker := &riverNoop{n: int64(m)}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, worker); err != nil {
		return 0, err
	}
	client, err := river.NewClient(driver, &river.Config{
		Schema:            riverSchema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: b.c.riverWorkers}},
		Workers:           workers,
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: riverFetchPollInterval,
		JobTimeout:        -1, // no per-job timeout context: the worker does nothing
		Logger:            b.logger,
	})
	if err != nil {
		return 0, err
	}

	// The backlog, not timed.
	params := make([]river.InsertManyParams, riverInsertBatch)
	for i := range params {
		params[i] = river.InsertManyParams{Args: riverOrder(baseOrder)}
	}
	for done := left; done < n; {
		k := min(riverInsertBatch, n-done)
		if _, err := client.InsertMany(ctx, params[:k]); err != nil {
			return 0, fmt.Errorf("river InsertMany: %w", err)
		}
		done += k
	}
	var available int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+riverSchema+".river_job WHERE state = 'available'").Scan(&available); err != nil {
		return 0, err
	}
	if available != n {
		return 0, fmt.Errorf("%s: %d available jobs after the inserts, want %d", label, available, n)
	}
	b.checkpoint(ctx)

	// Big enough that River never drops an event (it does not block on a
	// full subscription channel).
	events, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}, ChanSize: n + 1000})
	defer cancelSub()
	var completed atomic.Int64
	stop := progress(label, "jobs", int64(m), &completed)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := wall.Now()
	if err := client.Start(cctx); err != nil {
		stop()
		return 0, fmt.Errorf("river Start: %w", err)
	}
	var elapsed time.Duration
	var failed error
	timeout := after(burnTimeout)
wait:
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				failed = errors.New("river closed the subscription early")
				break wait
			}
			if ev.Kind != river.EventKindJobCompleted {
				failed = fmt.Errorf("job %d: %s", ev.Job.ID, ev.Kind)
				break wait
			}
			if completed.Add(1) == int64(m) {
				elapsed = wall.Since(start)
				break wait
			}
		case <-timeout:
			failed = fmt.Errorf("timed out after %s with %d of %d jobs completed", burnTimeout, completed.Load(), m)
			break wait
		case <-ctx.Done():
			failed = ctx.Err()
			break wait
		}
	}
	stop()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if err := client.Stop(sctx); err != nil && failed == nil {
		failed = fmt.Errorf("river Stop: %w", err)
	}
	if failed != nil {
		return 0, fmt.Errorf("%s: %w", label, failed)
	}
	// Check, not timed, that the table agrees with the events.
	var done int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+riverSchema+".river_job WHERE state = 'completed'").Scan(&done); err != nil {
		return 0, err
	}
	if done < m || done > n {
		return 0, fmt.Errorf("%s: %d completed rows, want %d to %d", label, done, m, n)
	}
	rate := report1(label, "jobs", m, elapsed)
	if m < n {
		fmt.Printf("  %-34s note: timed the first %d of a backlog of %d jobs\n", "", m, n)
	}
	if at := worker.lastAt.Load(); at > 0 {
		fmt.Printf("  %-34s note: the worker had run %d jobs %.2fs after Start\n", "", m, time.Unix(0, at).Sub(start).Seconds())
	}
	if w := worker.worked.Load(); w > int64(done) {
		fmt.Printf("  %-34s note: %d jobs worked more than once\n", "", w-int64(done))
	}
	return rate, nil
}
