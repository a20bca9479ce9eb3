package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/thejerf/suture/v4"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/outage"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/shutdown"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
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
	// Message holds the group's defaults, filling whatever a produced
	// message left unset. Library defaults fill the rest.
	Message *MessageOptions
	// MessageMin and MessageMax are floors and ceilings on every resolved
	// field, whichever layer set it. Unset fields are unbounded.
	MessageMin, MessageMax *MessageOptions
	// ConcurrencyOverride, when set, replaces every message's Concurrency.
	// It is pinned when a message is claimed: a claimed message finishes
	// under the policy it was claimed with.
	ConcurrencyOverride Concurrency
	// ExceptionInitialBackoff is the wait before a failed message's first
	// retry. Default 1s.
	ExceptionInitialBackoff time.Duration
	// MaxRangeReclaims is how many times a range may be reclaimed from dead
	// holders before it is quarantined (split into exception rows). Default
	// 3; NoRetries quarantines on the first reclaim.
	MaxRangeReclaims int
	// Bindings is the group's whole set of routing-key patterns (AMQP topic
	// syntax: words split on '.', '*' one word, '#' zero or more). nil or
	// empty is the whole stream; a group with any binding never receives a
	// message produced without a routing key. Compared as a set. A changed
	// set waits until no live instance holds the installed one (seed 0511);
	// once swapped in, it filters every later claim, including the messages
	// already in the log after the cursor (see the package doc).
	Bindings []string
	// DeliveryLog says which attempts the delivery log records, in the
	// transaction that settles them: DeliveryLogFailures (default: failed
	// and dead attempts), DeliveryLogAll, or DeliveryLogOff.
	DeliveryLog DeliveryLogMode
}

// DeliveryLogMode is a group's delivery-log mode.
type DeliveryLogMode string

// Delivery-log modes.
const (
	DeliveryLogOff      DeliveryLogMode = policy.LogOff
	DeliveryLogFailures DeliveryLogMode = policy.LogFailures
	DeliveryLogAll      DeliveryLogMode = policy.LogAll
)

// declared is the sparse stored form: only the fields the caller set.
func (c ConsumerConfig) declared() groupconfig.Declared {
	return groupconfig.Declared{
		Start: string(c.Start), Message: c.Message.layer(), MessageMin: c.MessageMin.layer(), MessageMax: c.MessageMax.layer(),
		ConcurrencyOverride: c.ConcurrencyOverride, MaxRangeReclaims: c.MaxRangeReclaims,
		DeliveryLog: string(c.DeliveryLog), ExceptionInitialBackoff: c.ExceptionInitialBackoff,
	}
}

// policyGroup is the group layer the engine resolves messages against.
func (c ConsumerConfig) policyGroup() policy.Group { return c.declared().Group() }

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
	for name, o := range map[string]*MessageOptions{"ConsumerConfig.Message": c.Message,
		"ConsumerConfig.MessageMin": c.MessageMin, "ConsumerConfig.MessageMax": c.MessageMax} {
		if err := o.validate(name); err != nil {
			return err
		}
	}
	if err := policy.CheckBounds(c.MessageMin.layer(), c.MessageMax.layer(), "ConsumerConfig.MessageMin", "ConsumerConfig.MessageMax"); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	for _, p := range c.Bindings {
		if err := topic.ValidatePattern(p); err != nil {
			return fmt.Errorf("%w: ConsumerConfig.Bindings: %v", ErrInvalidPattern, err)
		}
	}
	switch {
	case !c.ConcurrencyOverride.Valid():
		return fmt.Errorf("%w: ConsumerConfig.ConcurrencyOverride %q: want parallel, exclusive or ordered", ErrInvalidConfig, c.ConcurrencyOverride)
	case c.ExceptionInitialBackoff < 0:
		return fmt.Errorf("%w: ConsumerConfig.ExceptionInitialBackoff must not be negative", ErrInvalidConfig)
	case c.DeliveryLog != "" && c.DeliveryLog != DeliveryLogOff && c.DeliveryLog != DeliveryLogFailures && c.DeliveryLog != DeliveryLogAll:
		return fmt.Errorf("%w: ConsumerConfig.DeliveryLog %q: want off, failures or all", ErrInvalidConfig, c.DeliveryLog)
	case c.MaxRangeReclaims < NoRetries:
		return fmt.Errorf("%w: ConsumerConfig.MaxRangeReclaims must be positive, 0 (default) or NoRetries", ErrInvalidConfig)
	}
	return nil
}

