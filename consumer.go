package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/thejerf/suture/v4"
)

// ConsumerHandle names a group on a typed stream, before it is registered.
type ConsumerHandle[T any] struct {
	s    *StreamHandle[T]
	name string
}

// Consumer returns the handle of the consumer group called name. Group
// names follow the stream name rule (1 to 128 bytes of ASCII letters,
// digits, '.', '_' and '-', starting with a letter or digit) and are unique
// in the client's schema: a name already registered on another stream is
// ErrGroupStream.
func (s *StreamHandle[T]) Consumer(name string) *ConsumerHandle[T] {
	return &ConsumerHandle[T]{s: s, name: name}
}

// Consumer is a registered group, ready to Consume.
type Consumer[T any] struct {
	s        *StreamHandle[T]
	group    store.GroupRow
	cfg      ConsumerConfig
	version  int
	patterns []string // the declared binding set, normalized
	regexes  []string
	// waiting is the declared_at of Register's attempt when it waited: the
	// first Consume's attempts carry it until the set is installed or joined.
	waitMu  sync.Mutex
	waiting *time.Time

	statsMu sync.Mutex
	ended   Stats                      // the counters of sessions that returned
	live    map[*engine.Stats]struct{} // the counters of sessions running

	// leftovers are ranges a session stopped during an outage could not
	// hand back: the consumer's next sessions in this process record what
	// they settled (claimer.Leftovers).
	leftovers engine.Leftovers
}

// waitingSince returns the declared_at a Consume session's attempts carry.
func (c *Consumer[T]) waitingSince() *time.Time {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	return c.waiting
}

// declared ends the wait Register began.
func (c *Consumer[T]) declared() {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	c.waiting = nil
}

// Register declares the group on its stream (which must be registered) and
// returns the typed consumer. The group's cursor is created on first Register,
// placed by cfg.Start.
func (h *ConsumerHandle[T]) Register(ctx context.Context, cfg *ConsumerConfig) (*Consumer[T], error) {
	return h.register(ctx, cfg, declareAlways)
}

// register is Register, Attach, and the library's own groups' registration,
// by how the config document is declared (mode).
func (h *ConsumerHandle[T]) register(ctx context.Context, cfg *ConsumerConfig, mode declareMode) (*Consumer[T], error) {
	if err := validateName("consumer group", h.name); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	row, _, err := h.s.resolve(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("register consumer %q: %w", h.name, err)
	}
	g, err := h.s.c.store.RegisterGroup(ctx, row.ID, h.name, string(c.Start), h.s.c.dbNow())
	if err != nil {
		return nil, err
	}
	logger := h.s.c.cfg.Logger
	if !g.Created && cfg != nil && cfg.Start != "" && g.Start != string(cfg.Start) {
		codes.StartIgnored.Log(ctx, logger, "consumer group Start differs from the one its cursor was created with; Start is read only at creation",
			"group", h.name, "cursor_start", g.Start, "declared_start", cfg.Start)
	}
	var declared ConsumerConfig
	if cfg != nil {
		declared = *cfg
	}
	docs, err := declared.declared().Docs()
	if err != nil {
		return nil, fmt.Errorf("register consumer %q: %w", h.name, err)
	}
	declare := h.s.c.store.DeclareGroupConfig
	switch {
	case mode == declareSeed:
		declare = h.s.c.store.SeedGroupConfig
	case mode == declareAtCreation && !g.Created:
		declare = nil // an existing group keeps its stored config
	}
	var old map[string][]byte
	var changed bool
	if declare != nil {
		if old, changed, err = declare(ctx, store.GroupConfigParams{GroupID: g.ID, Docs: docs, DeclaredBy: declaredBy(), Now: h.s.c.dbNow()}); err != nil {
			return nil, fmt.Errorf("register consumer %q: %w", h.name, err)
		}
	}
	if changed && !g.Created {
		changes, err := groupconfig.Diff(old, docs)
		if err != nil {
			return nil, fmt.Errorf("register consumer %q: %w", h.name, err)
		}
		h.s.c.redeclared(ctx, "consumer group", h.name, changes)
	}
	con := &Consumer[T]{s: h.s, group: g, cfg: c, version: h.s.version}
	con.patterns, con.regexes = compileBindings(c.Bindings)
	// One attempt at the binding declaration; the wait, if any, lives in
	// Consume.
	res, err := h.s.c.store.Group(g.StreamID, g.ID).DeclareBindings(ctx, store.BindingRequest{
		Patterns: con.patterns, Regexes: con.regexes, DeclaredBy: declaredBy(), Now: h.s.c.dbNow()})
	if err != nil {
		return nil, fmt.Errorf("register consumer %q: %w", h.name, err)
	}
	if res.Outcome == store.BindingWaiting {
		at := res.DeclaredAt
		con.waiting = &at
		codes.BindingWaiting.Log(ctx, logger, "WAITING: consumer group binding set differs from the installed one while live instances hold it; "+
			"Consume will wait until they are gone", "group", h.name, "wanted", con.patterns,
			"installed", res.Installed, "live_instances", res.Live)
	}
	return con, nil
}

