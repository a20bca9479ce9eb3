package sqlstreams

import (
	"context"
	"fmt"
	"time"
)

// DeadLetter is a message that ran out of retries (or failed terminally)
// for a group. Its payload stays in the log; its row stays until redriven.
type DeadLetter struct {
	MessageID  int64
	Attempts   int
	LastError  string
	DiedAt     time.Time
	Key        string
	RoutingKey string
	Version    int
	ProducedAt time.Time
}

// DeadLetters lists the group's dead letters in message id order, after
// afterID (0 for the first page), at most limit (1..1000).
func (c *Consumer[T]) DeadLetters(ctx context.Context, afterID int64, limit int) ([]DeadLetter, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("%w: DeadLetters limit %d outside 1..1000", ErrInvalidConfig, limit)
	}
	rows, err := c.db().ListDead(ctx, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("dead letters of %q: %w", c.group.Name, err)
	}
	out := make([]DeadLetter, len(rows))
	for i, r := range rows {
		out[i] = DeadLetter(r)
	}
	return out, nil
}

// Redrive puts one dead letter back on the retry curve from attempt zero,
// due now. It reports whether the message was dead.
func (c *Consumer[T]) Redrive(ctx context.Context, messageID int64) (bool, error) {
	n, err := c.db().Redrive(ctx, &messageID, c.s.c.dbNow())
	if err != nil {
		return false, fmt.Errorf("redrive message %d of %q: %w", messageID, c.group.Name, err)
	}
	return n > 0, nil
}

// RedriveAll puts every dead letter of the group back on the curve and
// returns how many.
func (c *Consumer[T]) RedriveAll(ctx context.Context) (int64, error) {
	n, err := c.db().Redrive(ctx, nil, c.s.c.dbNow())
	if err != nil {
		return 0, fmt.Errorf("redrive dead letters of %q: %w", c.group.Name, err)
	}
	return n, nil
}
