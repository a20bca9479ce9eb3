package policy

import (
	"errors"
	"fmt"
	"time"
)

// TerminalError marks a handler error that must not be retried.
type TerminalError struct{ Err error }

func (e *TerminalError) Error() string { return "terminal: " + e.Err.Error() }
func (e *TerminalError) Unwrap() error { return e.Err }

// DelayError asks for the message to run again after D without spending a
// retry.
type DelayError struct{ D time.Duration }

func (e *DelayError) Error() string { return fmt.Sprintf("delayed %s", e.D) }

// ErrTimeout is a handler attempt that outlived its Timeout.
var ErrTimeout = errors.New("handler timed out")

// ErrPanic is a handler attempt that panicked.
var ErrPanic = errors.New("handler panic")

// Kind is what a handler's result means.
type Kind int

const (
	Success Kind = iota
	Failure
	Terminal
	Delay
)

// Classify sorts a handler's result.
func Classify(err error) (Kind, time.Duration) {
	if err == nil {
		return Success, 0
	}
	var t *TerminalError
	if errors.As(err, &t) {
		return Terminal, 0
	}
	var d *DelayError
	if errors.As(err, &d) {
		return Delay, d.D
	}
	return Failure, 0
}

// Status values of an exception row.
const (
	StatusPending = "pending" // waiting for can_run_after
	StatusRunning = "running" // leased by an exception consumer
	StatusQueued  = "queued"  // leased, not started: behind its ordered key's running row, or prefetched for a free handler slot
	StatusDead    = "dead"    // out of budget; a dead letter
)

// Next is what an exception row becomes after an attempt.
type Next struct {
	Delete   bool // the message succeeded: nothing is left to do
	Status   string
	Attempts int           // failed attempts so far
	Delays   int           // delays used so far
	After    time.Duration // can_run_after, from now
}

// Decide turns one attempt's result into the row's next state. attempts and
// delays are the counts before this attempt. A failure spends a retry; the
// message is dead once its failed attempts exceed MaxRetries. A Delay spends
// no retry while delays stay within MaxDelays; past that it counts as a
// failure. A terminal error is dead at once.
func Decide(e Effective, initial time.Duration, attempts, delays int, err error) Next {
	kind, d := Classify(err)
	switch kind {
	case Success:
		return Next{Delete: true}
	case Terminal:
		return Next{Status: StatusDead, Attempts: attempts + 1, Delays: delays}
	case Delay:
		if delays < e.MaxDelays {
			return Next{Status: StatusPending, Attempts: attempts, Delays: delays + 1, After: max(d, 0)}
		}
	}
	n := attempts + 1
	if n > e.MaxRetries {
		return Next{Status: StatusDead, Attempts: n, Delays: delays}
	}
	return Next{Status: StatusPending, Attempts: n, Delays: delays, After: e.RetryDelay(n, initial)}
}

// Delivery-log outcomes and modes.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	OutcomeDelayed   = "delayed"
	OutcomeDead      = "dead"

	LogOff      = "off"
	LogFailures = "failures" // the default: failed and dead attempts
	LogAll      = "all"
)

// OutcomeOf names an attempt's result for the delivery log; attempts is
// the count before it.
func OutcomeOf(next Next, err error, attempts int) string {
	kind, _ := Classify(err)
	switch {
	case next.Delete:
		return OutcomeSucceeded
	case next.Status == StatusDead:
		return OutcomeDead
	case kind == Delay && next.Attempts == attempts:
		return OutcomeDelayed
	}
	return OutcomeFailed
}

// Logs reports whether the group's delivery-log mode records outcome.
func (g Group) Logs(outcome string) bool {
	switch g.DeliveryLog {
	case LogOff:
		return false
	case LogAll:
		return true
	}
	return outcome == OutcomeFailed || outcome == OutcomeDead
}
