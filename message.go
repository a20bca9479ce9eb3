package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
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
// sparse with the message: a field left zero means "whatever the group and the
// library say".
type MessageOptions struct {
	// Timeout bounds one handler attempt: the handler's context is cancelled
	// at it and the attempt counts as a failure. Default 30s.
	Timeout time.Duration
	// Retry is the message's retry curve. Failed messages are recorded as
	// exception rows now; their retries follow the curve.
	Retry *RetryPolicy
}

// RetryPolicy is a retry curve: delay(n) = min(MaxDelay, BaseDelay * n^Exponent).
type RetryPolicy struct {
	MaxRetries int
	BaseDelay  time.Duration
	MaxDelay   time.Duration
	Exponent   float64
}

// DefaultMessageTimeout is the Timeout of a message that sets none.
const DefaultMessageTimeout = 30 * time.Second

type retryDoc struct {
	MaxRetries int     `json:"max_retries,omitempty"`
	BaseDelay  string  `json:"base_delay,omitempty"`
	MaxDelay   string  `json:"max_delay,omitempty"`
	Exponent   float64 `json:"exponent,omitempty"`
}

type messageDoc struct {
	Timeout string    `json:"timeout,omitempty"`
	Retry   *retryDoc `json:"retry,omitempty"`
}

func durString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func parseDur(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	return d, nil
}

// MarshalJSON writes only the fields set, snake_case, durations as "10s".
func (o MessageOptions) MarshalJSON() ([]byte, error) {
	doc := messageDoc{Timeout: durString(o.Timeout)}
	if r := o.Retry; r != nil {
		doc.Retry = &retryDoc{MaxRetries: r.MaxRetries, BaseDelay: durString(r.BaseDelay), MaxDelay: durString(r.MaxDelay), Exponent: r.Exponent}
	}
	return json.Marshal(doc)
}

// UnmarshalJSON reads the sparse document MarshalJSON writes.
func (o *MessageOptions) UnmarshalJSON(b []byte) error {
	var doc messageDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	var err error
	if o.Timeout, err = parseDur("timeout", doc.Timeout); err != nil {
		return err
	}
	o.Retry = nil
	if r := doc.Retry; r != nil {
		o.Retry = &RetryPolicy{MaxRetries: r.MaxRetries, Exponent: r.Exponent}
		if o.Retry.BaseDelay, err = parseDur("retry.base_delay", r.BaseDelay); err != nil {
			return err
		}
		if o.Retry.MaxDelay, err = parseDur("retry.max_delay", r.MaxDelay); err != nil {
			return err
		}
	}
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
	out := *o
	if out.Timeout == 0 {
		out.Timeout = under.Timeout
	}
	if out.Retry == nil {
		out.Retry = under.Retry
	}
	return &out
}

func (o *MessageOptions) validate() error {
	if o == nil {
		return nil
	}
	if o.Timeout < 0 {
		return fmt.Errorf("%w: MessageOptions.Timeout %s is negative", ErrInvalidConfig, o.Timeout)
	}
	if r := o.Retry; r != nil {
		if r.MaxRetries < 0 || r.BaseDelay < 0 || r.MaxDelay < 0 || r.Exponent < 0 {
			return fmt.Errorf("%w: RetryPolicy fields must not be negative", ErrInvalidConfig)
		}
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

// Meta describes the message a handler is running.
type Meta struct {
	ID         int64
	Stream     string
	Group      string
	RoutingKey string
	Key        string
	Version    int
	ProducedAt time.Time
	Options    MessageOptions
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
