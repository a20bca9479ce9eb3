// Package policy decides how a message is run: its timeout, retry curve and
// per-key concurrency, resolved from four layers, and how a handler's result
// turns into what happens next.
//
// It is internal so the engine's actors and the public API share one
// definition of every default and of the resolution order, and one function
// (Resolve) decides it.
//
// It is part of the engine's inside, not an API for users.
package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Concurrency is a message key's policy.
type Concurrency string

const (
	// Parallel: no constraint between messages of one key (the default).
	Parallel Concurrency = "parallel"
	// Exclusive: at most one message of a key in flight across the group.
	Exclusive Concurrency = "exclusive"
	// Ordered: exclusive, and a key's messages run in log order; a later one
	// waits while an earlier one is unresolved (retrying).
	Ordered Concurrency = "ordered"
)

// Valid reports whether c is a known policy or unset.
func (c Concurrency) Valid() bool {
	return c == "" || c == Parallel || c == Exclusive || c == Ordered
}

// Keyed reports whether the policy needs a message key.
func (c Concurrency) Keyed() bool { return c == Exclusive || c == Ordered }

// None, as MaxRetries or MaxDelays, means zero: 0 means unset.
const None = -1

// Options is a sparse layer of message options: a zero field is unset.
type Options struct {
	Timeout     time.Duration
	MaxRetries  int // None = no retries
	MaxDelays   int // None = no delays
	BaseDelay   time.Duration
	MaxDelay    time.Duration
	Exponent    float64
	Concurrency Concurrency
}

// Library defaults: what a field resolves to when no layer sets it.
const (
	DefaultTimeout          = 30 * time.Second
	DefaultMaxRetries       = 5
	DefaultMaxDelays        = 10
	DefaultBaseDelay        = time.Second
	DefaultMaxDelay         = time.Hour
	DefaultExponent         = 2.0
	DefaultInitialBackoff   = time.Second
	DefaultMaxRangeReclaims = 3
)

// Group is the group's layer: its Message defaults, its clamps, the
// concurrency override and the two fields that decide durable outcomes.
type Group struct {
	Message          Options
	Min, Max         Options
	Override         Concurrency
	InitialBackoff   time.Duration // 0 = default
	MaxRangeReclaims int           // 0 = default, None = quarantine on the first reclaim
	DeliveryLog      string        // LogOff, LogFailures (default, "") or LogAll
}

// Effective is a fully resolved set: every field has a value.
type Effective struct {
	Timeout     time.Duration
	MaxRetries  int
	MaxDelays   int
	BaseDelay   time.Duration
	MaxDelay    time.Duration
	Exponent    float64
	Concurrency Concurrency
}

// Resolve decides a message's effective options. Each field comes from the
// first layer that sets it: the message's own, the group's Message defaults,
// the library default; the result is then clamped to the group's
// MessageMin/MessageMax, whatever layer it came from, so a ceiling bounds
// defaults too. Finally the group's ConcurrencyOverride, when set, replaces
// the concurrency.
func Resolve(msg Options, g Group) Effective {
	e := Effective{
		Timeout:     clampDur(firstDur(msg.Timeout, g.Message.Timeout, DefaultTimeout), g.Min.Timeout, g.Max.Timeout),
		MaxRetries:  clampCount(firstCount(msg.MaxRetries, g.Message.MaxRetries, DefaultMaxRetries), g.Min.MaxRetries, g.Max.MaxRetries),
		MaxDelays:   clampCount(firstCount(msg.MaxDelays, g.Message.MaxDelays, DefaultMaxDelays), g.Min.MaxDelays, g.Max.MaxDelays),
		BaseDelay:   clampDur(firstDur(msg.BaseDelay, g.Message.BaseDelay, DefaultBaseDelay), g.Min.BaseDelay, g.Max.BaseDelay),
		MaxDelay:    clampDur(firstDur(msg.MaxDelay, g.Message.MaxDelay, DefaultMaxDelay), g.Min.MaxDelay, g.Max.MaxDelay),
		Exponent:    clampFloat(firstFloat(msg.Exponent, g.Message.Exponent, DefaultExponent), g.Min.Exponent, g.Max.Exponent),
		Concurrency: firstConc(msg.Concurrency, g.Message.Concurrency, Parallel),
	}
	if g.Override != "" {
		e.Concurrency = g.Override
	}
	return e
}

