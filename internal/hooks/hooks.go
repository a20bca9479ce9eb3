// Package hooks gathers a Consume session's test hooks in one value: the
// points where tests make an actor's step fail or panic, what tests observe
// of the actors (traces, signals, panics), the settings only tests change,
// and the switches that break a promise on purpose so the simulator can
// show its invariants catch it. A client's wake-up hub has hooks of its own
// (Hub).
//
// A nil *Hooks is every production session (a nil *Hub every production
// hub): each call site checks the pointer once, and nothing here runs.
//
// It is part of the engine's inside, not an API for users.
package hooks

import (
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/testsignal"
)

// Hooks are one session's test hooks.
type Hooks struct {
	// Step, if set, runs at the top of every actor step with the step's
	// site (the Site constants): an error makes the step fail as a store
	// call would; a panic (Inject) shows that the supervisor restarts the
	// actor and that nothing is lost.
	Step func(site Site) error
	// OnStart, if set, is told the message consumer's instance id once the
	// instance rows exist and the actors are about to run.
	OnStart func(instanceID string)
	// Trace, if set, is told what becomes of the claimers' outcomes
	// (TraceKind); the chaos test accounts for its duplicates with it.
	Trace func(kind TraceKind, messages []int64)
	// Panicked, if set, is told of every actor panic the supervisor
	// recovered, and whether a hook injected it (Inject).
	Panicked func(actor string, injected bool)
	// Skipped, if set, is told of each message a range settles without
	// delivery because the binding set in force (declaration id) does not
	// route it to the group (the simulator checks it).
	Skipped func(m *store.Message, bindings int64)
	// QuietTick carries a claimer's name each time it skips a poll tick
	// because it is quiet; NotValid is signalled each time the range
	// claimer could not claim because its incarnation was not provably
	// live. Inert unless the test calls Init.
	QuietTick testsignal.Signal[string]
	NotValid  testsignal.Signal[struct{}]
	// QuietSweeps overrides claimer.QuietSweepEvery (0: the default);
	// KeyHold overrides claimer.DefaultKeyHold (0: the default; negative:
	// no key is kept).
	QuietSweeps int
	KeyHold     time.Duration
	// NoListener runs the session without the client's LISTEN hub: no
	// wakes, and the claimers never quiet (as while the listener is down).
	NoListener bool
	// Broken switches deliberate faults on (the simulator's broken
	// variants).
	Broken Broken
}

// Site names an actor step a test can fail or panic.
type Site string

// The sites.
const (
	ClaimerClaim      Site = "claimer.claim"      // a range claim
	ClaimerAcquire    Site = "claimer.acquire"    // applying a key acquisition's result
	ClaimerOutcome    Site = "claimer.outcome"    // applying a handler's outcome
	ClaimerFlush      Site = "claimer.flush"      // a poll tick's flush: commits retried, progress recorded
	ClaimerReconcile  Site = "claimer.reconcile"  // letting go of leases held unknowingly
	ClaimerHandBack   Site = "claimer.handback"   // a drain's hand-back
	ExceptionsClaim   Site = "exceptions.claim"   // an exception claim
	ExceptionsOutcome Site = "exceptions.outcome" // applying an exception handler's outcome
	ExceptionsFlush   Site = "exceptions.flush"   // the exception claimer's flush
	Registrar         Site = "registrar"          // a binding declaration attempt
)

// ClaimerSites are the range claimer's steps, for a test that fails each in
// turn.
var ClaimerSites = []Site{ClaimerClaim, ClaimerAcquire, ClaimerOutcome, ClaimerFlush, ClaimerReconcile,
	ExceptionsClaim, ExceptionsOutcome, ExceptionsFlush}

// At runs Step for site, if the hooks have one.
func (h *Hooks) At(site Site) error {
	if h == nil || h.Step == nil {
		return nil
	}
	return h.Step(site)
}

// Point runs Step for a site that cannot fail (applying a result: an
// error there would lose it), if the hooks have one: only a panic counts.
func (h *Hooks) Point(site Site) {
	if h != nil && h.Step != nil {
		_ = h.Step(site)
	}
}

// Injected is the value a hook panics with to inject a panic (Inject): the
// supervisor tells it apart from a bug.
type Injected struct{ Site Site }

