package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Inspection shows a group's config in both layers — what was declared and
// what is in effect — with its declaration history and its sessions.
type Inspection struct {
	Group  string `json:"group"`
	Stream string `json:"stream"`
	// Config is the declared config as one document with the installed
	// binding set: the shape Group.Declare and `sqlstreams groups declare`
	// take, so that what Inspect shows can be edited and declared again.
	Config ConsumerConfig `json:"config"`
	// Effective lists every setting with its value and where it came from.
	Effective []Setting `json:"effective"`
	// Log is the declaration history, newest first, at most
	// MaxDeclarationsShown: one entry per declaration (a Register, a
	// Declare), with the whole document it left in force.
	Log []Declaration `json:"log"`
	// Members are the group's Consume sessions, live ones first (a stopped
	// one's rows stay until the prune worker removes them).
	Members []Member `json:"members"`
	// ReadFrom says whether a replica served the inspection (ReadPool).
	ReadFrom
}

// MaxDeclarationsShown bounds Inspection.Log.
const MaxDeclarationsShown = 100

// Setting is one effective value.
type Setting struct {
	Field  string `json:"field"`
	Value  string `json:"value"`
	Source string `json:"source"` // "declared", "default", or "clamped" (moved by MessageMin/MessageMax)
}

// Declaration is one stored declaration of a group's config: the document
// it left in force (bindings aside: the installed set is Config's), who
// stored it (hostname:pid:random of its process) and when.
type Declaration struct {
	Config     ConsumerConfig `json:"config"`
	DeclaredBy string         `json:"declared_by"`
	DeclaredAt time.Time      `json:"declared_at"`
}

// Member is one Consume session of a group, Kafka's group member. It holds
// an instance row per worker the group needs done (ranges, retries), each
// with its own id and heartbeat; the member is live while any of them is.
type Member struct {
	// DeclaredBy is the session's process: hostname:pid:random.
	DeclaredBy string    `json:"declared_by"`
	StartedAt  time.Time `json:"started_at"`
	// HeartbeatAt and ExpiresAt are the newest of its rows'.
	HeartbeatAt time.Time `json:"heartbeat_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	Live        bool      `json:"live"`
	// Instances are its instance rows' ids.
	Instances []string `json:"instances"`
}

// members folds instance rows into sessions: a session inserts its rows,
// one per worker, in one transaction, so they share declared_by and
// started_at. Under a mock clock two sessions of a process may share both
// too: a key then holds as many sessions as its most frequent worker has
// rows, the rows dealt out among them.
func members(rows []store.InstanceRow) []Member {
	type key struct {
		by string
		at time.Time
	}
	var order []key
	byKey := map[key][]store.InstanceRow{}
	for _, r := range rows {
		k := key{r.DeclaredBy, r.StartedAt.UTC()}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	out := make([]Member, 0, len(order))
	for _, k := range order {
		seen := map[string]int{} // worker → its rows dealt so far
		var ms []Member
		for _, r := range byKey[k] {
			i := seen[r.Worker]
			seen[r.Worker]++
			if i == len(ms) {
				ms = append(ms, Member{DeclaredBy: r.DeclaredBy, StartedAt: r.StartedAt})
			}
			m := &ms[i]
			m.Instances = append(m.Instances, r.ID)
			m.Live = m.Live || r.Live
			if r.HeartbeatAt.After(m.HeartbeatAt) {
				m.HeartbeatAt = r.HeartbeatAt
			}
			if r.ExpiresAt.After(m.ExpiresAt) {
				m.ExpiresAt = r.ExpiresAt
			}
		}
		out = append(out, ms...)
	}
	slices.SortStableFunc(out, func(a, b Member) int {
		if a.Live != b.Live {
			if a.Live {
				return -1
			}
			return 1
		}
		return a.StartedAt.Compare(b.StartedAt)
	})
	return out
}

// Inspect reads the group's config as stored now (not this process's copy).
func (c *Consumer[T]) Inspect(ctx context.Context) (*Inspection, error) {
	return c.admin().Inspect(ctx)
}

// Inspect reads the group's config as stored now: the declared document,
// every effective value with its source, the declaration history (newest
// first, at most MaxDeclarationsShown) and the group's sessions, all in one
// snapshot of the read pool. It writes nothing.
func (g *Group) Inspect(ctx context.Context) (*Inspection, error) {
	var (
		docs      map[string][]byte
		installed []string
		log       []store.DeclarationRow
		inst      []store.InstanceRow
	)
	from, err := g.read(ctx, fmt.Sprintf("inspect %q", g.row.Name), func(v store.View, vg store.ViewGroup) (err error) {
		if docs, err = v.ReadGroupConfig(ctx, g.row.ID); err != nil {
			return err
		}
		if _, installed, err = vg.BindingsInForce(ctx); err != nil {
			return err
		}
		if log, err = v.GroupDeclarations(ctx, g.row.ID, MaxDeclarationsShown); err != nil {
			return err
		}
		inst, err = v.GroupInstances(ctx, g.row.ID, g.c.dbNow())
		return err
	})
	if err != nil {
		return nil, err
	}
	d, err := groupconfig.FromDocs(docs)
	if err != nil {
		return nil, fmt.Errorf("inspect %q: %w", g.row.Name, err)
	}
	out := &Inspection{Group: g.row.Name, Stream: g.stream, Config: configOf(d, installed), Effective: effective(d),
		Log: []Declaration{}, Members: members(inst), ReadFrom: from}
	for _, l := range log {
		ld, err := groupconfig.FromDocs(l.Docs)
		if err != nil {
			return nil, fmt.Errorf("inspect %q: declared at %s: %w", g.row.Name, l.DeclaredAt.UTC().Format(time.RFC3339), err)
		}
		out.Log = append(out.Log, Declaration{Config: configOf(ld, nil), DeclaredBy: l.DeclaredBy, DeclaredAt: l.DeclaredAt})
	}
	if out.Members == nil {
		out.Members = []Member{}
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
