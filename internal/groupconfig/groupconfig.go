// Package groupconfig is the stored form of a consumer group's config: the
// sparse documents Register writes to the group's worker_config rows (each
// worker's fields on its own row), how they read back into the policy the
// claimers run under, how two declarations differ field by field, and the
// mutex-guarded snapshot the refresher swaps and the claimers read.
//
// It is part of the engine's inside, not an API for users.
package groupconfig

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
)

// Worker names.
const (
	MessageConsumer   = "message_consumer"
	ExceptionConsumer = "exception_consumer"
)

// Workers are the group-owned workers whose rows carry its config.
var Workers = []string{MessageConsumer, ExceptionConsumer}

// Declared is a group's declaration: only what the declarer set.
type Declared struct {
	Start                   string
	Message                 policy.Options
	MessageMin              policy.Options
	MessageMax              policy.Options
	ConcurrencyOverride     policy.Concurrency
	MaxRangeReclaims        int
	DeliveryLog             string
	ExceptionInitialBackoff time.Duration
}

type messageDoc struct {
	Start               string          `json:"start,omitempty"`
	Message             *policy.Options `json:"message,omitempty"`
	MessageMin          *policy.Options `json:"message_min,omitempty"`
	MessageMax          *policy.Options `json:"message_max,omitempty"`
	ConcurrencyOverride string          `json:"concurrency_override,omitempty"`
	MaxRangeReclaims    int             `json:"max_range_reclaims,omitempty"`
	DeliveryLog         string          `json:"delivery_log,omitempty"`
}

type exceptionDoc struct {
	ExceptionInitialBackoff string `json:"exception_initial_backoff,omitempty"`
}

func optsOrNil(o policy.Options) *policy.Options {
	if o == (policy.Options{}) {
		return nil
	}
	return &o
}

// Docs splits the declaration into its workers' sparse documents.
func (d Declared) Docs() (map[string][]byte, error) {
	m, err := json.Marshal(messageDoc{
		Start: d.Start, Message: optsOrNil(d.Message), MessageMin: optsOrNil(d.MessageMin), MessageMax: optsOrNil(d.MessageMax),
		ConcurrencyOverride: string(d.ConcurrencyOverride), MaxRangeReclaims: d.MaxRangeReclaims, DeliveryLog: d.DeliveryLog,
	})
	if err != nil {
		return nil, fmt.Errorf("encode message_consumer document: %w", err)
	}
	e := exceptionDoc{}
	if d.ExceptionInitialBackoff != 0 {
		e.ExceptionInitialBackoff = d.ExceptionInitialBackoff.String()
	}
	x, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode exception_consumer document: %w", err)
	}
	return map[string][]byte{MessageConsumer: m, ExceptionConsumer: x}, nil
}

// FromDocs reads the workers' documents back. A missing or empty document is
// an empty declaration.
func FromDocs(docs map[string][]byte) (Declared, error) {
	var d Declared
	if b := docs[MessageConsumer]; len(b) > 0 {
		var m messageDoc
		if err := json.Unmarshal(b, &m); err != nil {
			return d, fmt.Errorf("message_consumer document: %w", err)
		}
		d.Start, d.ConcurrencyOverride, d.MaxRangeReclaims, d.DeliveryLog =
			m.Start, policy.Concurrency(m.ConcurrencyOverride), m.MaxRangeReclaims, m.DeliveryLog
		for _, p := range []struct {
			src *policy.Options
			dst *policy.Options
		}{{m.Message, &d.Message}, {m.MessageMin, &d.MessageMin}, {m.MessageMax, &d.MessageMax}} {
			if p.src != nil {
				*p.dst = *p.src
			}
		}
	}
	if b := docs[ExceptionConsumer]; len(b) > 0 {
		var e exceptionDoc
		if err := json.Unmarshal(b, &e); err != nil {
			return d, fmt.Errorf("exception_consumer document: %w", err)
		}
		if e.ExceptionInitialBackoff != "" {
			v, err := time.ParseDuration(e.ExceptionInitialBackoff)
			if err != nil {
				return d, fmt.Errorf("exception_consumer document: exception_initial_backoff: %w", err)
			}
			d.ExceptionInitialBackoff = v
		}
	}
	return d, nil
}

