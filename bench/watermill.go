package main

// The Watermill SQL peer (-only watermill): one topic holds a backlog of N
// messages with the same ~1 KB JSON payload as sqlstreams' messages, and a
// fresh consumer group per run reads it all with one subscriber, as the
// sqlstreams burn-down reads one stream with a fresh group per run. Same
// server, same database, same run.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

const (
	watermillSchema       = "watermill_bench" // Watermill's tables go in a schema of their own
	watermillTopic        = "bench_backlog"
	watermillPublishBatch = 1000 // messages per Publish call (one multi-row INSERT)
	// watermillPollInterval is the subscriber's wait after a query found
	// nothing (default 1 s); with a backlog ready it only matters at the end.
	watermillPollInterval = 10 * time.Millisecond
)

func (b *bench) watermillAdapters() (wsql.DefaultPostgreSQLSchema, wsql.DefaultPostgreSQLOffsetsAdapter) {
	return wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: func(topic string) string { return fmt.Sprintf(`%q.%q`, watermillSchema, "watermill_"+topic) },
			SubscribeBatchSize:        b.c.watermillBatch,
		}, wsql.DefaultPostgreSQLOffsetsAdapter{
			GenerateMessagesOffsetsTableName: func(topic string) string {
				return fmt.Sprintf(`%q.%q`, watermillSchema, "watermill_offsets_"+topic)
			},
		}
}

func (b *bench) watermillConfig() string {
	return fmt.Sprintf("1 subscriber in 1 consumer group (a fresh group per run), DefaultPostgreSQLSchema (payload column JSON) with SubscribeBatchSize %d, DefaultPostgreSQLOffsetsAdapter, "+
		"PollInterval %s, AckDeadline 30s (default), pgx pool via BeginnerFromPgx, tables in schema %q; the consumer json.Unmarshals each payload into an Order and Acks it; "+
		"backlog published once with Publish, %d messages per call; each run times the first %d acks of a backlog of %d messages", b.c.watermillBatch, watermillPollInterval, watermillSchema, watermillPublishBatch, b.c.peerCount(), b.c.n)
}

func (b *bench) watermill(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+watermillSchema); err != nil {
		return err
	}
	schema, _ := b.watermillAdapters()
	db := wsql.BeginnerFromPgx(b.pool)
	logger := watermill.NewSlogLogger(b.logger)
	cfg := b.watermillConfig()
	b.rep.peer("watermill", "Watermill SQL", []string{"github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill-sql/v4"}, cfg)
	fmt.Printf("watermill burn-down: %s\n", cfg)

	// The backlog, once, not timed.
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	n := b.c.n
	var published atomic.Int64
	stop := progress("watermill backlog (not timed)", "msgs", int64(n), &published)
	start := wall.Now()
	msgs := make([]*message.Message, watermillPublishBatch)
	for done := 0; done < n; done += watermillPublishBatch {
		k := min(watermillPublishBatch, n-done)
		for i := range k {
			msgs[i] = message.NewMessage(watermill.NewUUID(), payloadJSON)
			msgs[i].SetContext(ctx)
		}
		if err := pub.Publish(watermillTopic, msgs[:k]...); err != nil {
			stop()
			return fmt.Errorf("watermill Publish: %w", err)
		}
		published.Add(int64(k))
	}
	stop()
	_ = pub.Close()
	report1("watermill backlog (not timed)", "msgs", n, wall.Since(start))

	result := b.rep.throughput("watermill_burndown", fmt.Sprintf("Watermill SQL burn-down, 1 subscriber, SubscribeBatchSize %d", b.c.watermillBatch), "msg/s")
	for r := 1; r <= b.c.runs; r++ {
		b.checkpoint(ctx)
		label := fmt.Sprintf("watermill burn-down run %d/%d", r, b.c.runs)
		rate, err := b.watermillBurnDown(ctx, db, logger, fmt.Sprintf("burn-run%d", r), label)
		if err != nil {
			return err
		}
		result.add(label, rate)
	}
	_, err = b.pool.Exec(ctx, "DROP SCHEMA "+watermillSchema+" CASCADE")
	return err
}

