// Package testsignal is how a test waits for something an actor does (a
// listener connected, a round of work done) without sleeping and without a
// callback in the production path: an actor signals on a Signal, which does
// nothing until a test calls Init. River calls these test signals.
//
// It is a test helper, not an API for users.
package testsignal

// Capacity bounds the signals an initialized Signal buffers; past it, new
// ones are dropped (a test reads them as they come).
const Capacity = 64

// Signal carries values of T to a test. The zero value is inert.
type Signal[T any] struct{ ch chan T }

// Init makes the signal deliver. Call it before the actor runs.
func (s *Signal[T]) Init() { s.ch = make(chan T, Capacity) }

// Signal sends v when the signal was initialized, never waiting.
func (s *Signal[T]) Signal(v T) {
	if s == nil || s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}

// C is the receiving side (nil before Init).
func (s *Signal[T]) C() <-chan T { return s.ch }