// InitialBackoff is the group's first retry delay.
func (g Group) InitialBackoffOrDefault() time.Duration {
	if g.InitialBackoff > 0 {
		return g.InitialBackoff
	}
	return DefaultInitialBackoff
}

// MaxRangeReclaimsOrDefault is how many reclaims a range survives before it
// is quarantined.
func (g Group) MaxRangeReclaimsOrDefault() int {
	switch {
	case g.MaxRangeReclaims == 0:
		return DefaultMaxRangeReclaims
	case g.MaxRangeReclaims < 0:
		return 0
	}
	return g.MaxRangeReclaims
}

// RetryDelay is the wait before the retry that follows failed attempt n
// (n ≥ 1): the group's initial backoff after the first failure, then the
// curve min(MaxDelay, BaseDelay × (n-1)^Exponent).
func (e Effective) RetryDelay(n int, initial time.Duration) time.Duration {
	if n <= 1 {
		return initial
	}
	d := float64(e.BaseDelay) * math.Pow(float64(n-1), e.Exponent)
	if d > float64(e.MaxDelay) || math.IsInf(d, 0) || math.IsNaN(d) {
		return e.MaxDelay
	}
	return time.Duration(d)
}

func firstDur(v ...time.Duration) time.Duration {
	for _, d := range v {
		if d != 0 {
			return d
		}
	}
	return 0
}

func firstFloat(v ...float64) float64 {
	for _, f := range v {
		if f != 0 {
			return f
		}
	}
	return 0
}

func firstConc(v ...Concurrency) Concurrency {
	for _, c := range v {
		if c != "" {
			return c
		}
	}
	return Parallel
}

// firstCount returns the first set count, None normalised to 0.
func firstCount(v ...int) int {
	for _, n := range v {
		if n != 0 {
			return max(n, 0)
		}
	}
	return 0
}

func clampDur(v, lo, hi time.Duration) time.Duration {
	if lo > 0 && v < lo {
		v = lo
	}
	if hi > 0 && v > hi {
		v = hi
	}
	return v
}

func clampFloat(v, lo, hi float64) float64 {
	if lo > 0 && v < lo {
		v = lo
	}
	if hi > 0 && v > hi {
		v = hi
	}
	return v
}

// clampCount clamps with set bounds only: None as a bound means 0.
func clampCount(v, lo, hi int) int {
	if lo != 0 && v < max(lo, 0) {
		v = max(lo, 0)
	}
	if hi != 0 && v > max(hi, 0) {
		v = max(hi, 0)
	}
	return v
}

// Validate rejects values no layer may hold.
func (o Options) Validate(field string) error {
	switch {
	case o.Timeout < 0:
		return fmt.Errorf("%s.Timeout %s: durations must not be negative", field, o.Timeout)
	case o.BaseDelay < 0:
		return fmt.Errorf("%s.Retry.BaseDelay %s: durations must not be negative", field, o.BaseDelay)
	case o.MaxDelay < 0:
		return fmt.Errorf("%s.Retry.MaxDelay %s: durations must not be negative", field, o.MaxDelay)
	case o.MaxRetries < None:
		return fmt.Errorf("%s.Retry.MaxRetries %d: must be positive, 0 (unset) or None (-1)", field, o.MaxRetries)
	case o.MaxDelays < None:
		return fmt.Errorf("%s.Retry.MaxDelays %d: must be positive, 0 (unset) or None (-1)", field, o.MaxDelays)
	case o.Exponent < 0 || math.IsNaN(o.Exponent) || math.IsInf(o.Exponent, 0):
		return fmt.Errorf("%s: Exponent must be a finite number ≥ 0", field)
	case !o.Concurrency.Valid():
		return fmt.Errorf("%s.Concurrency %q: unknown (want parallel, exclusive or ordered)", field, o.Concurrency)
	case o.BaseDelay > 0 && o.MaxDelay > 0 && o.MaxDelay < o.BaseDelay:
		return fmt.Errorf("%s: Retry.MaxDelay %s is below Retry.BaseDelay %s (MaxDelay caps the curve BaseDelay starts)", field, o.MaxDelay, o.BaseDelay)
	}
	return nil
}

