// Package backoff is the wait between retries of a failing store call: it
// starts at Initial, doubles with each consecutive failure up to Max, and
// each wait is spread by ±Jitter of itself so that the instances of a fleet
// that lost their database at the same moment do not all come back at the
// same moment.
//
// It is part of the engine's inside, not an API for users.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is a resolved backoff (every field set; Jitter may be 0).
type Policy struct {
	Initial time.Duration
	Max     time.Duration
	Jitter  float64 // in [0, 1]
}

// The library's default policy, field by field (Default).
const (
	DefaultInitial = 100 * time.Millisecond
	DefaultMax     = 5 * time.Second
	DefaultJitter  = 0.2
)

// Default returns the library's default policy.
func Default() Policy { return Policy{Initial: DefaultInitial, Max: DefaultMax, Jitter: DefaultJitter} }

// Wait returns the wait before retry number n (1 after the first failure).
// rnd is a uniform draw in [0, 1), taken from math/rand when negative.
func (p Policy) Wait(n int, rnd float64) time.Duration {
	if p.Initial <= 0 {
		p = Default()
	}
	if n < 1 {
		n = 1
	}
	d := p.Initial
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	if p.Jitter > 0 {
		if rnd < 0 {
			rnd = rand.Float64()
		}
		d = time.Duration(float64(d) * (1 + p.Jitter*(2*rnd-1)))
	}
	return max(d, time.Millisecond)
}

// Backoff counts one caller's consecutive failures.
type Backoff struct {
	Policy Policy
	n      int
}

// Failed records a failure and returns the wait before the next attempt.
func (b *Backoff) Failed() time.Duration {
	b.n++
	return b.Policy.Wait(b.n, -1)
}

// Succeeded resets the count.
func (b *Backoff) Succeeded() { b.n = 0 }

// Failures is the number of consecutive failures.
func (b *Backoff) Failures() int { return b.n }
