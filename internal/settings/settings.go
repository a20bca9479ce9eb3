// Package settings holds the stored documents that are neither a group's
// config (internal/groupconfig) nor a message's options (internal/policy): a
// stream's config and a maintenance worker's knobs. Each is one typed
// struct, written and read by the same code, so the public API (which
// builds them) and the workers (which read them) cannot disagree on a key.
//
// It is part of the engine's inside, not an API for users.
package settings

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Stream is a stream's stored config: sparse, durations as "24h0m0s".
type Stream struct {
	MaxMessageBytes int    `json:"max_message_bytes,omitempty"`
	RetentionTTL    string `json:"retention_ttl,omitempty"`
}

// ParseStream reads a stream's stored config.
func ParseStream(doc []byte) (Stream, error) {
	var s Stream
	if len(doc) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(doc, &s); err != nil {
		return s, fmt.Errorf("stream config: %w", err)
	}
	return s, nil
}

// Retention returns the stream's RetentionTTL (0: kept forever).
func (s Stream) Retention() (time.Duration, error) {
	if s.RetentionTTL == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s.RetentionTTL)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("retention_ttl %q is not a positive duration", s.RetentionTTL)
	}
	return d, nil
}

// Worker is a maintenance worker's declared knobs: the metadata document of
// its worker_config row. Every field is optional; unset fields resolve to
// the defaults below when read (Resolve), so a library upgrade moves them.
type Worker struct {
	// Instances is how many managers of the fleet run the worker; 0 with
	// Instances set suspends it.
	Instances *int `json:"instances,omitempty"`
	// Interval is how often the worker does a round of work.
	Interval Duration `json:"interval,omitempty"`
	// Batch bounds the rows one statement touches; MaxBatches the
	// statements of one round.
	Batch      int `json:"batch,omitempty"`
	MaxBatches int `json:"max_batches,omitempty"`

	// The prune worker's.
	DeliveryTTL    Duration `json:"delivery_ttl,omitempty"`
	IdempotencyTTL Duration `json:"idempotency_ttl,omitempty"`
	ConfigLogKeep  int      `json:"config_log_keep,omitempty"`
	InstanceKeep   Duration `json:"instance_keep,omitempty"`

	// The retention worker's: how much time one chunk of a log spans.
	ChunkInterval Duration `json:"chunk_interval,omitempty"`
}

// Duration is a duration stored as "5m0s"; empty is unset.
type Duration string

// Of returns d as stored; 0 is unset.
func Of(d time.Duration) Duration {
	if d <= 0 {
		return ""
	}
	return Duration(d.String())
}

func (d Duration) parse(def time.Duration, field string) (time.Duration, error) {
	if d == "" {
		return def, nil
	}
	v, err := time.ParseDuration(string(d))
	if err != nil || v <= 0 {
		return def, fmt.Errorf("worker metadata: %s %q is not a positive duration", field, d)
	}
	return v, nil
}

// Doc is the stored form.
func (w Worker) Doc() ([]byte, error) { return json.Marshal(w) }

// Defaults of the knobs every worker has and of the workers' own.
const (
	DefaultInterval       = time.Minute
	DefaultBatch          = 5000
	DefaultMaxBatches     = 20
	DefaultDeliveryTTL    = 7 * 24 * time.Hour
	DefaultIdempotencyTTL = 7 * 24 * time.Hour
	DefaultConfigLogKeep  = 0 // every document is kept (seed 001)
	DefaultInstanceKeep   = 24 * time.Hour
)

// Resolved are a worker's knobs with every default applied.
type Resolved struct {
	Instances      int
	Interval       time.Duration
	Batch          int
	MaxBatches     int
	DeliveryTTL    time.Duration
	IdempotencyTTL time.Duration
	ConfigLogKeep  int
	InstanceKeep   time.Duration
	// ChunkInterval is 0 when unset: retention then derives it from each
	// stream's RetentionTTL.
	ChunkInterval time.Duration
}

// Resolve reads a metadata document. An unreadable field keeps its default
// and the error says which, so a bad declaration never stops the work.
// interval is the worker's own default Interval (0: DefaultInterval).
func Resolve(doc []byte, interval time.Duration) (Resolved, error) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	r := Resolved{Instances: 1, Interval: interval, Batch: DefaultBatch, MaxBatches: DefaultMaxBatches,
		DeliveryTTL: DefaultDeliveryTTL, IdempotencyTTL: DefaultIdempotencyTTL, ConfigLogKeep: DefaultConfigLogKeep,
		InstanceKeep: DefaultInstanceKeep}
	var w Worker
	if len(doc) > 0 {
		if err := json.Unmarshal(doc, &w); err != nil {
			return r, fmt.Errorf("worker metadata: %w", err)
		}
	}
	var errs []error
	dur := func(dst *time.Duration, d Duration, field string) {
		v, err := d.parse(*dst, field)
		*dst, errs = v, append(errs, err)
	}
	if w.Instances != nil && *w.Instances >= 0 {
		r.Instances = *w.Instances
	}
	dur(&r.Interval, w.Interval, "interval")
	dur(&r.DeliveryTTL, w.DeliveryTTL, "delivery_ttl")
	dur(&r.IdempotencyTTL, w.IdempotencyTTL, "idempotency_ttl")
	dur(&r.InstanceKeep, w.InstanceKeep, "instance_keep")
	dur(&r.ChunkInterval, w.ChunkInterval, "chunk_interval")
	if w.Batch > 0 {
		r.Batch = w.Batch
	}
	if w.MaxBatches > 0 {
		r.MaxBatches = w.MaxBatches
	}
	if w.ConfigLogKeep > 0 {
		r.ConfigLogKeep = w.ConfigLogKeep
	}
	return r, errors.Join(errs...)
}