// Name returns the group's name.
func (c *Consumer[T]) Name() string { return c.group.Name }

// db is the group's handle on the store.
func (c *Consumer[T]) db() store.Group { return c.s.c.store.Group(c.group.StreamID, c.group.ID) }

// Handler handles one message. nil is success. An error is a failure: the
// message is retried on its curve, then dead. Terminal(err) is dead at once;
// Delay(d) runs it again after d without spending a retry. A panic is a
// failure, never a crash. The handler's ctx ends at the message's Timeout.
//
// msg is decoded with the client's Decoder (ClientConfig.Decoder:
// StandardJSON, encoding/json, by default). A consumer of
// Stream[json.RawMessage] receives the payload's bytes as stored, with no
// decoding at all (the database validated them as JSON at produce): a
// handler that only looks at part of the message starts there.
type Handler[T any] func(ctx context.Context, msg *T) error

// Consume runs one instance of the group until ctx ends, then drains (unless
// DisableGracefulShutdown) and returns nil. It blocks until then: run it on
// a goroutine of its own, or as the last call of main. Many Consume calls,
// in one process or many, share the group's work.
//
// Once ctx ends, Consume returns within ShutdownTimeout plus ShutdownGrace
// (5s), whatever the database does: handlers get ShutdownTimeout, then
// unfinished work is handed back within the grace; what cannot be handed
// back (the database is down) lapses with its lease after InstanceTTL and
// another instance delivers it, as after a crash. It returns only after
// every goroutine it started has exited, handlers that ignore their context
// excepted (they are reported, SQL0207, and left behind).
//
// A transient store failure (a lost connection, a restarting database) is
// retried with ClientConfig.Retry's backoff; the session logs the outage
// twice (SQL0101: when its first actor fails, and when one reaches the
// database again, with the outage's length). A failure that retrying
// cannot fix (the schema or a table is
// missing, a privilege is missing, the pool was closed) ends the session:
// Consume drains as above and returns an error wrapping ErrPermanent that
// names the cause and the remedy.
func (c *Consumer[T]) Consume(ctx context.Context, handler Handler[T], opts *ConsumeOptions) error {
	if handler == nil {
		return fmt.Errorf("%w: Consume needs a handler", ErrInvalidConfig)
	}
	return c.consume(ctx, c.adapt(handler), nil, opts)
}

