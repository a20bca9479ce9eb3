package sqlstreams

import (
	"context"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
)

// BindingDeclaration is one row of a group's binding ledger as listed.
type BindingDeclaration struct {
	Patterns   []string `json:"patterns"`
	DeclaredBy string   `json:"declared_by"`
	// DeclaredAt is when the declarer first stated the set; on the row that
	// ended a wait, the wait began then.
	DeclaredAt time.Time `json:"declared_at"`
	AttemptAt  time.Time `json:"attempt_at"`
	// Status is "installed", "waiting", or "stale" (a waiter whose newest
	// attempt is older than the listing's staleAfter: probably gone).
	Status string `json:"status"`
}

// BindingListing is a group's effective declaration and its open waiters.
type BindingListing struct {
	Installed *BindingDeclaration  `json:"installed"` // nil: never declared (the whole stream)
	Waiting   []BindingDeclaration `json:"waiting"`
	// ReadFrom says whether a replica served the listing (ReadPool).
	ReadFrom
}

// Bindings lists the group's newest installed declaration and the
// declarers still waiting to change it. A waiter whose wanted set is the
// installed one has been resolved and is not listed. staleAfter (0: three
// default retry intervals) marks waiters that stopped retrying.
func (c *Consumer[T]) Bindings(ctx context.Context, staleAfter time.Duration) (*BindingListing, error) {
	return c.admin().Bindings(ctx, staleAfter)
}

// Bindings lists the group's newest installed declaration and the
// declarers still waiting to change it; see Consumer.Bindings. It writes
// nothing.
func (g *Group) Bindings(ctx context.Context, staleAfter time.Duration) (*BindingListing, error) {
	if staleAfter <= 0 {
		staleAfter = 3 * DefaultBindingRetryInterval
	}
	var (
		inst  *store.LedgerRow
		waits []store.LedgerRow
	)
	from, err := g.read(ctx, fmt.Sprintf("bindings of %q", g.row.Name), func(_ store.View, v store.ViewGroup) (err error) {
		inst, waits, err = v.BindingLedger(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &BindingListing{ReadFrom: from}
	if inst != nil {
		out.Installed = &BindingDeclaration{Patterns: inst.Patterns, DeclaredBy: inst.DeclaredBy,
			DeclaredAt: inst.DeclaredAt, AttemptAt: inst.AttemptAt, Status: "installed"}
	}
	now := g.c.cfg.Clock.Now()
	for _, w := range waits {
		if inst != nil && topic.SameSet(w.Patterns, inst.Patterns) {
			continue
		}
		status := "waiting"
		if now.Sub(w.AttemptAt) > staleAfter {
			status = "stale"
		}
		out.Waiting = append(out.Waiting, BindingDeclaration{Patterns: w.Patterns, DeclaredBy: w.DeclaredBy,
			DeclaredAt: w.DeclaredAt, AttemptAt: w.AttemptAt, Status: status})
	}
	return out, nil
}
