package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// Retention drops messages older than their stream's RetentionTTL, in
// bounded batches, never one a group has not committed and never a dead
// letter's message.
type Retention struct {
	Store  *store.Store
	DBNow  func() store.Now
	Logger *slog.Logger
	// Deleted counts the messages dropped (tests and stats).
	Deleted atomic.Int64
}

// RetentionWorker is the retention worker's worker_config name.
const RetentionWorker = "retention"

// Name implements Worker.
func (r *Retention) Name() string { return RetentionWorker }

// streamDoc is the part of a stream's stored config retention reads.
type streamDoc struct {
	RetentionTTL string `json:"retention_ttl"`
}

// Round implements Worker: for each stream with a RetentionTTL, up to
// k.MaxBatches statements of k.Batch rows each.
func (r *Retention) Round(ctx context.Context, k Resolved) error {
	streams, err := r.Store.Streams(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range streams {
		var doc streamDoc
		if err := json.Unmarshal(s.Config, &doc); err != nil || doc.RetentionTTL == "" {
			continue
		}
		ttl, err := time.ParseDuration(doc.RetentionTTL)
		if err != nil || ttl <= 0 {
			errs = append(errs, fmt.Errorf("stream %q: retention_ttl %q is not a positive duration", s.Name, doc.RetentionTTL))
			continue
		}
		for range k.MaxBatches {
			n, err := r.Store.DeleteExpired(ctx, s.ID, ttl, k.Batch, r.DBNow())
			if err != nil {
				errs = append(errs, fmt.Errorf("stream %q: %w", s.Name, err))
				break
			}
			r.Deleted.Add(n)
			if n < int64(k.Batch) {
				break
			}
		}
	}
	return errors.Join(errs...)
}
