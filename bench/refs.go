package main

// Reference points outside PostgreSQL (-only nats,rabbitmq): NATS JetStream
// and RabbitMQ, where the machine runs them, with the same ~1 KB Order. Each
// run publishes -ref-n messages durably (JetStream file storage with
// acknowledged async publishes; a durable RabbitMQ queue bound to a topic
// exchange, persistent messages, publisher confirms), then one consumer
// reads them all, decoding each into an Order as sqlstreams' handler gets
// one, and acknowledges once per 1,000 (JetStream AckAll, AMQP multiple
// ack), as the raw drain commits an offset per batch. They are not
// PostgreSQL: the figures are labelled as reference points and carry no
// floor.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

const refAckEvery = 1000 // messages per acknowledgement when consuming

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// natsRef publishes and drains -ref-n messages through a JetStream stream per
// run. A server that is not reachable skips the workload with a note.
func (b *bench) natsRef(ctx context.Context) error {
	url := envOr("BENCH_NATS_URL", nats.DefaultURL)
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err != nil {
		fmt.Printf("nats: skipped, no server at %s (%v); set BENCH_NATS_URL\n", url, err)
		return nil
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	n := b.c.refN
	cfg := fmt.Sprintf("server %s, stream with file storage (the server's own sync interval: JetStream does not fsync each message by default, unlike PostgreSQL's commit), subject bench.orders, PublishAsync (each publish acknowledged by the server), a durable pull consumer with AckAll fetching %d at a time and acking the last of each batch; %d messages per run, a fresh stream per run", url, refAckEvery, n)
	b.rep.peer("nats", "NATS JetStream (reference, not PostgreSQL)", []string{"github.com/nats-io/nats.go"}, cfg)
	pub := b.rep.throughput("nats_publish", "reference: NATS JetStream durable publish (async, acknowledged)", "msg/s")
	sub := b.rep.throughput("nats_consume", "reference: NATS JetStream pull consumer, decode + AckAll per 1,000", "msg/s")
	for r := 1; r <= b.c.runs; r++ {
		_ = js.DeleteStream(ctx, "BENCH")
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.orders"}, Storage: jetstream.FileStorage})
		if err != nil {
			return fmt.Errorf("nats stream: %w", err)
		}
		label := fmt.Sprintf("nats publish run %d/%d", r, b.c.runs)
		var done atomic.Int64
		stop := progress(label, "msgs", int64(n), &done)
		start := wall.Now()
		for i := 0; i < n; i++ {
			if _, err := js.PublishAsync("bench.orders", payloadJSON); err != nil {
				stop()
				return fmt.Errorf("nats publish: %w", err)
			}
			done.Add(1)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-after(burnTimeout):
			stop()
			return errors.New("nats: publishes not acknowledged in time")
		}
		elapsed := wall.Since(start)
		stop()
		pub.add(label, report1(label, "msgs", n, elapsed))

		label = fmt.Sprintf("nats consume run %d/%d", r, b.c.runs)
		cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("bench-%d", r), AckPolicy: jetstream.AckAllPolicy, MaxAckPending: 4 * refAckEvery})
		if err != nil {
			return fmt.Errorf("nats consumer: %w", err)
		}
		var got atomic.Int64
		stop = progress(label, "msgs", int64(n), &got)
		start = wall.Now()
		var o Order
		for got.Load() < int64(n) {
			batch, err := cons.Fetch(refAckEvery, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				stop()
				return fmt.Errorf("nats fetch: %w", err)
			}
			var last jetstream.Msg
			for m := range batch.Messages() {
				o = Order{}
				if err := json.Unmarshal(m.Data(), &o); err != nil {
					stop()
					return err
				}
				last = m
				got.Add(1)
			}
			if err := batch.Error(); err != nil {
				stop()
				return fmt.Errorf("nats fetch: %w", err)
			}
			if last != nil {
				if err := last.Ack(); err != nil {
					stop()
					return fmt.Errorf("nats ack: %w", err)
				}
			}
		}
		elapsed = wall.Since(start)
		stop()
		sub.add(label, report1(label, "msgs", n, elapsed))
	}
	return js.DeleteStream(ctx, "BENCH")
}

