package manager

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/schedule"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Scheduler produces each due run of every schedule, once across the
// fleet: due rows are locked with SKIP LOCKED and each run is produced with
// an idempotency key made of the schedule and its due time, in the
// transaction that moves the schedule on.
type Scheduler struct {
	Store *store.Store
	Clock clocks.Clock
	DBNow func() store.Now
	// Produced counts the runs produced (tests and stats).
	Produced atomic.Int64
}

// SchedulerWorker is the scheduler worker's worker_config name.
const SchedulerWorker = "scheduler"

// Name implements Worker.
func (s *Scheduler) Name() string { return SchedulerWorker }

// DefaultInterval is a second: in effect the scheduler runs at every
// heartbeat of the manager holding it, so a run is produced within one
// heartbeat interval of its due time.
func (s *Scheduler) DefaultInterval() time.Duration { return time.Second }

// Round implements Worker: up to k.Batch due schedules.
func (s *Scheduler) Round(ctx context.Context, k Resolved) error {
	now := s.Clock.Now()
	n, err := s.Store.RunDueSchedules(ctx, k.Batch, s.DBNow(), func(row store.Schedule) (store.ScheduleRun, error) {
		spec, err := schedule.Parse(row.Expression, row.Zone)
		if err != nil {
			return store.ScheduleRun{}, err
		}
		due, next := spec.Decide(row.NextDue, now, row.Missed)
		return store.ScheduleRun{Due: due, Next: next}, nil
	})
	s.Produced.Add(int64(n))
	return err
}
