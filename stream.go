package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"
	"unicode"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/settings"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/jackc/pgx/v5"
)

// DefaultMaxMessageBytes is a stream's MaxMessageBytes unless declared.
const DefaultMaxMessageBytes = 1 << 20

// MaxMessageBytesLimit is the largest MaxMessageBytes a stream may declare.
const MaxMessageBytesLimit = 64 << 20

// MaxKeyBytes bounds message keys and idempotency keys.
const MaxKeyBytes = 255

// StreamConfig is a stream's stored config, declared at Register. Newest
// declaration wins.
type StreamConfig struct {
	// MaxMessageBytes is the largest encoded payload Produce accepts.
	// Default DefaultMaxMessageBytes (1 MiB); at most MaxMessageBytesLimit.
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`
	// RetentionTTL is how long a message is kept after it was produced:
	// the manager's retention worker drops older ones, in bounded batches,
	// but never one that some consumer group of the stream has not
	// committed, and never a dead letter's message. Default 0: kept forever.
	RetentionTTL time.Duration `json:"-"`
}

// MarshalJSON writes the stored form (internal/settings.Stream): sparse,
// durations as "24h0m0s".
func (c StreamConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(settings.Stream{MaxMessageBytes: c.MaxMessageBytes, RetentionTTL: string(settings.Of(c.RetentionTTL))})
}

// UnmarshalJSON reads the stored form.
func (c *StreamConfig) UnmarshalJSON(b []byte) error {
	d, err := settings.ParseStream(b)
	if err != nil {
		return err
	}
	ttl, err := d.Retention()
	if err != nil {
		return err
	}
	*c = StreamConfig{MaxMessageBytes: d.MaxMessageBytes, RetentionTTL: ttl}
	return nil
}

func (c *StreamConfig) validate() error {
	if c == nil {
		return nil
	}
	if c.MaxMessageBytes < 0 || c.MaxMessageBytes > MaxMessageBytesLimit {
		return fmt.Errorf("%w: StreamConfig.MaxMessageBytes %d outside 0..%d", ErrInvalidConfig, c.MaxMessageBytes, MaxMessageBytesLimit)
	}
	if c.RetentionTTL < 0 {
		return fmt.Errorf("%w: StreamConfig.RetentionTTL must not be negative", ErrInvalidConfig)
	}
	return nil
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	return c
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func validateName(kind, name string) error {
	if !nameRe.MatchString(name) {
		return fmt.Errorf("%w: %s name %q must be 1-128 of letters, digits, '.', '_', '-', starting with a letter or digit", ErrInvalidName, kind, name)
	}
	return nil
}

func validateKey(kind, key string) error {
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrInvalidKey, kind, len(key), MaxKeyBytes)
	}
	for _, r := range key {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("%w: %s %q holds a control character or invalid UTF-8", ErrInvalidKey, kind, key)
		}
	}
	return nil
}

// StreamHandle is a typed handle on a stream. It is cheap; make one per use or
// keep one, it is safe for concurrent use.
type StreamHandle[T any] struct {
	c       *Client
	name    string
	version int

	mu  sync.Mutex
	row *store.StreamRow
	cfg StreamConfig // effective (defaults filled)
}

// Stream returns the handle of the stream called name, carrying messages of
// type T. Nothing is checked until the handle is used: a bad name, or a nil
// client, is the error of its first call.
//
// Stream names are 1 to 128 bytes of ASCII letters, digits, '.', '_' and
// '-', starting with a letter or digit (orders.placed, billing-v2). Consumer
// group and schedule names follow the same rule. Names are case-sensitive.
func Stream[T any](c *Client, name string) *StreamHandle[T] {
	return &StreamHandle[T]{c: c, name: name, version: schemaVersion[T]()}
}

// errNilClient is every call's error on a handle made from a nil client.
var errNilClient = fmt.Errorf("%w: the stream handle was made from a nil *Client (use NewClient)", ErrInvalidConfig)

// Name returns the stream's name.
func (s *StreamHandle[T]) Name() string { return s.name }

// MaxProducedIn bounds ProducedIn.
const MaxProducedIn = 10000

// ProducedIn returns the messages tx has produced to this stream so far,
// visible in tx and not yet committed, oldest first (at most
// MaxProducedIn), decoded into T. It is for tests of code that produces in
// its caller's transaction (sqlstreamstest.RequireProduced); it writes
// nothing, and a transaction that has written nothing gets none.
func (s *StreamHandle[T]) ProducedIn(ctx context.Context, tx pgx.Tx) ([]T, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: ProducedIn needs a transaction", ErrInvalidConfig)
	}
	row, _, err := s.resolve(ctx, tx)
	if err != nil {
		return nil, err
	}
	raws, err := s.c.store.ProducedIn(ctx, tx, row.ID, MaxProducedIn)
	if err != nil {
		return nil, fmt.Errorf("stream %q: %w", s.name, err)
	}
	out := make([]T, len(raws))
	for i, raw := range raws {
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			return nil, fmt.Errorf("%w: a message of stream %q into %T", ErrDecode, s.name, out[i])
		}
	}
	return out, nil
}

// Register creates the stream and its tables, or reuses them, and stores cfg
// (nil declares the defaults). A declaration that changes the stored config
// is logged as a warning naming the change.
func (s *StreamHandle[T]) Register(ctx context.Context, cfg *StreamConfig) error {
	if s.c == nil {
		return errNilClient
	}
	if err := validateName("stream", s.name); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	var declared StreamConfig
	if cfg != nil {
		declared = *cfg
	}
	doc, err := json.Marshal(declared)
	if err != nil {
		return fmt.Errorf("register stream %q: encode config: %w", s.name, err)
	}
	row, old, changed, created, err := s.c.store.RegisterStream(ctx, s.name, doc, declaredBy(), s.c.dbNow())
	if err != nil {
		return ownerOnly(err, "registering a stream (creating or upgrading its tables)")
	}
	if changed && !created {
		changes, err := groupconfig.DiffDoc(old, doc)
		if err != nil {
			return fmt.Errorf("register stream %q: %w", s.name, err)
		}
		s.c.redeclared(ctx, "stream", s.name, changes)
	}
	s.mu.Lock()
	s.row, s.cfg = &row, declared.withDefaults()
	s.mu.Unlock()
	return nil
}

// resolve returns the stream's row and effective config, reading them once,
// on q (a caller's transaction: a produce inside it needs no other
// connection) or on the pool when q is nil.
func (s *StreamHandle[T]) resolve(ctx context.Context, q store.Querier) (store.StreamRow, StreamConfig, error) {
	if s.c == nil {
		return store.StreamRow{}, StreamConfig{}, errNilClient
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.row != nil {
		return *s.row, s.cfg, nil
	}
	if err := validateName("stream", s.name); err != nil {
		return store.StreamRow{}, StreamConfig{}, err
	}
	row, err := s.c.store.LookupStream(ctx, q, s.name)
	if err != nil {
		return row, StreamConfig{}, err
	}
	var cfg StreamConfig
	if err := json.Unmarshal(row.Config, &cfg); err != nil {
		return row, cfg, fmt.Errorf("stream %q: stored config: %w", s.name, err)
	}
	s.row, s.cfg = &row, cfg.withDefaults()
	return row, s.cfg, nil
}

// forget drops the cached row once the database says it no longer matches
// (ErrStreamChanged): the next call reads the stream again by name.
func (s *StreamHandle[T]) forget() {
	s.mu.Lock()
	s.row = nil
	s.mu.Unlock()
}

// ProduceOptions ride one Produce call: the message's own fields, and the
// transaction it is produced in. nil means none. ProduceBatch takes the same
// per-message fields on each BatchItem, and its per-call ones in
// BatchOptions.
type ProduceOptions struct {
	// RoutingKey is the message's routing key, matched against consumer
	// groups' binding patterns: words of one or more ASCII letters, digits,
	// '_' or '-', separated by '.' (payments.card.eu), at most 255 bytes,
	// case-sensitive; no empty word, no '*' or '#'. Empty means none, and a
	// message without one reaches only groups without bindings
	// (ErrInvalidRoutingKey otherwise). Produce only.
	RoutingKey string
	// Key is the message key consumers' per-key concurrency (Exclusive,
	// Ordered) works on: any UTF-8 text of at most MaxKeyBytes (255) bytes
	// without control characters (ErrInvalidKey otherwise). Empty means
	// none. Produce only.
	Key string
	// IdempotencyKey makes the produce idempotent: a repeated key writes
	// nothing and reports Duplicate. The same rule as Key. Keys are kept
	// for the prune worker's IdempotencyTTL (7 days by default). Produce
	// only.
	IdempotencyKey string
	// Message is what the message asks of its consumers (timeout, retry
	// curve, key concurrency), stored with it, sparse: unset fields take
	// the group's and the library's defaults.
	Message *MessageOptions
	// Headers are the message's headers (trace context, a correlation
	// id): bounded and validated (see Headers), stored with it, handed to
	// consumers in Meta.Headers, never logged.
	Headers Headers
	// Tx, if set, produces inside the caller's transaction: the message
	// exists exactly when it commits, and everything the produce needs runs
	// on that transaction (no second connection is taken from the pool). A
	// transaction that has already committed or rolled back is refused with
	// an error wrapping pgx.ErrTxClosed, and nothing is written.
	Tx pgx.Tx
}

// BatchOptions ride one ProduceBatch call. nil means none.
type BatchOptions struct {
	// Message holds the batch's defaults, merged under each item's own
	// options and stored with each message.
	Message *MessageOptions
	// Tx, if set, produces the batch inside the caller's transaction, as
	// ProduceOptions.Tx does.
	Tx pgx.Tx
}

// Produced reports one produced message.
type Produced struct {
	// ID is the message's id. For a Duplicate it is the id of the message
	// that holds the key, or 0 if that message is not yet visible.
	ID int64
	// Duplicate is true when an earlier message holds the idempotency key
	// and nothing was written.
	Duplicate bool
}

// BatchItem is one message of a ProduceBatch; its fields follow the rules
// of ProduceOptions' fields of the same names.
type BatchItem[T any] struct {
	Msg            T
	RoutingKey     string
	Key            string
	IdempotencyKey string
	// Message is the item's own options, over BatchOptions.Message.
	Message *MessageOptions
	// Headers are the item's headers (see Headers).
	Headers Headers
}

// Produce writes one message. A msg that encodes to JSON null (a nil
// pointer, json.RawMessage or interface) is refused with ErrEncode.
// Produce does not retry: while the database cannot be reached it fails at
// once with an error wrapping ErrUnavailable and the cause (retry it, with
// an IdempotencyKey if a lost reply must not produce twice).
func (s *StreamHandle[T]) Produce(ctx context.Context, msg T, opts *ProduceOptions) (Produced, error) {
	var o ProduceOptions
	if opts != nil {
		o = *opts
	}
	item := BatchItem[T]{Msg: msg, RoutingKey: o.RoutingKey, Key: o.Key, IdempotencyKey: o.IdempotencyKey, Message: o.Message, Headers: o.Headers}
	out, err := s.produce(ctx, []BatchItem[T]{item}, &BatchOptions{Tx: o.Tx}, "ProduceOptions.Message")
	if err != nil {
		return Produced{}, err
	}
	return out[0], nil
}

// ProduceBatch writes items atomically, all or none, in one statement (one
// batch of statements when some carry an idempotency key). The log holds them
// in the order of items, and so are the results. On the pool, the wake-up
// for consumers follows the commit in a second short statement, merged with
// other produces' wake-ups; under load these go out at most every 10 ms,
// and the call may return before its wake-up is sent (decision 0044).
func (s *StreamHandle[T]) ProduceBatch(ctx context.Context, items []BatchItem[T], opts *BatchOptions) ([]Produced, error) {
	var o BatchOptions
	if opts != nil {
		o = *opts
	}
	if len(items) == 0 {
		return nil, nil
	}
	return s.produce(ctx, items, &o, "BatchItem.Message")
}

// produce validates and encodes everything before writing anything;
// itemField names an item's options in errors.
func (s *StreamHandle[T]) produce(ctx context.Context, items []BatchItem[T], o *BatchOptions, itemField string) (out []Produced, err error) {
	if s.c != nil && s.c.cfg.Tracer != nil {
		var trace Headers
		var end func(error)
		ctx, trace, end = s.c.cfg.Tracer.StartSend(ctx, s.name, len(items))
		defer endSpan(end, &err)
		items = withHeaders(items, trace)
	}
	return s.produceItems(ctx, items, o, itemField)
}

// withHeaders returns items with add merged into each one's headers (an
// item's own header of the same name wins), copying what it changes.
func withHeaders[T any](items []BatchItem[T], add Headers) []BatchItem[T] {
	if len(add) == 0 {
		return items
	}
	out := make([]BatchItem[T], len(items))
	for i, it := range items {
		h := make(Headers, len(add)+len(it.Headers))
		for k, v := range add {
			h[k] = v
		}
		for k, v := range it.Headers {
			h[k] = v
		}
		it.Headers = h
		out[i] = it
	}
	return out
}

func (s *StreamHandle[T]) produceItems(ctx context.Context, items []BatchItem[T], o *BatchOptions, itemField string) ([]Produced, error) {
	var q store.Querier
	if o.Tx != nil {
		q = o.Tx
	}
	row, cfg, err := s.resolve(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("produce to %q: %w", s.name, unavailable(err))
	}
	if err := o.Message.validate("BatchOptions.Message"); err != nil {
		return nil, err
	}
	msgs := make([]store.NewMessage, len(items))
	enc := getPayloadEncoder()
	defer putPayloadEncoder(enc)
	for i := range items {
		it := &items[i]
		if err := topic.ValidateRoutingKey(it.RoutingKey); err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w", s.name, i, err)
		}
		if err := validateKey("message key", it.Key); err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w", s.name, i, err)
		}
		if err := validateKey("idempotency key", it.IdempotencyKey); err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w", s.name, i, err)
		}
		if err := it.Message.validate(itemField); err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w", s.name, i, err)
		}
		if err := it.Headers.validate(); err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w", s.name, i, err)
		}
		headers, err := it.Headers.encode()
		if err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: encode headers: %w", s.name, i, err)
		}
		merged := it.Message.merge(o.Message)
		if c := merged.layer().Concurrency; c.Keyed() && it.Key == "" {
			return nil, fmt.Errorf("produce to %q: message %d: %w: concurrency %q needs a message key", s.name, i, ErrInvalidKey, c)
		}
		payload, err := enc.encode(it.Msg, len(items)-i)
		if err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w: %T: %v", s.name, i, ErrEncode, it.Msg, err)
		}
		if err := refuseNull(payload); err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: %w", s.name, i, err)
		}
		if len(payload) > cfg.MaxMessageBytes {
			return nil, fmt.Errorf("produce to %q: message %d: %w: %d bytes encoded, limit %d", s.name, i, ErrMessageTooLarge, len(payload), cfg.MaxMessageBytes)
		}
		opts, err := merged.encode()
		if err != nil {
			return nil, fmt.Errorf("produce to %q: message %d: encode options: %w", s.name, i, err)
		}
		msgs[i] = store.NewMessage{
			Version: s.version, RoutingKey: it.RoutingKey, Key: it.Key,
			IdempotencyKey: it.IdempotencyKey, Payload: payload, Options: opts, Headers: headers,
		}
	}
	enc.finish(msgs)
	res, err := s.c.store.Produce(ctx, q, store.StreamRef{ID: row.ID, Name: s.name}, msgs, s.c.dbNow())
	if errors.Is(err, store.ErrStreamChanged) {
		s.forget()
	}
	if err != nil {
		return nil, fmt.Errorf("produce to %q: %w", s.name, unavailable(err))
	}
	if q == nil { // on a caller's transaction the wake-up rode it
		s.c.wake(ctx, s.name, row.ID, msgs)
	}
	out := make([]Produced, len(res))
	written := 0
	for i, r := range res {
		out[i] = Produced{ID: r.ID, Duplicate: r.Duplicate}
		if !r.Duplicate {
			written++
		}
	}
	if written > 0 {
		s.c.observer().Produced(s.name, written)
	}
	return out, nil
}

// wake sends the wake-up of a produce that committed on the pool, merged
// with those of produces committing meanwhile (internal/wakeup). A failed
// wake-up is logged, not returned: the messages are written, and consumers
// find them at their next poll.
func (c *Client) wake(ctx context.Context, stream string, streamID int64, msgs []store.NewMessage) {
	keys := make([]string, len(msgs))
	for i := range msgs {
		keys[i] = msgs[i].RoutingKey
	}
	if err := c.wakes.Wake(ctx, streamID, keys, c.store.SendWakes); err != nil {
		codes.WakeFailed.Log(ctx, c.cfg.Logger, "sqlstreams: produced, but the wake-up notification failed; consumers will see the messages at their next poll",
			"stream", stream, "err", err)
	}
}
