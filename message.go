package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
)

// Versioned is implemented by message types that declare their schema
// version. A type that does not implement it is version 1. A consumer reads
// only its own type's version; a message of another version becomes an
// exception row for the group instead of a decode it cannot make sense of.
type Versioned interface {
	SchemaVersion() int
}

func schemaVersion[T any]() int {
	var zero T
	if v, ok := any(zero).(Versioned); ok {
		return v.SchemaVersion()
	}
	if v, ok := any(&zero).(Versioned); ok {
		return v.SchemaVersion()
	}
	return 1
}

// MessageOptions are what a message asks of its consumers. They are stored
// sparse with the message: a zero field means "whatever the group and the
// library say". The same struct is the group's defaults (ConsumerConfig.Message)
// and its clamps (MessageMin, MessageMax).
type MessageOptions struct {
	// Timeout bounds one handler attempt: the handler's context is cancelled
	// at it and the attempt counts as a failure. Default 30s.
	Timeout time.Duration
	// Retry is the retry curve. Defaults per field: see RetryPolicy.
	Retry *RetryPolicy
	// Concurrency is the message key's policy. Default Parallel. Exclusive
	// and Ordered need a message key.
	Concurrency Concurrency
}

// RetryPolicy is a retry curve. After the first failure a message waits the
// group's ExceptionInitialBackoff; after failure n ≥ 2 it waits
// min(MaxDelay, BaseDelay × (n-1)^Exponent). A zero field is unset.
type RetryPolicy struct {
	// MaxRetries is how many retries follow the first attempt before the
	// message is dead. Default 5; NoRetries for none.
	MaxRetries int
	// MaxDelays bounds Delay results that spend no retry. Default 10;
	// NoRetries for none. Past it a Delay counts as a failure.
	MaxDelays int
	// BaseDelay scales the curve. Default 1s.
	BaseDelay time.Duration
	// MaxDelay caps it. Default 1h.
	MaxDelay time.Duration
	// Exponent shapes it. Default 2.
	Exponent float64
}

// NoRetries, as RetryPolicy.MaxRetries or MaxDelays, means zero (0 is unset).
const NoRetries = policy.None

// Concurrency is a message key's policy.
type Concurrency = policy.Concurrency

const (
	// Parallel: no constraint between messages of one key (default).
	Parallel = policy.Parallel
	// Exclusive: at most one message of a key in flight across the group.
	Exclusive = policy.Exclusive
	// Ordered: exclusive, and a key's messages run in log order; a later
	// one waits while an earlier one is retrying.
	Ordered = policy.Ordered
)

// DefaultMessageTimeout is the Timeout of a message nothing else sets.
const DefaultMessageTimeout = policy.DefaultTimeout

// layer converts to the policy package's sparse form.
func (o *MessageOptions) layer() policy.Options {
	if o == nil {
		return policy.Options{}
	}
	p := policy.Options{Timeout: o.Timeout, Concurrency: o.Concurrency}
	if r := o.Retry; r != nil {
		p.MaxRetries, p.MaxDelays, p.BaseDelay, p.MaxDelay, p.Exponent = r.MaxRetries, r.MaxDelays, r.BaseDelay, r.MaxDelay, r.Exponent
	}
	return p
}

func fromLayer(p policy.Options) MessageOptions {
	o := MessageOptions{Timeout: p.Timeout, Concurrency: p.Concurrency}
	r := RetryPolicy{MaxRetries: p.MaxRetries, MaxDelays: p.MaxDelays, BaseDelay: p.BaseDelay, MaxDelay: p.MaxDelay, Exponent: p.Exponent}
	if r != (RetryPolicy{}) {
		o.Retry = &r
	}
	return o
}

// MarshalJSON writes only the fields set, snake_case, durations as "10s".
func (o MessageOptions) MarshalJSON() ([]byte, error) { return json.Marshal(o.layer()) }

// UnmarshalJSON reads the sparse document MarshalJSON writes.
func (o *MessageOptions) UnmarshalJSON(b []byte) error {
	p, err := policy.Parse(b)
	if err != nil {
		return err
	}
	*o = fromLayer(p)
	return nil
}

// merge returns o with every unset field taken from under.
func (o *MessageOptions) merge(under *MessageOptions) *MessageOptions {
	if o == nil {
		return under
	}
	if under == nil {
		return o
	}
	a, b := o.layer(), under.layer()
	if a.Timeout == 0 {
		a.Timeout = b.Timeout
	}
	if a.MaxRetries == 0 {
		a.MaxRetries = b.MaxRetries
	}
	if a.MaxDelays == 0 {
		a.MaxDelays = b.MaxDelays
	}
	if a.BaseDelay == 0 {
		a.BaseDelay = b.BaseDelay
	}
	if a.MaxDelay == 0 {
		a.MaxDelay = b.MaxDelay
	}
	if a.Exponent == 0 {
		a.Exponent = b.Exponent
	}
	if a.Concurrency == "" {
		a.Concurrency = b.Concurrency
	}
	out := fromLayer(a)
	return &out
}

func (o *MessageOptions) validate(field string) error {
	if err := o.layer().Validate(field); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return nil
}

// encode returns the sparse document, or nil when nothing is set.
func (o *MessageOptions) encode() ([]byte, error) {
	if o == nil {
		return nil, nil
	}
	b, err := json.Marshal(o)
	if err != nil || string(b) == "{}" {
		return nil, err
	}
	return b, nil
}

// Terminal marks err as not worth retrying: the message is dead at once
// (a dead letter, with err as its last error). Terminal(nil) is nil, like
// the errors it wraps: a handler that returns it has succeeded.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &policy.TerminalError{Err: err}
}

// Delay asks for the message to run again after d without spending a retry,
// at most MaxDelays times (past that a Delay counts as a failure). d ≤ 0
// means "again as soon as possible": the message is due at once, still
// without spending a retry, and still counted against MaxDelays.
func Delay(d time.Duration) error { return &policy.DelayError{D: d} }

// Meta describes the message a handler is running.
type Meta struct {
	ID         int64
	Position   Position
	Stream     string
	Group      string
	RoutingKey string
	Key        string
	Version    int
	ProducedAt time.Time
	// Attempt is 1 on the first run; a retry after n failures is n+1.
	Attempt int
	// Delays is how many Delay results this message has used.
	Delays int
	// Concurrency is the policy the message was claimed under.
	Concurrency Concurrency
	// Timeout is this attempt's timeout.
	Timeout time.Duration
	// Headers are the message's headers as produced (nil: none).
	Headers Headers
}

// Position is a message's place in its stream's log: the producing
// transaction's id, then the message id. Log order is Position order.
type Position struct {
	Xid int64 `json:"xid"`
	ID  int64 `json:"id"`
}

type metaKey struct{}

// MetaFromContext returns the Meta of the message whose handler ctx belongs
// to; ok is false outside a handler.
func MetaFromContext(ctx context.Context) (Meta, bool) {
	m, ok := ctx.Value(metaKey{}).(*Meta)
	if !ok {
		return Meta{}, false
	}
	return *m, true
}