// consume runs one session with a plain handler h or a transactional one
// th.
func (c *Consumer[T]) consume(ctx context.Context, h engine.Handler, th engine.TxHandler, opts *ConsumeOptions) error {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return err
	}
	stats := &engine.Stats{}
	if o.Session != nil {
		if !o.Session.used.CompareAndSwap(false, true) {
			return fmt.Errorf("%w: ConsumeOptions.Session: a Session serves one Consume call; pass NewSession() to each", ErrInvalidConfig)
		}
		stats = &o.Session.stats
	}
	defer c.track(stats)()
	client := c.s.c
	var mgr func(*shutdown.Plan, *outage.Log) suture.Service
	if !o.DisableManager {
		mgr = func(stop *shutdown.Plan, outages *outage.Log) suture.Service {
			return oneManagerAProcess{turn: client.managerTurn, svc: client.Manager().actor(o.InstanceTTL, stop, outages)}
		}
	}
	endSession := client.store.Session()
	health := outage.NewHealth(client.cfg.Clock, o.InstanceTTL)
	defer health.Close()
	defer o.Readiness.attach(health)()
	return engine.Run(ctx, engine.Config{Manager: mgr, Health: health, Retry: client.cfg.Retry.policy(),
		Store: client.store, StreamID: c.group.StreamID, GroupID: c.group.ID, GroupName: c.group.Name,
		StreamName: c.s.name, Observer: client.cfg.Observer, EndSession: endSession,
		Workers: c.group.Workers, DeclaredBy: declaredBy(), Handler: h, TxHandler: th, Slabs: client.slabsFor(),
		Options: engine.Options{
			BatchLimit: o.BatchLimit, QueueSize: o.QueueSize, MessageConcurrency: o.MessageConcurrency,
			ClaimPollRate: o.ClaimPollRate, InstanceTTL: o.InstanceTTL, ShutdownTimeout: o.ShutdownTimeout,
			DisableGracefulShutdown: o.DisableGracefulShutdown, StallAfter: o.StallWarning,
			TimeoutGrace: o.TimeoutGrace, KeyBusyDelay: keyBusyDelay, ConfigRefreshInterval: o.ConfigRefreshInterval,
			BindingRetryInterval: o.BindingRetryInterval,
		},
		Patterns: c.patterns, Regexes: c.regexes, DeclaredAt: c.waitingSince(), Declared: c.declared, Shared: client.engine,
		Leftovers: &c.leftovers,
		Alerts:    client.publishAlerts(c.s.name, c.group.Name, c.patterns),
		Clock:     client.cfg.Clock, Logger: client.cfg.Logger, Stats: stats,
		Hooks: o.test,
	})
}

// adapt decodes a stored message into T and hands the handler its Meta.
func (c *Consumer[T]) adapt(h Handler[T]) engine.Handler {
	if tr := c.s.c.cfg.Tracer; tr != nil {
		inner := h
		h = func(ctx context.Context, msg *T) (err error) {
			meta, _ := MetaFromContext(ctx)
			ctx, end := tr.StartProcess(ctx, meta)
			defer endSpan(end, &err)
			return inner(ctx, msg)
		}
	}
	dec := c.s.c.cfg.Decoder
	return func(ctx context.Context, d *engine.Delivery) error {
		m := d.Msg
		if m.Version != c.version {
			return Terminal(fmt.Errorf("%w: message %d is version %d, consumer reads %d", ErrSchemaVersion, m.ID, m.Version, c.version))
		}
		meta := &Meta{ID: m.ID, Stream: c.s.name, Group: c.group.Name, RoutingKey: m.RoutingKey, Key: m.Key,
			Version: m.Version, ProducedAt: m.ProducedAt, Attempt: d.Attempt, Delays: d.Delays,
			Concurrency: d.Concurrency, Timeout: d.Timeout, Position: Position{Xid: m.Xid, ID: m.ID}, Headers: decodeHeaders(m.Headers)}
		var msg T
		if raw, ok := any(&msg).(*json.RawMessage); ok {
			// The bytes as stored: PostgreSQL validated them as JSON when
			// they were produced, so the decoder's validating pass (a third of
			// a typed decode) is skipped. A copy: the claim's buffer is reused.
			*raw = append(json.RawMessage(nil), m.Payload...)
			return h(context.WithValue(ctx, metaKey{}, meta), &msg)
		}
		if err := dec.Unmarshal(m.Payload, &msg); err != nil {
			return decodeError(err, m.ID, msg)
		}
		return h(context.WithValue(ctx, metaKey{}, meta), &msg)
	}
}

// compileBindings normalizes a declared set and translates each pattern for
// the database. Patterns were validated already.
func compileBindings(patterns []string) (set, regexes []string) {
	set = topic.NormalizeSet(patterns)
	regexes = make([]string, len(set))
	for i, p := range set {
		c, _ := topic.Compile(p)
		regexes[i] = c.Regex()
	}
	return set, regexes
}
