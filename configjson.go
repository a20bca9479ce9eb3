package sqlstreams

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
)

// consumerConfigDoc is ConsumerConfig's JSON document: the fields of the
// stored worker documents as one object, snake_case, durations as "10s",
// unset fields left out.
//
//	{
//	  "start": "beginning",
//	  "message": {"timeout": "10s", "retry": {"max_retries": 3, "base_delay": "1s",
//	              "max_delay": "1h0m0s", "exponent": 2, "max_delays": 10}, "concurrency": "exclusive"},
//	  "message_min": {"timeout": "1s"},
//	  "message_max": {"timeout": "5m0s"},
//	  "concurrency_override": "ordered",
//	  "exception_initial_backoff": "1s",
//	  "max_range_reclaims": 3,
//	  "delivery_log": "failures",
//	  "bindings": ["orders.*.eu", "refunds.#"]
//	}
type consumerConfigDoc struct {
	Start                   Start           `json:"start,omitempty"`
	Message                 *MessageOptions `json:"message,omitempty"`
	MessageMin              *MessageOptions `json:"message_min,omitempty"`
	MessageMax              *MessageOptions `json:"message_max,omitempty"`
	ConcurrencyOverride     Concurrency     `json:"concurrency_override,omitempty"`
	ExceptionInitialBackoff string          `json:"exception_initial_backoff,omitempty"`
	MaxRangeReclaims        int             `json:"max_range_reclaims,omitempty"`
	DeliveryLog             DeliveryLogMode `json:"delivery_log,omitempty"`
	Bindings                []string        `json:"bindings,omitempty"`
}

// strictOptions mirrors MessageOptions' document, only to reject fields it
// does not have (the stored form itself stays lenient, so that an older
// version reads a newer one's documents during a rollback).
type strictOptions struct {
	Timeout string `json:"timeout,omitempty"`
	Retry   *struct {
		MaxRetries int     `json:"max_retries,omitempty"`
		MaxDelays  int     `json:"max_delays,omitempty"`
		BaseDelay  string  `json:"base_delay,omitempty"`
		MaxDelay   string  `json:"max_delay,omitempty"`
		Exponent   float64 `json:"exponent,omitempty"`
	} `json:"retry,omitempty"`
	Concurrency string `json:"concurrency,omitempty"`
}

// MarshalJSON writes the config document `sqlstreams inspect -o json`
// shows and `sqlstreams groups declare -f` reads: only the fields set.
func (c ConsumerConfig) MarshalJSON() ([]byte, error) {
	d := consumerConfigDoc{Start: c.Start, Message: nonEmpty(c.Message), MessageMin: nonEmpty(c.MessageMin), MessageMax: nonEmpty(c.MessageMax),
		ConcurrencyOverride: c.ConcurrencyOverride, MaxRangeReclaims: c.MaxRangeReclaims, DeliveryLog: c.DeliveryLog, Bindings: c.Bindings}
	if c.ExceptionInitialBackoff != 0 {
		d.ExceptionInitialBackoff = c.ExceptionInitialBackoff.String()
	}
	return json.Marshal(d)
}

func nonEmpty(o *MessageOptions) *MessageOptions {
	if o == nil || o.layer() == (policy.Options{}) {
		return nil
	}
	return o
}

// UnmarshalJSON reads the document MarshalJSON writes. It is strict: an
// unknown field (a typo) is an ErrInvalidConfig naming it, and so is a
// duration that does not parse. It does not validate values; Register and
// Declare do.
func (c *ConsumerConfig) UnmarshalJSON(b []byte) error {
	var d consumerConfigDoc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return fmt.Errorf("%w: consumer config document: %v", ErrInvalidConfig, err)
	}
	var raw struct {
		Message    json.RawMessage `json:"message"`
		MessageMin json.RawMessage `json:"message_min"`
		MessageMax json.RawMessage `json:"message_max"`
	}
	_ = json.Unmarshal(b, &raw) // decoded above already
	for name, r := range map[string]json.RawMessage{"message": raw.Message, "message_min": raw.MessageMin, "message_max": raw.MessageMax} {
		if len(r) == 0 || string(r) == "null" {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(r))
		dec.DisallowUnknownFields()
		var s strictOptions
		if err := dec.Decode(&s); err != nil {
			return fmt.Errorf("%w: consumer config document: %s: %v", ErrInvalidConfig, name, err)
		}
	}
	out := ConsumerConfig{Start: d.Start, Message: d.Message, MessageMin: d.MessageMin, MessageMax: d.MessageMax,
		ConcurrencyOverride: d.ConcurrencyOverride, MaxRangeReclaims: d.MaxRangeReclaims, DeliveryLog: d.DeliveryLog, Bindings: d.Bindings}
	if d.ExceptionInitialBackoff != "" {
		v, err := time.ParseDuration(d.ExceptionInitialBackoff)
		if err != nil {
			return fmt.Errorf("%w: consumer config document: exception_initial_backoff %q: %v", ErrInvalidConfig, d.ExceptionInitialBackoff, err)
		}
		out.ExceptionInitialBackoff = v
	}
	*c = out
	return nil
}

// configOf is the ConsumerConfig a stored declaration and binding set
// stand for.
func configOf(d groupconfig.Declared, bindings []string) ConsumerConfig {
	opts := func(p MessageOptions) *MessageOptions {
		if p.layer() == (policy.Options{}) {
			return nil
		}
		return &p
	}
	c := ConsumerConfig{Start: Start(d.Start), Message: opts(fromLayer(d.Message)), MessageMin: opts(fromLayer(d.MessageMin)),
		MessageMax: opts(fromLayer(d.MessageMax)), ConcurrencyOverride: d.ConcurrencyOverride, ExceptionInitialBackoff: d.ExceptionInitialBackoff,
		MaxRangeReclaims: d.MaxRangeReclaims, DeliveryLog: DeliveryLogMode(d.DeliveryLog)}
	if len(bindings) > 0 {
		c.Bindings = append([]string(nil), bindings...)
	}
	return c
}
