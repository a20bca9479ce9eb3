package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Start says where a brand-new group's cursor is placed. It is read once,
// when the group is created.
type Start string

const (
	// StartBeginning delivers every message still in the stream (default).
	StartBeginning Start = store.StartBeginning
	// StartHead delivers only messages produced after the group is created.
	StartHead Start = store.StartHead
)

// ConsumerConfig is the group's config: what the group means, the same for
// every instance. Declared at Register.
type ConsumerConfig struct {
	// Start places a new group's cursor. Default StartBeginning. A later
	// declaration's Start changes nothing.
	Start Start
}

func (c *ConsumerConfig) withDefaults() ConsumerConfig {
	var out ConsumerConfig
	if c != nil {
		out = *c
	}
	if out.Start == "" {
		out.Start = StartBeginning
	}
	return out
}

func (c ConsumerConfig) validate() error {
	if c.Start != StartBeginning && c.Start != StartHead {
		return fmt.Errorf("%w: ConsumerConfig.Start %q: want %q or %q", ErrInvalidConfig, c.Start, StartBeginning, StartHead)
	}
	return nil
}

// ConsumeOptions are one Consume session's instance options: how this
// process runs, free to differ per box. nil means the defaults.
type ConsumeOptions struct {
	// BatchLimit is the most messages one claim takes. Default 100.
	BatchLimit int
	// QueueSize bounds messages claimed and not yet settled. Default
	// 2×BatchLimit; at least BatchLimit.
	QueueSize int
	// MessageConcurrency is how many handlers run at once. Default 10.
	MessageConcurrency int
	// ClaimPollRate is how often an idle instance looks for new messages.
	// Default 100ms.
	ClaimPollRate time.Duration
	// InstanceTTL is how long this instance's heartbeat and range leases
	// last without renewal; a crashed instance's ranges are reclaimed this
	// long after its last beat. Default 30s; at least 1s.
	InstanceTTL time.Duration
	// ShutdownTimeout bounds the graceful drain of in-flight handlers after
	// ctx ends. Default 30s.
	ShutdownTimeout time.Duration
	// DisableGracefulShutdown stops at once when ctx ends, leaving leases to
	// expire as after a crash.
	DisableGracefulShutdown bool
	// StallWarning is how long claims may find committed messages held back
	// by an open transaction before the stall is logged. Default 10s.
	StallWarning time.Duration
}

// Default instance options.
const (
	DefaultBatchLimit         = 100
	DefaultMessageConcurrency = 10
	DefaultClaimPollRate      = 100 * time.Millisecond
	DefaultInstanceTTL        = 30 * time.Second
	DefaultShutdownTimeout    = 30 * time.Second
	DefaultStallWarning       = 10 * time.Second
	// DefaultExceptionBackoff delays the first retry of a failed message.
	DefaultExceptionBackoff = 5 * time.Second
)

func (o *ConsumeOptions) withDefaults() ConsumeOptions {
	var out ConsumeOptions
	if o != nil {
		out = *o
	}
	if out.BatchLimit == 0 {
		out.BatchLimit = DefaultBatchLimit
	}
	if out.QueueSize == 0 {
		out.QueueSize = 2 * out.BatchLimit
	}
	if out.MessageConcurrency == 0 {
		out.MessageConcurrency = DefaultMessageConcurrency
	}
	if out.ClaimPollRate == 0 {
		out.ClaimPollRate = DefaultClaimPollRate
	}
	if out.InstanceTTL == 0 {
		out.InstanceTTL = DefaultInstanceTTL
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = DefaultShutdownTimeout
	}
	if out.StallWarning == 0 {
		out.StallWarning = DefaultStallWarning
	}
	return out
}

func (o ConsumeOptions) validate() error {
	switch {
	case o.BatchLimit < 1 || o.BatchLimit > 10000:
		return fmt.Errorf("%w: ConsumeOptions.BatchLimit %d outside 1..10000", ErrInvalidConfig, o.BatchLimit)
	case o.QueueSize < o.BatchLimit:
		return fmt.Errorf("%w: ConsumeOptions.QueueSize %d is below BatchLimit %d", ErrInvalidConfig, o.QueueSize, o.BatchLimit)
	case o.MessageConcurrency < 1:
		return fmt.Errorf("%w: ConsumeOptions.MessageConcurrency %d must be at least 1", ErrInvalidConfig, o.MessageConcurrency)
	case o.ClaimPollRate < time.Millisecond:
		return fmt.Errorf("%w: ConsumeOptions.ClaimPollRate %s is below 1ms", ErrInvalidConfig, o.ClaimPollRate)
	case o.InstanceTTL < time.Second:
		return fmt.Errorf("%w: ConsumeOptions.InstanceTTL %s is below 1s", ErrInvalidConfig, o.InstanceTTL)
	case o.ShutdownTimeout < 0 || o.StallWarning < 0:
		return fmt.Errorf("%w: ConsumeOptions durations must not be negative", ErrInvalidConfig)
	}
	return nil
}

// ConsumerHandle names a group on a typed stream, before it is registered.
type ConsumerHandle[T any] struct {
	s    *StreamHandle[T]
	name string
}

// Consumer returns the handle of the consumer group called name.
func (s *StreamHandle[T]) Consumer(name string) *ConsumerHandle[T] {
	return &ConsumerHandle[T]{s: s, name: name}
}

