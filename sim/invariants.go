package sim

import (
	"bytes"
	"context"
	"fmt"

	"github.com/c1702965/sqlstreams/actors/claimer"
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
)

// Violation is a broken invariant: the run is wrong, not merely failing.
type Violation struct {
	Invariant string
	Detail    string
}

func (v *Violation) Error() string { return "invariant " + v.Invariant + " violated: " + v.Detail }

// Check runs every invariant that reads the database; the simulator calls it
// after every step. Invariants about hand-outs run as jobs leave a claimer
// (checkHandOut, checkClaimSet).
func (w *World) Check(ctx context.Context) error {
	for _, inv := range []struct {
		name  string
		check func(context.Context) error
	}{
		{"NoMessageLost", w.NoMessageLost},
		{"CursorNeverPassesUnsettled", w.CursorNeverPassesUnsettled},
		{"WaitingInstanceNeverClaims", w.WaitingInstanceNeverClaims},
		{"ConfigConvergesWithinOneRefresh", w.ConfigConvergesWithinOneRefresh},
		{"LedgerIsAppendOnly", w.LedgerIsAppendOnly},
		{"ClaimerStateAgrees", w.ClaimerStateAgrees},
	} {
		if !w.checks(inv.name) {
			continue
		}
		if err := inv.check(ctx); err != nil {
			return err
		}
	}
	return nil
}

// checks reports whether an invariant is on (all are, unless Options.Only
// names one).
func (w *World) checks(name string) bool { return w.opts.Only == "" || w.opts.Only == name }

// status maps message id to its exception row's status ("" for none).
func (w *World) status(ctx context.Context) (map[int64]string, error) {
	xs, err := w.db.ExceptionStates(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]string, len(xs))
	for _, x := range xs {
		out[x.MessageID] = x.Status
	}
	return out, nil
}