// Group is the policy layer the claimers resolve messages against.
func (d Declared) Group() policy.Group {
	return policy.Group{
		Message: d.Message, Min: d.MessageMin, Max: d.MessageMax, Override: d.ConcurrencyOverride,
		InitialBackoff: d.ExceptionInitialBackoff, MaxRangeReclaims: d.MaxRangeReclaims, DeliveryLog: d.DeliveryLog,
	}
}

// Change is one field that differs between two declarations. Its String
// names the field as ConsumerConfig's JSON document does, not the worker
// row that stores it: the rows are the storage's, one declaration is what
// a user wrote.
type Change struct {
	Worker string // the worker row whose document holds the field
	Field  string // dotted path in the document, e.g. message.retry.max_retries
	Old    string // "" when unset
	New    string
}

func (c Change) String() string {
	show := func(v string) string {
		if v == "" {
			return "(unset)"
		}
		return v
	}
	return fmt.Sprintf("%s: %s → %s", c.Field, show(c.Old), show(c.New))
}

// Diff lists the fields that differ between two sets of documents, per
// worker (all group workers when none are named).
func Diff(old, new map[string][]byte, workers ...string) ([]Change, error) {
	if len(workers) == 0 {
		workers = Workers
	}
	var out []Change
	for _, w := range workers {
		a, err := flatten(old[w])
		if err != nil {
			return nil, fmt.Errorf("%s stored document: %w", w, err)
		}
		b, err := flatten(new[w])
		if err != nil {
			return nil, fmt.Errorf("%s declared document: %w", w, err)
		}
		var keys []string
		for k := range a {
			keys = append(keys, k)
		}
		for k := range b {
			if _, ok := a[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if a[k] != b[k] {
				out = append(out, Change{Worker: w, Field: k, Old: a[k], New: b[k]})
			}
		}
	}
	return out, nil
}

// DiffDoc lists the fields that differ between two versions of one
// document (a stream's config, say).
func DiffDoc(old, new []byte) ([]Change, error) {
	return Diff(map[string][]byte{"": old}, map[string][]byte{"": new}, "")
}

// flatten maps a JSON document to dotted paths and their values as text.
func flatten(b []byte) (map[string]string, error) {
	out := map[string]string{}
	if len(b) == 0 {
		return out, nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok {
			for k, child := range m {
				walk(strings.TrimPrefix(prefix+"."+k, "."), child)
			}
			return
		}
		enc, _ := json.Marshal(v)
		out[prefix] = strings.Trim(string(enc), `"`)
	}
	walk("", v)
	return out, nil
}

// Snapshot is the in-memory copy of a group's config: written by the
// refresher, read by the claimers on every claim, never by a database read.
type Snapshot struct {
	mu       sync.RWMutex
	declared Declared
	group    policy.Group
}

// NewSnapshot returns a snapshot holding d.
func NewSnapshot(d Declared) *Snapshot {
	s := &Snapshot{}
	s.Set(d)
	return s
}

// Set swaps in a new declaration and reports whether it differed.
func (s *Snapshot) Set(d Declared) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := !equal(s.declared, d)
	s.declared, s.group = d, d.Group()
	return changed
}

// Group returns the policy layer in force.
func (s *Snapshot) Group() policy.Group {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.group
}

// Declared returns the declaration in force.
func (s *Snapshot) Declared() Declared {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.declared
}

func equal(a, b Declared) bool {
	da, _ := a.Docs()
	db, _ := b.Docs()
	for _, w := range Workers {
		if !slices.Equal(da[w], db[w]) {
			return false
		}
	}
	return true
}