// ConsumeOptions are one Consume session's instance options: how this
// process runs, free to differ per box. nil means the defaults.
type ConsumeOptions struct {
	// BatchLimit is the most messages one claim takes: a range of the log,
	// or retries beyond the free handler slots (leased and queued for the
	// slots; their holder dying spends none of their retries). Default 100;
	// at most MaxBatchLimit (10,000).
	BatchLimit int
	// QueueSize bounds messages claimed and not yet settled. Default
	// 2×BatchLimit; at least BatchLimit, at most MaxQueueSize (100,000).
	QueueSize int
	// MessageConcurrency is how many handlers run at once. Default 10; at
	// most MaxMessageConcurrency (10,000): each is a goroutine and a slot
	// of the handler pool, and a process needing more runs more sessions.
	MessageConcurrency int
	// ClaimPollRate is how often an instance looks for new messages (and
	// due retries) without being told. Producers notify on commit and an
	// idle instance claims at once, so while the client's listener is up an
	// idle instance skips its polls (decision 0038): a retry is claimed at
	// its due time, a dead instance's leases when the process's heartbeat
	// sees it lapse, and everything else at a backstop sweep every
	// 10 × InstanceTTL. The poll is the cadence while the instance has work
	// and while the listener is down. Default 1s.
	ClaimPollRate time.Duration
	// InstanceTTL is how long this instance's heartbeat and range leases
	// last without renewal; a crashed instance's ranges are reclaimed this
	// long after its last beat. Default 30s; at least 1s.
	InstanceTTL time.Duration
	// ShutdownTimeout bounds the graceful drain of in-flight handlers after
	// ctx ends. Default: the group's MessageMax.Timeout plus TimeoutGrace;
	// without that ceiling, the timeout of a message that sets none (the
	// group's Message.Timeout, clamped by MessageMin, else 30s) plus
	// TimeoutGrace. Re-derived when a refresh moves them (decision 0070).
	ShutdownTimeout time.Duration
	// DisableManager runs no maintenance manager in this session (see
	// Manager). Default false: the client runs one manager while it has a
	// session that does not disable it (one a process, however many
	// sessions), and each worker runs on as many managers of the fleet as
	// its WorkerConfig.Instances.
	DisableManager bool
	// DisableGracefulShutdown stops at once when ctx ends, leaving leases to
	// expire as after a crash.
	DisableGracefulShutdown bool
	// StallWarning is how long claims may find committed messages held back
	// by an open transaction before the stall is logged. Default 10s.
	StallWarning time.Duration
	// TimeoutGrace is how long a handler may run past its Timeout (its
	// context already cancelled) before it is abandoned and the instance
	// moves on. Default 1s.
	TimeoutGrace time.Duration
	// ConfigRefreshInterval is how often this instance reads its group's
	// declared config; a redeclaration reaches it within one interval.
	// Default 30s.
	ConfigRefreshInterval time.Duration
	// BindingRetryInterval is how often a session whose binding set waits
	// on live incumbents tries again. Default 10s. There is no timeout: it
	// waits forever, and is not ready meanwhile.
	BindingRetryInterval time.Duration
	// test holds the package's own tests' hooks (internal/hooks): nil
	// outside them.
	test *hooks.Hooks

	// Readiness, if set, carries this session's readiness level: ready
	// while it consumes and reaches its database, not ready while its
	// binding set waits, once a store call has failed and none has
	// succeeded for InstanceTTL (within InstanceTTL of an outage's start:
	// the heartbeat calls every third of it), and after Consume returns
	// (see Readiness.Handler for an HTTP readiness probe).
	Readiness *Readiness
	// Session, if set, is this call's own view: its Stats count from zero
	// (Consumer.Stats adds up every session). A Session serves one call.
	Session *Session
}