// NoMessageLost: every produced message the simulator has not seen handled
// (or settled undelivered, outside the set in force) is still held by the
// group somewhere: beyond the cursor head, inside an outstanding range, or
// as an exception row (dead letters included).
func (w *World) NoMessageLost(ctx context.Context) error {
	var ids []int64
	for _, m := range w.msgs {
		if !m.succeeded && !m.skipped {
			ids = append(ids, m.id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	lost, err := w.db.Unaccounted(ctx, ids)
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		return &Violation{Invariant: "NoMessageLost", Detail: fmt.Sprintf("%s neither handled, dead, pending nor claimable", w.names(lost))}
	}
	return nil
}

func (w *World) names(ids []int64) string {
	var b bytes.Buffer
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		if m := w.byID[id]; m != nil {
			fmt.Fprintf(&b, "m%d", m.n)
		} else {
			fmt.Fprintf(&b, "id%d", id)
		}
	}
	return b.String()
}

// CursorNeverPassesUnsettled: the committed position stays below every
// message that is neither handled nor dead. (The simulator produces one
// transaction at a time, so id order is log order.)
func (w *World) CursorNeverPassesUnsettled(ctx context.Context) error {
	committed, err := w.db.Committed(ctx)
	if err != nil {
		return err
	}
	status, err := w.status(ctx)
	if err != nil {
		return err
	}
	for _, m := range w.msgs {
		if m.succeeded || m.skipped || status[m.id] == policy.StatusDead {
			continue
		}
		if m.id <= committed.ID {
			return &Violation{Invariant: "CursorNeverPassesUnsettled", Detail: fmt.Sprintf(
				"committed position id %d passes m%d (id %d), which is unsettled", committed.ID, m.n, m.id)}
		}
	}
	return nil
}

// WaitingInstanceNeverClaims: an instance whose binding set is waiting
// holds no range lease and has handed out nothing.
func (w *World) WaitingInstanceNeverClaims(ctx context.Context) error {
	leases, err := w.db.RangeLeases(ctx)
	if err != nil {
		return err
	}
	for _, in := range w.inst {
		if in.state != waiting {
			continue
		}
		if len(in.jobs)+len(in.exJobs) > 0 {
			return &Violation{Invariant: "WaitingInstanceNeverClaims", Detail: in.name + " waits and has messages in hand"}
		}
		for _, l := range leases {
			if l.Owner == in.msgID {
				return &Violation{Invariant: "WaitingInstanceNeverClaims", Detail: fmt.Sprintf("%s waits and holds range %d", in.name, l.ID)}
			}
		}
	}
	return nil
}

// ConfigConvergesWithinOneRefresh: once a refresh interval has passed since
// the last declaration, every consuming instance runs under it (a stalled
// one refreshes as it resumes, before it runs anything).
func (w *World) ConfigConvergesWithinOneRefresh(context.Context) error {
	if w.clock.Now().Sub(w.declaredAt) <= w.opts.RefreshInterval {
		return nil
	}
	want, err := w.declared.Docs()
	if err != nil {
		return err
	}
	for _, in := range w.inst {
		if in.state != consuming || in.stalled { // a stalled instance runs nothing until it resumes
			continue
		}
		got, err := in.snap.Declared().Docs()
		if err != nil {
			return err
		}
		for _, name := range sortedKeys(want) {
			if !bytes.Equal(got[name], want[name]) {
				return &Violation{Invariant: "ConfigConvergesWithinOneRefresh", Detail: fmt.Sprintf(
					"%s still runs %s=%s, %s after %s was declared", in.name, name, got[name],
					w.clock.Now().Sub(w.declaredAt), want[name])}
			}
		}
	}
	return nil
}

// LedgerIsAppendOnly: every binding declaration row once seen is still
// there, unchanged.
func (w *World) LedgerIsAppendOnly(ctx context.Context) error {
	rows, err := w.db.LedgerRows(ctx)
	if err != nil {
		return err
	}
	now := make(map[int64]string, len(rows))
	for _, r := range rows {
		now[r.ID] = fmt.Sprintf("%s %v %s %s %s", r.Status, r.Patterns, r.DeclaredBy, r.DeclaredAt, r.AttemptAt)
	}
	for id, fp := range w.ledger {
		if now[id] != fp {
			return &Violation{Invariant: "LedgerIsAppendOnly", Detail: fmt.Sprintf("ledger row %d was %q, now %q", id, fp, now[id])}
		}
	}
	w.ledger = now
	return nil
}

// checkClaimSet is NoUnionWindow: every message of a claim was filtered by
// the one set in force at claim time — delivered ones match it, skipped ones
// do not.
func (w *World) checkClaimSet(in *instance, m *store.Message, bindings int64, delivered bool) error {
	if !w.checks("NoUnionWindow") {
		return nil
	}
	if bindings != w.claimDecl {
		return &Violation{Invariant: "NoUnionWindow", Detail: fmt.Sprintf(
			"%s claimed under declaration %d while %d was in force", in.name, bindings, w.claimDecl)}
	}
	matches := len(w.claimSet) == 0 || (m.RoutingKey != "" && topic.MatchAny(w.claimSet, m.RoutingKey))
	if matches != delivered {
		verb := "delivered"
		if !delivered {
			verb = "skipped"
		}
		return &Violation{Invariant: "NoUnionWindow", Detail: fmt.Sprintf(
			"%s %s routing key %q under set %v", in.name, verb, m.RoutingKey, w.claimSet)}
	}
	return nil
}

// checkHandOut runs as a job leaves a claimer: ExclusiveKeyAtMostOneInFlight
// and OrderedKeysInPositionOrder.
func (w *World) checkHandOut(in *instance, j claimer.Job, m *message) error {
	if !j.Delivery.Concurrency.Keyed() || m.key == "" {
		return nil
	}
	if w.inFlight[m.key] > 0 && w.checks("ExclusiveKeyAtMostOneInFlight") {
		return &Violation{Invariant: "ExclusiveKeyAtMostOneInFlight", Detail: fmt.Sprintf(
			"%s hands out m%d while another message of key %q is in flight", in.name, m.n, m.key)}
	}
	if j.Delivery.Concurrency != policy.Ordered || !w.checks("OrderedKeysInPositionOrder") {
		return nil
	}
	status, err := w.status(context.Background())
	if err != nil {
		return err
	}
	for _, e := range w.msgs {
		if e.id < m.id && e.key == m.key && !e.succeeded && !e.skipped && status[e.id] != policy.StatusDead {
			return &Violation{Invariant: "OrderedKeysInPositionOrder", Detail: fmt.Sprintf(
				"%s hands out m%d while m%d of its ordered key %q is unresolved", in.name, m.n, e.n, m.key)}
		}
	}
	return nil
}

// ClaimerStateAgrees: every consuming instance's range claimer keeps its
// books in agreement (claimer.Actor.Check): every range in its order is in
// its book, every queued message belongs to a range it holds, no key is
// both pending and held, every count matches.
func (w *World) ClaimerStateAgrees(context.Context) error {
	for _, in := range w.inst {
		if in.cl == nil || in.state == gone {
			continue
		}
		if err := in.cl.Check(); err != nil {
			return &Violation{Invariant: "ClaimerStateAgrees", Detail: fmt.Sprintf("%s: %v", in.name, err)}
		}
	}
	return nil
}

// InvariantNames lists every invariant, for the broken-variant tests.
var InvariantNames = []string{
	"NoMessageLost", "NoUnionWindow", "WaitingInstanceNeverClaims", "ExclusiveKeyAtMostOneInFlight",
	"OrderedKeysInPositionOrder", "CursorNeverPassesUnsettled", "ConfigConvergesWithinOneRefresh", "LedgerIsAppendOnly",
	"ClaimerStateAgrees",
}
