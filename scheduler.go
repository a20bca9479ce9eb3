package sqlstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/schedule"
	"github.com/c1702965/sqlstreams/internal/store"
)

// WorkerScheduler produces the due runs of every schedule (Scheduler).
const WorkerScheduler = engine.SchedulerWorker

// Missed is a schedule's missed-run policy (SchedulerConfig.Missed): what
// it does with due times that passed while no manager ran the scheduler
// worker.
type Missed string

// Missed-run policies.
const (
	// MissedLatest produces one run, for the newest missed due time (the
	// default: a job that should have run, runs once).
	MissedLatest Missed = schedule.MissedLatest
	// MissedAll produces every missed due time (each with its own due time
	// in the idempotency key), up to 1000 per round.
	MissedAll Missed = schedule.MissedAll
	// MissedSkip produces none and waits for the next due time.
	MissedSkip Missed = schedule.MissedSkip
)

// ErrNoSchedule reports a schedule name that is not registered.
var ErrNoSchedule = store.ErrNoSchedule

// SchedulerConfig is a schedule's stored config.
type SchedulerConfig struct {
	// Zone is the IANA time zone the expression is read in. Default "UTC".
	Zone string
	// Missed is the missed-run policy. Default MissedLatest.
	Missed Missed
}

// Scheduler is the handle of one named schedule: a cron expression that
// produces a payload to a stream at each due time. The manager's scheduler
// worker produces each due run exactly once across the fleet.
type Scheduler struct {
	c    *Client
	name string
}

// Scheduler returns the handle of the schedule called name.
func (c *Client) Scheduler(name string) *Scheduler { return &Scheduler{c: c, name: name} }

// Register creates or replaces the schedule: expression is five cron fields
// (minute hour day-of-month month day-of-week) or a descriptor (@hourly,
// @daily, @every 5m, whole seconds, at least 1s); payload is encoded as
// JSON, and its type's SchemaVersion (Versioned), if any, gives the message
// version. The stream must be registered, and the encoded payload fit its
// MaxMessageBytes. A bad expression, zone, policy or payload is refused.
func (s *Scheduler) Register(ctx context.Context, stream, expression string, payload any, cfg *SchedulerConfig) error {
	if err := validateName("schedule", s.name); err != nil {
		return err
	}
	var c SchedulerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Zone == "" {
		c.Zone = "UTC"
	}
	if c.Missed == "" {
		c.Missed = MissedLatest
	}
	switch c.Missed {
	case MissedLatest, MissedAll, MissedSkip:
	default:
		return fmt.Errorf("%w: SchedulerConfig.Missed %q (want %q, %q or %q)", ErrInvalidConfig, c.Missed, MissedLatest, MissedAll, MissedSkip)
	}
	spec, err := schedule.Parse(expression, c.Zone)
	if err != nil {
		return fmt.Errorf("%w: schedule %q: %v", ErrInvalidConfig, s.name, err)
	}
	doc, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("%w: schedule %q: payload: %v", ErrEncode, s.name, err)
	}
	if err := refuseNull(doc); err != nil {
		return fmt.Errorf("schedule %q: payload: %w", s.name, err)
	}
	row, err := s.c.store.LookupStream(ctx, nil, stream)
	if err != nil {
		return fmt.Errorf("schedule %q: %w", s.name, err)
	}
	var scfg StreamConfig
	if err := json.Unmarshal(row.Config, &scfg); err != nil {
		return fmt.Errorf("schedule %q: stream %q: stored config: %w", s.name, stream, err)
	}
	if limit := scfg.withDefaults().MaxMessageBytes; len(doc) > limit {
		return fmt.Errorf("schedule %q: %w: %d bytes encoded, stream %q takes %d", s.name, ErrMessageTooLarge, len(doc), stream, limit)
	}
	version := 1
	if v, ok := payload.(Versioned); ok {
		version = v.SchemaVersion()
	}
	return s.c.store.RegisterSchedule(ctx, store.Schedule{Name: s.name, StreamID: row.ID, Expression: expression,
		Zone: c.Zone, Missed: string(c.Missed), Version: version, Payload: doc, NextDue: spec.Next(s.c.cfg.Clock.Now())}, s.c.dbNow())
}

// Suspend stops the schedule producing until Resume.
func (s *Scheduler) Suspend(ctx context.Context) error {
	return s.c.store.SetScheduleSuspended(ctx, s.name, true, nil, s.c.dbNow())
}

// Resume starts a suspended schedule again at its next due time; runs due
// while it was suspended are not made up.
func (s *Scheduler) Resume(ctx context.Context) error {
	row, err := s.c.store.LookupSchedule(ctx, s.name)
	if err != nil {
		return err
	}
	spec, err := schedule.Parse(row.Expression, row.Zone)
	if err != nil {
		return err
	}
	next := spec.Next(s.c.cfg.Clock.Now())
	return s.c.store.SetScheduleSuspended(ctx, s.name, false, &next, s.c.dbNow())
}

// RunNow produces one run at once, outside the schedule (its next due time
// does not move).
func (s *Scheduler) RunNow(ctx context.Context) error {
	row, err := s.c.store.LookupSchedule(ctx, s.name)
	if err != nil {
		return err
	}
	key := "schedule:" + s.name + ":now:" + s.c.cfg.Clock.Now().UTC().Format(time.RFC3339Nano)
	msgs := []store.NewMessage{{Version: row.Version, Payload: row.Payload, IdempotencyKey: key}}
	if _, err = s.c.store.Produce(ctx, nil, store.StreamRef{ID: row.StreamID}, msgs, s.c.dbNow()); err != nil {
		return fmt.Errorf("schedule %q: run now: %w", s.name, err)
	}
	s.c.wake(ctx, "schedule "+s.name, row.StreamID, msgs)
	return nil
}

// ScheduleInfo is one schedule in a listing.
type ScheduleInfo struct {
	Name       string
	Stream     string // the stream it produces to
	Expression string
	Zone       string
	Missed     Missed
	Suspended  bool
	NextDue    time.Time
	LastDue    *time.Time // the newest due time produced, if any
}

// Schedules lists every schedule with its next due time.
func (c *Client) Schedules(ctx context.Context) ([]ScheduleInfo, error) {
	rows, err := c.store.Schedules(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ScheduleInfo, len(rows))
	for i, r := range rows {
		out[i] = ScheduleInfo{Name: r.Name, Stream: r.Stream, Expression: r.Expression, Zone: r.Zone,
			Missed: Missed(r.Missed), Suspended: r.Suspended, NextDue: r.NextDue, LastDue: r.LastDue}
	}
	return out, nil
}
