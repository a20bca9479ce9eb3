package claimer

import (
	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
)

// maxParsedOptions bounds parsedOptions: past it the memo starts again.
const maxParsedOptions = 64

// parsedOptions remembers the options documents an actor has parsed. The
// messages of a range nearly always share one (a producer's BatchOptions),
// and every keyed message has one: parsing it with encoding/json at the
// claim and again at the outcome was the largest share of the loop's own
// time in an exclusive burn-down (7.5% of the process's CPU, on the loop
// that keyed handlers wait for). Only the actor's loop uses it.
type parsedOptions struct {
	m map[string]policy.Options
}

// parse returns the message's options; a document that no longer parses
// runs with the group's and library's defaults.
func (p *parsedOptions) parse(b []byte) policy.Options {
	if len(b) == 0 {
		return policy.Options{}
	}
	if o, ok := p.m[string(b)]; ok {
		return o
	}
	o, _ := policy.Parse(b)
	if p.m == nil || len(p.m) >= maxParsedOptions {
		p.m = make(map[string]policy.Options, maxParsedOptions)
	}
	p.m[string(b)] = o
	return o
}

// resolve pins a message's policy against the group config of this moment.
func (p *parsedOptions) resolve(m *store.Message, group policy.Group) policy.Effective {
	return policy.Resolve(p.parse(m.Options), group)
}

// atWrite is the policy an attempt's result is decided by: the retry budget
// and curve of the group config in force when the exception row is written
// (seed 001: "the next claim or exception write uses the current copy"; a
// MaxRetries raised while the last allowed attempt ran gives it the new
// budget), with the concurrency and timeout the attempt was claimed and run
// under (its key lease was taken for that concurrency).
func (p *parsedOptions) atWrite(claimed policy.Effective, m *store.Message, group policy.Group) policy.Effective {
	e := p.resolve(m, group)
	e.Concurrency, e.Timeout = claimed.Concurrency, claimed.Timeout
	return e
}