// watermillBurnDown times a fresh consumer group from Subscribe until the
// n-th message is acked, then (not timed) waits for the subscriber to commit
// the group's offset past the last message and checks it.
func (b *bench) watermillBurnDown(ctx context.Context, db wsql.Beginner, logger watermill.LoggerAdapter, group, label string) (float64, error) {
	n := b.c.peerCount() // the messages timed, the first of the backlog
	schema, offsets := b.watermillAdapters()
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:  group,
		PollInterval:   watermillPollInterval,
		SchemaAdapter:  schema,
		OffsetsAdapter: offsets,
	}, logger)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	// The tables exist already; this creates the offsets table on the
	// first run. Not timed, like the sqlstreams group's registration.
	if err := sub.SubscribeInitialize(watermillTopic); err != nil {
		return 0, fmt.Errorf("watermill SubscribeInitialize: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var acked atomic.Int64
	stop := progress(label, "msgs", int64(n), &acked)
	start := wall.Now()
	ch, err := sub.Subscribe(cctx, watermillTopic)
	if err != nil {
		stop()
		return 0, fmt.Errorf("watermill Subscribe: %w", err)
	}
	var elapsed time.Duration
	var failed error
	timeout := after(burnTimeout)
	var o Order
wait:
	for {
		select {
		case msg, ok := <-ch:
			if !ok {
				failed = fmt.Errorf("the subscription closed after %d of %d messages", acked.Load(), n)
				break wait
			}
			o = Order{}
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				failed = fmt.Errorf("message %s: %w", msg.UUID, err)
				break wait
			}
			msg.Ack()
			if acked.Add(1) == int64(n) {
				elapsed = wall.Since(start)
				break wait
			}
		case <-timeout:
			failed = fmt.Errorf("timed out after %s with %d of %d acked", burnTimeout, acked.Load(), n)
			break wait
		case <-ctx.Done():
			failed = ctx.Err()
			break wait
		}
	}
	stop()
	if failed != nil {
		return 0, fmt.Errorf("%s: %w", label, failed)
	}
	// The subscriber commits a batch's offset after its last message is
	// acked; closing before then would roll that back. Wait for it.
	committedAt, err := b.watermillCommitted(ctx, group, n, 30*time.Second)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", label, err)
	}
	// Close first: it waits for the subscriber's current query, where a
	// cancelled context would make it log a failed commit.
	if err := sub.Close(); err != nil {
		return 0, err
	}
	cancel()
	rate := report1(label, "msgs", n, elapsed)
	if n < b.c.n {
		fmt.Printf("  %-34s note: timed the first %d of a backlog of %d messages\n", "", n, b.c.n)
	}
	fmt.Printf("  %-34s note: the group's offset was committed past the %d-th message %.2fs after Subscribe\n", "", n, committedAt.Sub(start).Seconds())
	return rate, nil
}

// watermillCommitted polls, every millisecond, until the group's acked
// offset reaches the topic's n-th offset, and returns when it saw that.
func (b *bench) watermillCommitted(ctx context.Context, group string, n int, limit time.Duration) (time.Time, error) {
	var last int64
	if err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT "offset" FROM %q.%q ORDER BY "offset" OFFSET $1 LIMIT 1`, watermillSchema, "watermill_"+watermillTopic), n-1).Scan(&last); err != nil {
		return time.Time{}, err
	}
	deadline := wall.Now().Add(limit)
	for {
		var at int64
		err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT offset_acked FROM %q.%q WHERE consumer_group = $1`, watermillSchema, "watermill_offsets_"+watermillTopic), group).Scan(&at)
		if err != nil {
			return time.Time{}, err
		}
		if at >= last {
			return wall.Now(), nil
		}
		if wall.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("the group's acked offset is %d %s after the last ack, want %d", at, limit, last)
		}
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
		sleep(time.Millisecond)
	}
}
