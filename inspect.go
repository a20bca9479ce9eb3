package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Inspection shows a group's config in both layers — what was declared and
// what is in effect — with its declaration history and its live instances.
type Inspection struct {
	Group  string `json:"group"`
	Stream string `json:"stream"`
	// Config is the declared config as one document with the installed
	// binding set: the shape Group.Declare and `sqlstreams groups declare`
	// take, so that what Inspect shows can be edited and declared again.
	Config ConsumerConfig `json:"config"`
	// Declared is each worker's stored document, sparse: only what the last
	// declaration set.
	Declared map[string]json.RawMessage `json:"declared"`
	// Effective lists every setting with its value and where it came from.
	Effective []Setting `json:"effective"`
	// Log is the declaration history, newest first.
	Log []ConfigChange `json:"log"`
	// Instances are the group's worker instances, live ones first.
	Instances []Instance `json:"instances"`
	// ReadFrom says whether a replica served the inspection (ReadPool).
	ReadFrom
}

// Setting is one effective value.
type Setting struct {
	Field  string `json:"field"`
	Value  string `json:"value"`
	Source string `json:"source"` // "declared", "default", or "clamped" (moved by MessageMin/MessageMax)
}

// ConfigChange is one stored declaration of one worker's document.
type ConfigChange struct {
	Worker     string          `json:"worker"`
	Document   json.RawMessage `json:"document"`
	DeclaredBy string          `json:"declared_by"`
	DeclaredAt time.Time       `json:"declared_at"`
}

// Instance is a process doing one of the group's jobs.
type Instance struct {
	ID          string    `json:"id"`
	Worker      string    `json:"worker"`
	DeclaredBy  string    `json:"declared_by"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	Live        bool      `json:"live"`
}

// Inspect reads the group's config as stored now (not this process's copy).
func (c *Consumer[T]) Inspect(ctx context.Context) (*Inspection, error) {
	return c.admin().Inspect(ctx)
}

// Inspect reads the group's config as stored now: the declared document,
// every effective value with its source, the declaration history (newest
// first, at most 100) and the group's instances, all in one snapshot of
// the read pool. It writes nothing.
func (g *Group) Inspect(ctx context.Context) (*Inspection, error) {
	var (
		docs      map[string][]byte
		installed []string
		log       []store.ConfigLogEntry
		inst      []store.InstanceRow
	)
	from, err := g.read(ctx, "inspect", func(v store.View, vg store.ViewGroup) (err error) {
		if docs, err = v.ReadGroupConfig(ctx, g.row.ID); err != nil {
			return err
		}
		if _, installed, err = vg.BindingsInForce(ctx); err != nil {
			return err
		}
		if log, err = v.GroupConfigLog(ctx, g.row.ID, 100); err != nil {
			return err
		}
		inst, err = v.GroupInstances(ctx, g.row.ID, g.c.dbNow())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect %q: %w", g.row.Name, err)
	}
	d, err := groupconfig.FromDocs(docs)
	if err != nil {
		return nil, fmt.Errorf("inspect %q: %w", g.row.Name, err)
	}
	out := &Inspection{Group: g.row.Name, Stream: g.stream, Config: configOf(d, installed), Declared: map[string]json.RawMessage{},
		Effective: effective(d), ReadFrom: from}
	for w, doc := range docs {
		out.Declared[w] = json.RawMessage(doc)
	}
	for _, l := range log {
		out.Log = append(out.Log, ConfigChange{Worker: l.Worker, Document: json.RawMessage(l.Document), DeclaredBy: l.DeclaredBy, DeclaredAt: l.DeclaredAt})
	}
	for _, i := range inst {
		out.Instances = append(out.Instances, Instance(i))
	}
	return out, nil
}

// effective lists what a message that sets nothing of its own runs under,
// and the group-level settings, each with its source.
func effective(d groupconfig.Declared) []Setting {
	g := d.Group()
	e := policy.Resolve(policy.Options{}, g)
	unclamped := policy.Resolve(policy.Options{}, policy.Group{Message: g.Message})
	src := func(declared bool, clamped bool) string {
		switch {
		case clamped:
			return "clamped"
		case declared:
			return "declared"
		}
		return "default"
	}
	dur := func(v time.Duration) string { return v.String() }
	m := d.Message
	out := []Setting{
		{"message.timeout", dur(e.Timeout), src(m.Timeout != 0, e.Timeout != unclamped.Timeout)},
		{"message.retry.max_retries", strconv.Itoa(e.MaxRetries), src(m.MaxRetries != 0, e.MaxRetries != unclamped.MaxRetries)},
		{"message.retry.max_delays", strconv.Itoa(e.MaxDelays), src(m.MaxDelays != 0, e.MaxDelays != unclamped.MaxDelays)},
		{"message.retry.base_delay", dur(e.BaseDelay), src(m.BaseDelay != 0, e.BaseDelay != unclamped.BaseDelay)},
		{"message.retry.max_delay", dur(e.MaxDelay), src(m.MaxDelay != 0, e.MaxDelay != unclamped.MaxDelay)},
		{"message.retry.exponent", strconv.FormatFloat(e.Exponent, 'g', -1, 64), src(m.Exponent != 0, e.Exponent != unclamped.Exponent)},
		{"message.concurrency", string(unclamped.Concurrency), src(m.Concurrency != "", false)},
		{"concurrency_override", orNone(string(g.Override)), src(g.Override != "", false)},
		{"exception_initial_backoff", dur(g.InitialBackoffOrDefault()), src(g.InitialBackoff != 0, false)},
		{"max_range_reclaims", strconv.Itoa(g.MaxRangeReclaimsOrDefault()), src(g.MaxRangeReclaims != 0, false)},
		{"delivery_log", orDefault(g.DeliveryLog, policy.LogFailures), src(g.DeliveryLog != "", false)},
		{"start", orDefault(d.Start, string(StartBeginning)), src(d.Start != "", false)},
	}
	for _, b := range []struct {
		name string
		o    policy.Options
	}{{"message_min", d.MessageMin}, {"message_max", d.MessageMax}} {
		raw, _ := json.Marshal(b.o)
		if string(raw) != "{}" {
			out = append(out, Setting{b.name, string(raw), "declared"})
		}
	}
	return out
}

func orNone(s string) string { return orDefault(s, "none") }

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
