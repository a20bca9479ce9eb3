package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
)

// Retention drops messages older than their stream's RetentionTTL, never
// one a group has not committed and never a dead letter's message. The log
// is partitioned by xid into chunks (decision 0011): retention keeps one
// chunk's worth of xids attached ahead of the current xid, sizing each new
// chunk from the xid rate it measured since its previous round so that a
// chunk spans about ChunkInterval of time, and drops whole chunks behind
// every group's committed position once all their rows are past the TTL.
// Rows no chunk covered (the default partition) it deletes in bounded
// batches.
type Retention struct {
	Store  *store.Store
	DBNow  func() store.Now
	Logger *slog.Logger
	// Deleted counts the messages deleted row by row, ChunkRows those
	// dropped with their chunk (tests and stats).
	Deleted, ChunkRows atomic.Int64
	// ChunksAdded and ChunksDropped count chunk attachments and drops.
	ChunksAdded, ChunksDropped atomic.Int64

	// samples are the xid clocks of this worker's last rateWindow rounds
	// per stream: the rate over them sizes the next chunk, smoothing a burst
	// (a group catching up claims many ranges in one round). Only Round, on
	// the manager's goroutine, touches it.
	samples map[int64][]store.XidClock
}

// RetentionWorker is the retention worker's worker_config name.
const RetentionWorker = "retention"

// Name implements Worker.
func (r *Retention) Name() string { return RetentionWorker }

// Chunk sizes in xids: a chunk is never narrower than MinChunkXids (an idle
// cluster would otherwise make a table per handful of transactions) nor
// wider than MaxChunkXids.
const (
	rateWindow   = 8
	MinChunkXids = 100
	MaxChunkXids = 50_000_000
)

// Round implements Worker: for each stream with a RetentionTTL, up to
// k.MaxBatches statements of k.Batch rows each.
func (r *Retention) Round(ctx context.Context, k Resolved) error {
	interval := k.ChunkInterval
	streams, err := r.Store.Streams(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range streams {
		doc, err := settings.ParseStream(s.Config)
		if err != nil {
			continue
		}
		ttl, err := doc.Retention()
		if err != nil {
			errs = append(errs, fmt.Errorf("stream %q: %w", s.Name, err))
			continue
		}
		if ttl == 0 {
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
		chunkInterval := interval
		if chunkInterval <= 0 {
			chunkInterval = ttl / 4
		}
		if err := r.chunks(ctx, s.ID, ttl, chunkInterval, k.MaxBatches); err != nil {
			errs = append(errs, fmt.Errorf("stream %q: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}

// chunks drops up to maxDrops expired chunks, oldest first, and attaches the
// next chunk when less than one chunk's width of xids is left ahead. A chunk
// whose lock is busy waits for the next round without an error.
func (r *Retention) chunks(ctx context.Context, streamID int64, ttl, interval time.Duration, maxDrops int) error {
	clk, err := r.Store.ReadXidClock(ctx, r.DBNow())
	if err != nil {
		return err
	}
	chunks, err := r.Store.Chunks(ctx, streamID)
	if err != nil {
		return err
	}
	for len(chunks) > 0 && maxDrops > 0 {
		maxDrops--
		d, err := r.Store.DropChunk(ctx, streamID, chunks[0], ttl, r.DBNow())
		if errors.Is(err, store.ErrChunkBusy) {
			break
		}
		if err != nil {
			return err
		}
		if !d.Dropped {
			break
		}
		r.ChunksDropped.Add(1)
		r.ChunkRows.Add(d.Rows - d.Kept)
		chunks = chunks[1:]
	}

	if r.samples == nil {
		r.samples = map[int64][]store.XidClock{}
	}
	window := append(r.samples[streamID], clk)
	if len(window) > rateWindow {
		window = window[len(window)-rateWindow:]
	}
	r.samples[streamID] = window
	prev := window[0]
	elapsed := clk.At.Sub(prev.At)
	if len(window) < 2 || elapsed <= 0 || clk.Next < prev.Next {
		return nil // no rate yet: the default partition takes the rows meanwhile
	}
	width := int64(float64(clk.Next-prev.Next) / elapsed.Seconds() * interval.Seconds())
	width = min(max(width, MinChunkXids), MaxChunkXids)
	top := int64(0)
	if len(chunks) > 0 {
		top = chunks[len(chunks)-1].Hi
	}
	if top-clk.Next >= width {
		return nil
	}
	lo := max(top, clk.Next)
	dtop, err := r.Store.DefaultTop(ctx, streamID)
	if err != nil {
		return err
	}
	lo = max(lo, dtop)
	err = r.Store.AddChunk(ctx, streamID, lo, lo+width, r.DBNow())
	if errors.Is(err, store.ErrChunkBusy) {
		return nil
	}
	if err != nil {
		return err
	}
	r.ChunksAdded.Add(1)
	return nil
}