// ShutdownGrace is the fixed time a stopping Consume has after its
// ShutdownTimeout: to hand unfinished work back, stop its actors and give
// its instance rows back. Consume returns within ShutdownTimeout plus
// ShutdownGrace of its context ending, whatever the database does.
const ShutdownGrace = shutdown.Grace

// configReadBound bounds one batched config read of a client's sessions
// (refresher.Reads).
const configReadBound = 10 * time.Second

// Upper bounds of the instance options: every queue and pool a session
// makes is bounded.
const (
	MaxBatchLimit         = 10000
	MaxQueueSize          = 100000
	MaxMessageConcurrency = 10000
)

// Default instance options.
const (
	DefaultBatchLimit         = 100
	DefaultMessageConcurrency = 10
	DefaultClaimPollRate      = time.Second
	DefaultInstanceTTL        = 30 * time.Second
	// DefaultBindingRetryInterval is how often a waiting binding
	// declaration tries again.
	DefaultBindingRetryInterval = 10 * time.Second
	// DefaultConfigRefreshInterval is how often a running instance reads
	// its group's declared config.
	DefaultConfigRefreshInterval = 30 * time.Second
	DefaultStallWarning          = 10 * time.Second
	DefaultTimeoutGrace          = time.Second
	// keyBusyDelay is how long a keyed message parks before trying a busy
	// key again.
	keyBusyDelay = 100 * time.Millisecond
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
	if out.ConfigRefreshInterval == 0 {
		out.ConfigRefreshInterval = DefaultConfigRefreshInterval
	}
	if out.BindingRetryInterval == 0 {
		out.BindingRetryInterval = DefaultBindingRetryInterval
	}
	if out.StallWarning == 0 {
		out.StallWarning = DefaultStallWarning
	}
	if out.TimeoutGrace == 0 {
		out.TimeoutGrace = DefaultTimeoutGrace
	}
	return out
}

