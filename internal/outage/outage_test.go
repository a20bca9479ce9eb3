package outage

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

type sink struct{ msgs []string }

func (s *sink) Enabled(context.Context, slog.Level) bool { return true }
func (s *sink) Handle(_ context.Context, r slog.Record) error {
	s.msgs = append(s.msgs, r.Message)
	return nil
}
func (s *sink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *sink) WithGroup(string) slog.Handler      { return s }

func TestReportsOncePerOutage(t *testing.T) {
	s := &sink{}
	r := &Reporter{Logger: slog.New(s), What: "claim", Retry: "every poll"}
	ctx := context.Background()
	for range 3 {
		r.Report(ctx, errors.New("down"))
	}
	r.Report(ctx, nil)
	r.Report(ctx, nil)
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	r.Report(stopped, errors.New("context canceled"))
	require.Equal(t, []string{"claim failed; retrying every poll", "claim recovered"}, s.msgs)
}