func (p Injected) String() string { return fmt.Sprintf("injected panic at %s", p.Site) }

// Inject panics with Injected: a Step hook calls it to make the step panic.
func Inject(site Site) { panic(Injected{Site: site}) }

// IsInjected reports whether a recovered panic value was injected.
func IsInjected(v any) bool {
	_, ok := v.(Injected)
	return ok
}

// OnStarted tells OnStart, if set.
func (h *Hooks) OnStarted(instanceID string) {
	if h != nil && h.OnStart != nil {
		h.OnStart(instanceID)
	}
}

// Recovered tells Panicked, if set, of a recovered panic.
func (h *Hooks) Recovered(actor string, v any) {
	if h != nil && h.Panicked != nil {
		h.Panicked(actor, IsInjected(v))
	}
}

// Tracing reports whether Trace is set: callers build its slices only then.
func (h *Hooks) Tracing() bool { return h != nil && h.Trace != nil }

// TraceOne tells Trace about one message (0: unknown, nothing said).
func (h *Hooks) TraceOne(kind TraceKind, id int64) {
	if h.Tracing() && id != 0 {
		h.Trace(kind, []int64{id})
	}
}

// TraceAll tells Trace about messages (none: nothing said).
func (h *Hooks) TraceAll(kind TraceKind, ids []int64) {
	if h.Tracing() && len(ids) > 0 {
		h.Trace(kind, ids)
	}
}

// Skip tells Skipped, if set.
func (h *Hooks) Skip(m *store.Message, bindings int64) {
	if h != nil && h.Skipped != nil {
		h.Skipped(m, bindings)
	}
}

// QuietTicked signals QuietTick.
func (h *Hooks) QuietTicked(what string) {
	if h != nil {
		h.QuietTick.Signal(what)
	}
}

// NotLive signals NotValid.
func (h *Hooks) NotLive() {
	if h != nil {
		h.NotValid.Signal(struct{}{})
	}
}

// Sweeps returns QuietSweeps (0 when unset).
func (h *Hooks) Sweeps() int {
	if h == nil {
		return 0
	}
	return h.QuietSweeps
}

// Hold returns KeyHold (0 when unset).
func (h *Hooks) Hold() time.Duration {
	if h == nil {
		return 0
	}
	return h.KeyHold
}

// Breaks returns the broken switches (nil: none).
func (h *Hooks) Breaks() *Broken {
	if h == nil {
		return nil
	}
	return &h.Broken
}

// TraceKind is what a Trace event says became of outcomes.
type TraceKind uint8

const (
	TraceApplied   TraceKind = iota // the actor took the outcome in
	TraceDropped                    // the actor ignored it: a stale, handed-back or cancelled run
	TraceRecorded                   // written: a reclaimer does not deliver it again
	TraceLost                       // the write found the lease gone
	TraceLeft                       // left, unwritten, to the consumer's Leftovers
	TraceAdopted                    // taken from the Leftovers by a later session
	TraceAbandoned                  // unwritten when the actor stopped without a hand-back
	TraceBegun                      // the range claimer's begin succeeded (no messages)
)

// Broken holds fault switches. Each breaks one promise on purpose so the
// simulator can show that its invariants catch it.
type Broken struct {
	DropFailures         bool // a range commit omits its exception rows: failed messages vanish
	SkipKeyLeases        bool // keyed messages run at once, without a key lease
	DeliverUnmatched     bool // messages outside the group's binding set are delivered
	IgnoreOrderedFailure bool // a failed ordered message does not hold back its key's later messages
	// ForgetKeepsCommitDue: a range the claimer lets go of stays among its
	// commits due (its books disagree with themselves).
	ForgetKeepsCommitDue bool
}

// The switches as the actors read them: a nil *Broken (every production
// session) is all false.
func (b *Broken) DropsFailures() bool           { return b != nil && b.DropFailures }
func (b *Broken) SkipsKeyLeases() bool          { return b != nil && b.SkipKeyLeases }
func (b *Broken) DeliversUnmatched() bool       { return b != nil && b.DeliverUnmatched }
func (b *Broken) IgnoresOrderedFailure() bool   { return b != nil && b.IgnoreOrderedFailure }
func (b *Broken) ForgetsKeepingCommitDue() bool { return b != nil && b.ForgetKeepsCommitDue }