// Consumer is a registered group, ready to Consume.
type Consumer[T any] struct {
	s       *StreamHandle[T]
	group   store.GroupRow
	cfg     ConsumerConfig
	stats   claimer.Stats
	version int
}

// Register declares the group on its stream (which must be registered) and
// returns the typed consumer. The group's cursor is created on first Register,
// placed by cfg.Start.
func (h *ConsumerHandle[T]) Register(ctx context.Context, cfg *ConsumerConfig) (*Consumer[T], error) {
	if err := validateName("consumer group", h.name); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	row, _, err := h.s.resolve(ctx)
	if err != nil {
		return nil, fmt.Errorf("register consumer %q: %w", h.name, err)
	}
	g, err := h.s.c.store.RegisterGroup(ctx, row.ID, h.name, string(c.Start), h.s.c.dbNow())
	if err != nil {
		return nil, err
	}
	if !g.Created && g.Start != string(c.Start) {
		h.s.c.cfg.Logger.Warn("consumer group Start differs from the one its cursor was created with; Start is read only at creation",
			"group", h.name, "cursor_start", g.Start, "declared_start", c.Start)
	}
	return &Consumer[T]{s: h.s, group: g, cfg: c, version: h.s.version}, nil
}

// Name returns the group's name.
func (c *Consumer[T]) Name() string { return c.group.Name }

// Stats is a snapshot of a Consumer's counters over all its sessions.
type Stats struct {
	Claimed, Reclaimed, Succeeded, Failed, Committed, LeasesLost, Stalls int64
}

// Stats returns the consumer's counters.
func (c *Consumer[T]) Stats() Stats {
	s := &c.stats
	return Stats{
		Claimed: s.Claimed.Load(), Reclaimed: s.Reclaimed.Load(), Succeeded: s.Succeeded.Load(),
		Failed: s.Failed.Load(), Committed: s.Committed.Load(), LeasesLost: s.LeasesLost.Load(), Stalls: s.Stalls.Load(),
	}
}

// Handler handles one message. nil is success; an error is a failure,
// recorded as an exception row for the group. A panic is a failure, never a
// crash.
type Handler[T any] func(ctx context.Context, msg *T) error

// Consume runs one instance of the group until ctx ends, then drains (unless
// DisableGracefulShutdown) and returns nil. It returns only after every
// goroutine it started has exited. Many Consume calls, in one process or
// many, share the group's work.
func (c *Consumer[T]) Consume(ctx context.Context, handler Handler[T], opts *ConsumeOptions) error {
	if handler == nil {
		return fmt.Errorf("%w: Consume needs a handler", ErrInvalidConfig)
	}
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return err
	}
	client := c.s.c
	return engine.Run(ctx, engine.Config{
		Store: client.store, StreamID: c.group.StreamID, GroupID: c.group.ID, GroupName: c.group.Name,
		WorkerConfigID: c.group.Workers[store.WorkerMessageConsumer], DeclaredBy: declaredBy(),
		Handler: c.adapt(handler),
		Options: engine.Options{
			BatchLimit: o.BatchLimit, QueueSize: o.QueueSize, MessageConcurrency: o.MessageConcurrency,
			ClaimPollRate: o.ClaimPollRate, InstanceTTL: o.InstanceTTL, ShutdownTimeout: o.ShutdownTimeout,
			DisableGracefulShutdown: o.DisableGracefulShutdown, ExceptionBackoff: DefaultExceptionBackoff,
			StallAfter: o.StallWarning,
		},
		Clock: client.cfg.Clock, Logger: client.cfg.Logger, Stats: &c.stats,
		OnStart: consumeHooks(ctx),
	})
}

// adapt decodes a stored message into T and runs the handler under the
// message's timeout.
func (c *Consumer[T]) adapt(h Handler[T]) claimer.Handler {
	return func(ctx context.Context, m *store.Message) error {
		if m.Version != c.version {
			return fmt.Errorf("%w: message %d is version %d, consumer reads %d", ErrSchemaVersion, m.ID, m.Version, c.version)
		}
		info := &Meta{ID: m.ID, Stream: c.s.name, Group: c.group.Name, RoutingKey: m.RoutingKey, Key: m.Key,
			Version: m.Version, ProducedAt: m.ProducedAt}
		if len(m.Options) > 0 {
			if err := json.Unmarshal(m.Options, &info.Options); err != nil {
				return fmt.Errorf("%w: message %d options: %v", ErrDecode, m.ID, err)
			}
		}
		var msg T
		if err := json.Unmarshal(m.Payload, &msg); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return fmt.Errorf("%w: message %d into %T: field %q wants %s", ErrDecode, m.ID, msg, te.Field, te.Type)
			}
			return fmt.Errorf("%w: message %d into %T", ErrDecode, m.ID, msg)
		}
		timeout := info.Options.Timeout
		if timeout == 0 {
			timeout = DefaultMessageTimeout
		}
		hctx, cancel := c.s.c.cfg.Clock.WithTimeout(context.WithValue(ctx, metaKey{}, info), timeout)
		defer cancel()
		return h(hctx, &msg)
	}
}

type hooksKey struct{}

// consumeHooks returns the test hook riding ctx, if any.
func consumeHooks(ctx context.Context) func(string) {
	f, _ := ctx.Value(hooksKey{}).(func(string))
	return f
}
