// Package outage logs a failing call once per outage, and its recovery once,
// so an actor that retries a store call every tick during a database restart
// says so twice, not every tick.
package outage

import (
	"context"
	"github.com/c1702965/sqlstreams/internal/codes"
	"log/slog"
)

// Reporter tracks one actor's outage. The zero value needs Logger and What.
type Reporter struct {
	Logger  *slog.Logger
	What    string // e.g. "claimer store call"
	Retry   string // how it retries, e.g. "every poll"
	Attrs   []any
	failing bool
}

// Report records the result of one attempt. Errors after the actor's own
// context ended are its stop, not an outage.
func (r *Reporter) Report(ctx context.Context, err error) {
	switch {
	case err != nil && !r.failing && ctx.Err() == nil:
		r.failing = true
		codes.StoreOutage.Log(ctx, r.Logger, r.What+" failed; retrying "+r.Retry, append(append([]any{}, r.Attrs...), "error", err)...)
	case err == nil && r.failing:
		r.failing = false
		r.Logger.Info(r.What+" recovered", r.Attrs...)
	}
}
