package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// Prune keeps the append-only ledgers bounded: superseded waiting rows of
// the binding declaration ledger, config snapshots beyond the newest
// ConfigLogKeep per owner, delivery-log rows older than DeliveryTTL and
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

// Defaults of the prune worker's own knobs.
const (
	DefaultDeliveryTTL    = 7 * 24 * time.Hour
	DefaultIdempotencyTTL = 7 * 24 * time.Hour
	DefaultConfigLogKeep  = 100
	DefaultInstanceKeep   = 24 * time.Hour
)

// pruneKnobs are the prune worker's own fields of its metadata document.
type pruneKnobs struct {
	DeliveryTTL    string `json:"delivery_ttl,omitempty"`
	IdempotencyTTL string `json:"idempotency_ttl,omitempty"`
	ConfigLogKeep  int    `json:"config_log_keep,omitempty"`
	InstanceKeep   string `json:"instance_keep,omitempty"`
}

// Name implements Worker.
func (p *Prune) Name() string { return PruneWorker }

func durKnob(v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return def, fmt.Errorf("worker metadata: %q is not a positive duration", v)
	}
	return d, nil
}

// Round implements Worker.
func (p *Prune) Round(ctx context.Context, k Resolved) error {
	var pk pruneKnobs
	_ = json.Unmarshal(k.Doc, &pk) // unreadable: defaults (ParseKnobs already reported it)
	deliveryTTL, err1 := durKnob(pk.DeliveryTTL, DefaultDeliveryTTL)
	idemTTL, err2 := durKnob(pk.IdempotencyTTL, DefaultIdempotencyTTL)
	instanceKeep, err3 := durKnob(pk.InstanceKeep, DefaultInstanceKeep)
	keep := pk.ConfigLogKeep
	if keep <= 0 {
		keep = DefaultConfigLogKeep
	}
	errs := []error{err1, err2, err3}
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
	loop(func() (int64, error) { return p.Store.PruneConfigLogs(ctx, keep, k.Batch) })
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
