package manager

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// Prune keeps the append-only ledgers bounded: superseded waiting rows of
// the binding declaration ledger, config snapshots beyond the newest
// ConfigLogKeep per owner when that knob is set (by default every one is
// kept: seed 001's worker_config_log is the whole history), delivery-log rows older than DeliveryTTL and
// idempotency keys older than IdempotencyTTL, and worker_instance rows
// expired longer than InstanceKeep. Every statement is bounded by
// the worker's Batch; a round by MaxBatches per table.
type Prune struct {
	Store *store.Store
	DBNow func() store.Now
	// Pruned counts the rows dropped (tests and stats).
	Pruned atomic.Int64
}

// PruneWorker is the prune worker's worker_config name.
const PruneWorker = "prune"

// Name implements Worker.
func (p *Prune) Name() string { return PruneWorker }

// DefaultPruneInterval is the prune worker's default round interval. A round
// runs three statements per stream, each planned for the stream's own
// tables: at 1,000 streams a round a minute cost 1.5% of a core while
// pruning nothing (issue 22). What it drops lives for hours or days
// (DeliveryTTL, IdempotencyTTL, InstanceKeep), so ten minutes late costs
// nothing.
const DefaultPruneInterval = 10 * time.Minute

// DefaultInterval implements the manager's per-worker default.
func (p *Prune) DefaultInterval() time.Duration { return DefaultPruneInterval }

// Round implements Worker.
func (p *Prune) Round(ctx context.Context, k Resolved) error {
	deliveryTTL, idemTTL, instanceKeep, keep := k.DeliveryTTL, k.IdempotencyTTL, k.InstanceKeep, k.ConfigLogKeep
	var errs []error
	loop := func(f func() (int64, error)) {
		for range k.MaxBatches {
			n, err := f()
			if err != nil {
				errs = append(errs, err)
				return
			}
			p.Pruned.Add(n)
			if n < int64(k.Batch) {
				return
			}
		}
	}
	if keep > 0 { // 0 (the default) keeps every earlier document, as seed 001 says
		loop(func() (int64, error) { return p.Store.PruneConfigLogs(ctx, keep, k.Batch) })
	}
	loop(func() (int64, error) { return p.Store.PruneInstances(ctx, instanceKeep, k.Batch, p.DBNow()) })
	streams, err := p.Store.Streams(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, s := range streams {
		loop(func() (int64, error) { return p.Store.PruneBindingLedger(ctx, s.ID, k.Batch) })
		loop(func() (int64, error) { return p.Store.PruneDeliveries(ctx, s.ID, deliveryTTL, k.Batch, p.DBNow()) })
		loop(func() (int64, error) { return p.Store.PruneIdempotency(ctx, s.ID, idemTTL, k.Batch, p.DBNow()) })
	}
	return errors.Join(errs...)
}