// CheckBounds rejects a floor above its ceiling: every field set on both
// min and max (MessageMin, MessageMax) must have min ≤ max, or the clamp
// would silently pick one of them.
func CheckBounds(min, max Options, minField, maxField string) error {
	count := func(n int) int { return maxInt(n, 0) } // None is zero
	type pair struct {
		name     string
		set      bool
		above    bool
		min, max string
	}
	pairs := []pair{
		{"Timeout", min.Timeout > 0 && max.Timeout > 0, min.Timeout > max.Timeout, min.Timeout.String(), max.Timeout.String()},
		{"Retry.MaxRetries", min.MaxRetries != 0 && max.MaxRetries != 0, count(min.MaxRetries) > count(max.MaxRetries),
			fmt.Sprint(min.MaxRetries), fmt.Sprint(max.MaxRetries)},
		{"Retry.MaxDelays", min.MaxDelays != 0 && max.MaxDelays != 0, count(min.MaxDelays) > count(max.MaxDelays),
			fmt.Sprint(min.MaxDelays), fmt.Sprint(max.MaxDelays)},
		{"Retry.BaseDelay", min.BaseDelay > 0 && max.BaseDelay > 0, min.BaseDelay > max.BaseDelay, min.BaseDelay.String(), max.BaseDelay.String()},
		{"Retry.MaxDelay", min.MaxDelay > 0 && max.MaxDelay > 0, min.MaxDelay > max.MaxDelay, min.MaxDelay.String(), max.MaxDelay.String()},
		{"Retry.Exponent", min.Exponent > 0 && max.Exponent > 0, min.Exponent > max.Exponent, fmt.Sprint(min.Exponent), fmt.Sprint(max.Exponent)},
	}
	for _, p := range pairs {
		if p.set && p.above {
			return fmt.Errorf("%s.%s %s is above %s.%s %s: a floor must not exceed its ceiling", minField, p.name, p.min, maxField, p.name, p.max)
		}
	}
	return nil
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// doc is the stored, sparse form: snake_case keys, durations as "10s".
type doc struct {
	Timeout     string    `json:"timeout,omitempty"`
	Retry       *retryDoc `json:"retry,omitempty"`
	Concurrency string    `json:"concurrency,omitempty"`
}

type retryDoc struct {
	MaxRetries int     `json:"max_retries,omitempty"`
	MaxDelays  int     `json:"max_delays,omitempty"`
	BaseDelay  string  `json:"base_delay,omitempty"`
	MaxDelay   string  `json:"max_delay,omitempty"`
	Exponent   float64 `json:"exponent,omitempty"`
}

func durString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// MarshalJSON writes only the fields set.
func (o Options) MarshalJSON() ([]byte, error) {
	d := doc{Timeout: durString(o.Timeout), Concurrency: string(o.Concurrency)}
	r := retryDoc{MaxRetries: o.MaxRetries, MaxDelays: o.MaxDelays, BaseDelay: durString(o.BaseDelay),
		MaxDelay: durString(o.MaxDelay), Exponent: o.Exponent}
	if r != (retryDoc{}) {
		d.Retry = &r
	}
	return json.Marshal(d)
}

// UnmarshalJSON reads the sparse form.
func (o *Options) UnmarshalJSON(b []byte) error {
	var d doc
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	*o = Options{Concurrency: Concurrency(d.Concurrency)}
	var err error
	if o.Timeout, err = parseDur("timeout", d.Timeout); err != nil {
		return err
	}
	if r := d.Retry; r != nil {
		o.MaxRetries, o.MaxDelays, o.Exponent = r.MaxRetries, r.MaxDelays, r.Exponent
		if o.BaseDelay, err = parseDur("retry.base_delay", r.BaseDelay); err != nil {
			return err
		}
		if o.MaxDelay, err = parseDur("retry.max_delay", r.MaxDelay); err != nil {
			return err
		}
	}
	return nil
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

// Parse reads a stored options document; empty means no options.
func Parse(b []byte) (Options, error) {
	var o Options
	if len(b) == 0 {
		return o, nil
	}
	err := json.Unmarshal(b, &o)
	return o, err
}
