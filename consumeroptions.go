package sqlstreams

import (
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/hooks"
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
