package sqlstreams

import (
	"context"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// DeadLetter is a message that ran out of retries (or failed terminally)
// for a group. Its payload stays in the log; its row stays until redriven.
type DeadLetter struct {
	MessageID  int64     `json:"message_id"`
	Attempts   int       `json:"attempts"`
	LastError  string    `json:"last_error"`
	DiedAt     time.Time `json:"died_at"`
	Key        string    `json:"key"`
	RoutingKey string    `json:"routing_key"`
	Version    int       `json:"version"`
	ProducedAt time.Time `json:"produced_at"`
	// ReadFrom says whether a replica served the read (ReadPool).
	ReadFrom
}

func deadLetter(d store.DeadLetter, from ReadFrom) DeadLetter {
	return DeadLetter{MessageID: d.MessageID, Attempts: d.Attempts, LastError: d.LastError, DiedAt: d.DiedAt, Key: d.Key,
		RoutingKey: d.RoutingKey, Version: d.Version, ProducedAt: d.ProducedAt, ReadFrom: from}
}

// DeadLetters lists the group's dead letters in message id order, after
// afterID (0 for the first page), at most limit (1..1000).
func (c *Consumer[T]) DeadLetters(ctx context.Context, afterID int64, limit int) ([]DeadLetter, error) {
	return c.admin().DeadLetters(ctx, afterID, limit)
}

// Redrive puts one dead letter back on the retry curve from attempt zero,
// due now. It reports whether the message was dead.
func (c *Consumer[T]) Redrive(ctx context.Context, messageID int64) (bool, error) {
	return c.admin().Redrive(ctx, messageID)
}

// RedriveAll puts every dead letter of the group back on the curve and
// returns how many.
func (c *Consumer[T]) RedriveAll(ctx context.Context) (int64, error) {
	return c.admin().RedriveAll(ctx)
}

// admin is the consumer's group as the operator's handle sees it.
func (c *Consumer[T]) admin() *Group { return &Group{c: c.s.c, stream: c.s.name, row: c.group} }
