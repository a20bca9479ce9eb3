package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Schedule is a schedule row.
type Schedule struct {
	Name       string
	StreamID   int64
	Stream     string // the stream's name (read only)
	Expression string
	Zone       string
	Missed     string
	Version    int
	Payload    []byte
	Suspended  bool
	NextDue    time.Time
	LastDue    *time.Time
}

// ErrNoSchedule reports a schedule name that is not registered.
var ErrNoSchedule = errors.New("no such schedule")

// RegisterSchedule creates or replaces a schedule. next is its first due
// time under the new expression.
func (st *Store) RegisterSchedule(ctx context.Context, s Schedule, now Now) error {
	if _, err := st.pool.Exec(ctx, st.sql(`-- store.RegisterSchedule
INSERT INTO %[1]s.schedule (name, stream_id, expression, zone, missed, version, payload, next_due, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($9, now()), coalesce($9, now()))
ON CONFLICT (name) DO UPDATE SET stream_id = EXCLUDED.stream_id, expression = EXCLUDED.expression, zone = EXCLUDED.zone,
    missed = EXCLUDED.missed, version = EXCLUDED.version, payload = EXCLUDED.payload, next_due = EXCLUDED.next_due,
    updated_at = EXCLUDED.updated_at`),
		s.Name, s.StreamID, s.Expression, s.Zone, s.Missed, s.Version, s.Payload, s.NextDue, now); err != nil {
		return fmt.Errorf("register schedule %q: %w", s.Name, err)
	}
	return nil
}

// SetScheduleSuspended suspends or resumes a schedule; resuming moves
// next_due to next (runs missed while suspended are not made up).
func (st *Store) SetScheduleSuspended(ctx context.Context, name string, suspended bool, next *time.Time, now Now) error {
	tag, err := st.pool.Exec(ctx, st.sql(`-- store.SetScheduleSuspended
UPDATE %[1]s.schedule SET suspended = $2, next_due = coalesce($3, next_due), updated_at = coalesce($4, now())
WHERE name = $1`), name, suspended, next, now)
	if err != nil {
		return fmt.Errorf("schedule %q: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("schedule %q: %w", name, ErrNoSchedule)
	}
	return nil
}

const scheduleCols = `name, stream_id, expression, zone, missed, version, payload, suspended, next_due, last_due,
       coalesce((SELECT c.name FROM %[1]s.stream_config c WHERE c.id = stream_id), '')`

func scanSchedule(r pgx.Row) (Schedule, error) {
	var s Schedule
	err := r.Scan(&s.Name, &s.StreamID, &s.Expression, &s.Zone, &s.Missed, &s.Version, &s.Payload, &s.Suspended, &s.NextDue, &s.LastDue, &s.Stream)
	return s, err
}

// Schedules lists every schedule by name.
func (st *Store) Schedules(ctx context.Context) ([]Schedule, error) {
	rows, err := st.pool.Query(ctx, st.sql(`-- store.Schedules
SELECT `+scheduleCols+` FROM %[1]s.schedule ORDER BY name`))
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Schedule, error) { return scanSchedule(r) })
}

// LookupSchedule reads one schedule.
func (st *Store) LookupSchedule(ctx context.Context, name string) (Schedule, error) {
	s, err := scanSchedule(st.pool.QueryRow(ctx, st.sql(`-- store.LookupSchedule
SELECT `+scheduleCols+` FROM %[1]s.schedule WHERE name = $1`), name))
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("schedule %q: %w", name, ErrNoSchedule)
	}
	if err != nil {
		return s, fmt.Errorf("schedule %q: %w", name, err)
	}
	return s, nil
}

// ScheduleRun is what the scheduler decided for one due schedule: produce
// one message per due time, then wait for next.
type ScheduleRun struct {
	Due  []time.Time
	Next time.Time
}

// RunDueSchedules locks up to limit due schedules (SKIP LOCKED: managers
// running at once split them) and, per schedule in its own transaction,
// produces a message for each due time decide returns, keyed by schedule
// and due time (a due time is produced once, even by a retried round), and
// moves next_due. It returns how many messages it produced.
func (st *Store) RunDueSchedules(ctx context.Context, limit int, now Now, decide func(Schedule) (ScheduleRun, error)) (int, error) {
	var names []string
	rows, err := st.pool.Query(ctx, st.sql(`-- store.RunDueSchedules
SELECT name FROM %[1]s.schedule WHERE NOT suspended AND next_due <= coalesce($1, now()) ORDER BY next_due LIMIT $2`), now, limit)
	if err != nil {
		return 0, fmt.Errorf("due schedules: %w", err)
	}
	if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return 0, fmt.Errorf("due schedules: %w", err)
	}
	produced := 0
	var errs []error
	for _, name := range names {
		err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
			s, err := scanSchedule(tx.QueryRow(ctx, st.sql(`-- store.RunDueSchedules
SELECT `+scheduleCols+` FROM %[1]s.schedule
WHERE name = $1 AND NOT suspended AND next_due <= coalesce($2, now())
FOR UPDATE SKIP LOCKED`), name, now))
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // another manager has it, or it is no longer due
			}
			if err != nil {
				return err
			}
			run, err := decide(s)
			if err != nil {
				return err
			}
			msgs := make([]NewMessage, len(run.Due))
			for i, due := range run.Due {
				msgs[i] = NewMessage{Version: s.Version, Payload: s.Payload,
					IdempotencyKey: "schedule:" + s.Name + ":" + due.UTC().Format(time.RFC3339Nano)}
			}
			if len(msgs) > 0 {
				out, err := st.Produce(ctx, tx, StreamRef{ID: s.StreamID}, msgs, now)
				if err != nil {
					return err
				}
				for _, p := range out {
					if !p.Duplicate {
						produced++
					}
				}
			}
			var last *time.Time
			if len(run.Due) > 0 {
				last = &run.Due[len(run.Due)-1]
			}
			_, err = tx.Exec(ctx, st.sql(`-- store.RunDueSchedules
UPDATE %[1]s.schedule SET next_due = $2, last_due = coalesce($3, last_due), updated_at = coalesce($4, now()) WHERE name = $1`),
				s.Name, run.Next, last, now)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("schedule %q: %w", name, err))
		}
	}
	return produced, errors.Join(errs...)
}