// rabbitRef publishes and drains -ref-n messages through a durable queue per
// run. A server that is not reachable skips the workload with a note.
func (b *bench) rabbitRef(ctx context.Context) error {
	url := envOr("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		fmt.Printf("rabbitmq: skipped, no server at %s (%v); set BENCH_AMQP_URL\n", redact(url), err)
		return nil
	}
	defer conn.Close()
	n := b.c.refN
	cfg := fmt.Sprintf("server %s, durable queue bound to a durable topic exchange (routing key orders.eu), persistent messages, publisher confirms awaited per %d; one consumer with prefetch %d, manual multiple ack per %d; %d messages per run, the queue purged per run", redact(url), refAckEvery, 2*refAckEvery, refAckEvery, n)
	b.rep.peer("rabbitmq", "RabbitMQ (reference, not PostgreSQL)", []string{"github.com/rabbitmq/amqp091-go"}, cfg)
	pub := b.rep.throughput("rabbitmq_publish", "reference: RabbitMQ persistent publish with confirms, topic exchange", "msg/s")
	sub := b.rep.throughput("rabbitmq_consume", "reference: RabbitMQ consume, decode + multiple ack per 1,000", "msg/s")
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	const exchange, queue = "bench.topic", "bench.orders"
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	if err := ch.QueueBind(queue, "orders.#", exchange, false, nil); err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, refAckEvery))
	for r := 1; r <= b.c.runs; r++ {
		if _, err := ch.QueuePurge(queue, false); err != nil {
			return err
		}
		label := fmt.Sprintf("rabbitmq publish run %d/%d", r, b.c.runs)
		var done atomic.Int64
		stop := progress(label, "msgs", int64(n), &done)
		start := wall.Now()
		for sent := 0; sent < n; {
			k := min(refAckEvery, n-sent)
			for range k {
				if err := ch.PublishWithContext(ctx, exchange, "orders.eu", false, false,
					amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: payloadJSON}); err != nil {
					stop()
					return fmt.Errorf("rabbitmq publish: %w", err)
				}
			}
			for range k {
				if c := <-confirms; !c.Ack {
					stop()
					return fmt.Errorf("rabbitmq: publish %d nacked", c.DeliveryTag)
				}
			}
			sent += k
			done.Store(int64(sent))
		}
		elapsed := wall.Since(start)
		stop()
		pub.add(label, report1(label, "msgs", n, elapsed))

		label = fmt.Sprintf("rabbitmq consume run %d/%d", r, b.c.runs)
		cch, err := conn.Channel()
		if err != nil {
			return err
		}
		if err := cch.Qos(2*refAckEvery, 0, false); err != nil {
			return err
		}
		var got atomic.Int64
		stop = progress(label, "msgs", int64(n), &got)
		start = wall.Now()
		deliveries, err := cch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
		if err != nil {
			stop()
			return err
		}
		var o Order
		timeout := after(burnTimeout)
	consume:
		for got.Load() < int64(n) {
			select {
			case d, ok := <-deliveries:
				if !ok {
					stop()
					return errors.New("rabbitmq: deliveries closed early")
				}
				o = Order{}
				if err := json.Unmarshal(d.Body, &o); err != nil {
					stop()
					return err
				}
				if c := got.Add(1); c%refAckEvery == 0 || c == int64(n) {
					if err := d.Ack(true); err != nil {
						stop()
						return err
					}
				}
			case <-timeout:
				break consume
			}
		}
		elapsed = wall.Since(start)
		stop()
		_ = cch.Close()
		if got.Load() < int64(n) {
			return fmt.Errorf("%s: %d of %d consumed in %s", label, got.Load(), n, burnTimeout)
		}
		sub.add(label, report1(label, "msgs", n, elapsed))
	}
	_, err = ch.QueueDelete(queue, false, false, false)
	return err
}