func (o ConsumeOptions) validate() error {
	switch {
	case o.BatchLimit < 1 || o.BatchLimit > MaxBatchLimit:
		return fmt.Errorf("%w: ConsumeOptions.BatchLimit %d outside 1..%d", ErrInvalidConfig, o.BatchLimit, MaxBatchLimit)
	case o.QueueSize < o.BatchLimit:
		return fmt.Errorf("%w: ConsumeOptions.QueueSize %d is below BatchLimit %d", ErrInvalidConfig, o.QueueSize, o.BatchLimit)
	case o.QueueSize > MaxQueueSize:
		return fmt.Errorf("%w: ConsumeOptions.QueueSize %d is above %d", ErrInvalidConfig, o.QueueSize, MaxQueueSize)
	case o.MessageConcurrency < 1 || o.MessageConcurrency > MaxMessageConcurrency:
		return fmt.Errorf("%w: ConsumeOptions.MessageConcurrency %d outside 1..%d", ErrInvalidConfig, o.MessageConcurrency, MaxMessageConcurrency)
	case o.ClaimPollRate < time.Millisecond:
		return fmt.Errorf("%w: ConsumeOptions.ClaimPollRate %s is below 1ms", ErrInvalidConfig, o.ClaimPollRate)
	case o.InstanceTTL < time.Second:
		return fmt.Errorf("%w: ConsumeOptions.InstanceTTL %s is below 1s", ErrInvalidConfig, o.InstanceTTL)
	case o.BindingRetryInterval < time.Millisecond:
		return fmt.Errorf("%w: ConsumeOptions.BindingRetryInterval %s is below 1ms", ErrInvalidConfig, o.BindingRetryInterval)
	case o.ConfigRefreshInterval < time.Millisecond:
		return fmt.Errorf("%w: ConsumeOptions.ConfigRefreshInterval %s is below 1ms", ErrInvalidConfig, o.ConfigRefreshInterval)
	case o.ShutdownTimeout < 0 || o.StallWarning < 0 || o.TimeoutGrace < 0:
		return fmt.Errorf("%w: ConsumeOptions durations must not be negative", ErrInvalidConfig)
	}
	return nil
}

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
	ended   Stats                       // the counters of sessions that returned
	live    map[*claimer.Stats]struct{} // the counters of sessions running

	// leftovers are ranges a session stopped during an outage could not
	// hand back: the consumer's next sessions in this process record what
	// they settled (claimer.Leftovers).
	leftovers claimer.Leftovers
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
		if old, changed, err = declare(ctx, g.ID, docs, declaredBy(), h.s.c.dbNow()); err != nil {
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

// Stats is a snapshot of counters: a Consumer's (Consumer.Stats:
// cumulative over every Consume session of this process, so metrics built on
// them only ever go up) or one session's (Session.Stats: from zero).
type Stats struct {
	Claimed     int64 // messages handed to handlers from ranges
	Reclaimed   int64 // ranges taken over from a dead holder
	Quarantined int64 // ranges split into exception rows
	Succeeded   int64
	Failed      int64 // failed attempts: errors, panics, timeouts
	Dead        int64 // messages that became dead letters
	Delayed     int64 // Delay results that spent no retry
	Deferred    int64 // keyed messages parked behind a busy or blocked key
	Retried     int64 // exception attempts started
	Panics      int64
	TimedOut    int64
	Abandoned   int64 // handlers that ignored their context past TimeoutGrace
	Committed   int64 // ranges committed
	LeasesLost  int64 // writes fenced off by a reclaimer
	Stalls      int64 // claims held back by an open transaction past StallWarning
	// ProgressRecorded counts settled prefixes recorded on ranges still in
	// flight (at most one write per claim poll), which a reclaimer skips.
	ProgressRecorded int64
	// AlertsDropped counts alerts not produced because the session's
	// bounded alert queue was full (the conditions were logged all the same).
	AlertsDropped int64
	// KeyGates counts the times the range claimer was granted its group's
	// key gate: it then held every exclusive key without a lease row each,
	// as the only session of the group (decision 0051). KeyGatesGivenUp
	// counts the times it gave the gate up because another session of
	// the group started or a keyed message waited for a retry.
	KeyGates, KeyGatesGivenUp int64
}

// statsOf reads an actor counter set.
func statsOf(s *claimer.Stats) Stats {
	return Stats{
		Claimed: s.Claimed.Load(), Reclaimed: s.Reclaimed.Load(), Quarantined: s.Quarantined.Load(),
		Succeeded: s.Succeeded.Load(), Failed: s.Failed.Load(), Dead: s.Dead.Load(), Delayed: s.Delayed.Load(),
		Deferred: s.Deferred.Load(), Retried: s.Retried.Load(), Panics: s.Panics.Load(), TimedOut: s.TimedOut.Load(),
		Abandoned: s.Abandoned.Load(), Committed: s.Committed.Load(), LeasesLost: s.LeasesLost.Load(), Stalls: s.Stalls.Load(),
		ProgressRecorded: s.ProgressRecorded.Load(), AlertsDropped: s.AlertsDropped.Load(),
		KeyGates: s.KeyGates.Load(), KeyGatesGivenUp: s.KeyGatesGivenUp.Load(),
	}
}

// plus adds two snapshots field by field.
func (a Stats) plus(b Stats) Stats {
	return Stats{
		Claimed: a.Claimed + b.Claimed, Reclaimed: a.Reclaimed + b.Reclaimed, Quarantined: a.Quarantined + b.Quarantined,
		Succeeded: a.Succeeded + b.Succeeded, Failed: a.Failed + b.Failed, Dead: a.Dead + b.Dead, Delayed: a.Delayed + b.Delayed,
		Deferred: a.Deferred + b.Deferred, Retried: a.Retried + b.Retried, Panics: a.Panics + b.Panics, TimedOut: a.TimedOut + b.TimedOut,
		Abandoned: a.Abandoned + b.Abandoned, Committed: a.Committed + b.Committed, LeasesLost: a.LeasesLost + b.LeasesLost,
		Stalls: a.Stalls + b.Stalls, ProgressRecorded: a.ProgressRecorded + b.ProgressRecorded, AlertsDropped: a.AlertsDropped + b.AlertsDropped,
		KeyGates: a.KeyGates + b.KeyGates, KeyGatesGivenUp: a.KeyGatesGivenUp + b.KeyGatesGivenUp,
	}
}

// Stats returns the consumer's counters, cumulative over every Consume
// session of this process (ended ones and those running). A session's own
// counters, from zero, are its Session's (ConsumeOptions.Session).
func (c *Consumer[T]) Stats() Stats {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	sum := c.ended
	for s := range c.live {
		sum = sum.plus(statsOf(s))
	}
	return sum
}

// track adds a session's counters to the consumer's and returns the
// function that folds them into the ended sessions' total when it ends.
func (c *Consumer[T]) track(s *claimer.Stats) (end func()) {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	if c.live == nil {
		c.live = map[*claimer.Stats]struct{}{}
	}
	c.live[s] = struct{}{}
	return func() {
		c.statsMu.Lock()
		defer c.statsMu.Unlock()
		delete(c.live, s)
		c.ended = c.ended.plus(statsOf(s))
	}
}

// Session is one Consume call, seen from outside: its counters start at
// zero when the call starts and stay readable after it returns (seed 001: a
// Consume call is one session). A Session serves one Consume call; pass a
// new one to each.
type Session struct {
	stats claimer.Stats
	used  atomic.Bool
}

// NewSession returns a Session to pass in ConsumeOptions.Session.
func NewSession() *Session { return &Session{} }

// Stats returns the session's counters.
func (s *Session) Stats() Stats { return statsOf(&s.stats) }

// Handler handles one message. nil is success. An error is a failure: the
// message is retried on its curve, then dead. Terminal(err) is dead at once;
// Delay(d) runs it again after d without spending a retry. A panic is a
// failure, never a crash. The handler's ctx ends at the message's Timeout.
//
// msg is decoded with the client's Decoder (ClientConfig.Decoder: FastJSON
// by default, which keeps encoding/json's rules). A consumer of
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
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return err
	}
	stats := &claimer.Stats{}
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
		Workers: c.group.Workers, DeclaredBy: declaredBy(), Handler: c.adapt(handler), Slabs: client.slabsFor(),
		Options: engine.Options{
			BatchLimit: o.BatchLimit, QueueSize: o.QueueSize, MessageConcurrency: o.MessageConcurrency,
			ClaimPollRate: o.ClaimPollRate, InstanceTTL: o.InstanceTTL, ShutdownTimeout: o.ShutdownTimeout,
			DisableGracefulShutdown: o.DisableGracefulShutdown, StallAfter: o.StallWarning,
			TimeoutGrace: o.TimeoutGrace, KeyBusyDelay: keyBusyDelay, ConfigRefreshInterval: o.ConfigRefreshInterval,
			BindingRetryInterval: o.BindingRetryInterval,
		},
		Patterns: c.patterns, Regexes: c.regexes, DeclaredAt: c.waitingSince(), Declared: c.declared, Hub: hubFor(client.hub, o.test), Beats: client.beats, Reads: client.configs,
		Leftovers: &c.leftovers,
		Alerts:    client.publishAlerts(c.s.name, c.group.Name, c.patterns),
		Clock:     client.cfg.Clock, Logger: client.cfg.Logger, Stats: stats,
		Hooks: o.test,
	})
}

// adapt decodes a stored message into T and hands the handler its Meta.
func (c *Consumer[T]) adapt(h Handler[T]) claimer.Handler {
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
	return func(ctx context.Context, d *claimer.Delivery) error {
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

// hubFor is the session's wake-up hub: the client's, unless the test hooks
// run the session without it.
func hubFor(hub *engine.Hub, h *hooks.Hooks) *engine.Hub {
	if h != nil && h.NoListener {
		return nil
	}
	return hub
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
