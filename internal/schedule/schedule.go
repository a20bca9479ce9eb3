// Package schedule parses cron expressions and decides which due times of a
// schedule to produce, under its missed-runs policy.
//
// It is part of the engine's inside, not an API for users.
package schedule

import (
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // zones resolve the same on every machine

	"github.com/robfig/cron/v3"
)

// Missed-run policies: what a schedule does with due times that passed
// while no manager ran it.
const (
	// MissedLatest produces one run, for the newest missed due time.
	MissedLatest = "latest"
	// MissedAll produces every missed due time, up to MaxCatchUp per round.
	MissedAll = "all"
	// MissedSkip produces none and waits for the next due time.
	MissedSkip = "skip"
)

// MinEvery is the shortest @every interval a schedule may have.
const MinEvery = time.Second

// MaxCatchUp bounds the due times one round produces for one schedule.
const MaxCatchUp = 1000

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Spec is a parsed expression in its zone.
type Spec struct {
	sched cron.Schedule
	loc   *time.Location
}

// Parse checks an expression (five fields, or a descriptor such as @hourly
// or @every 5m) and a zone ("" is UTC).
func Parse(expr, zone string) (Spec, error) {
	if zone == "" {
		zone = "UTC"
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return Spec{}, fmt.Errorf("zone %q: %w", zone, err)
	}
	if rest, ok := strings.CutPrefix(strings.TrimSpace(expr), "@every"); ok {
		// robfig/cron reads any duration, and turns what is below a second
		// (zero and negative included) into a second: refuse instead.
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return Spec{}, fmt.Errorf("cron expression %q: @every takes a duration such as 5m: %w", expr, err)
		}
		if d < MinEvery || d%time.Second != 0 {
			return Spec{}, fmt.Errorf("cron expression %q: @every interval %s must be a whole number of seconds, at least %s", expr, d, MinEvery)
		}
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return Spec{}, fmt.Errorf("cron expression %q: %w", expr, err)
	}
	return Spec{sched: s, loc: loc}, nil
}

// Next is the first due time strictly after t.
func (s Spec) Next(t time.Time) time.Time { return s.sched.Next(t.In(s.loc)).UTC() }

// Decide returns the due times to produce now, given the stored next due
// time, and the next due time after them.
func (s Spec) Decide(nextDue, now time.Time, missed string) (due []time.Time, next time.Time) {
	t := nextDue
	var all []time.Time
	for !t.After(now) && len(all) < MaxCatchUp {
		all = append(all, t)
		t = s.Next(t)
	}
	if len(all) == MaxCatchUp && missed != MissedAll {
		for !t.After(now) { // skip the rest without keeping them
			t = s.Next(t)
		}
	}
	switch missed {
	case MissedAll:
		return all, t
	case MissedSkip:
		// Only a due time that is not yet overdue by a whole period runs:
		// the newest, if the one after it is still in the future.
		if len(all) == 1 {
			return all, t
		}
		return nil, t
	default:
		if len(all) == 0 {
			return nil, t
		}
		return all[len(all)-1:], t
	}
}
