package sqlstreams

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/backoff"
	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/wakeup"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ClientConfig is the ambient config of a Client. The zero value is usable.
type ClientConfig struct {
	// Schema holds every table of this client. Default "sqlstreams". Must be
	// a plain lower-case SQL identifier (see ValidateSchema): a letter or
	// '_', then letters, digits or '_', at most 63 bytes, and neither
	// information_schema nor starting with pg_ (PostgreSQL's own).
	Schema string
	// Logger receives the library's events. Default slog.Default(). In the
	// steady state nothing is logged; every WARN and ERROR line carries a
	// stable code attribute (code=SQLnnnn, docs/codes.md).
	Logger *slog.Logger
	// Clock drives every Go-side interval. Default RealClock(). A mock
	// (ClockOf(clock.NewMock())) also becomes the database's now() for every
	// time-dependent statement, which is how tests and the simulator
	// control leases.
	Clock Clock
	// Retry is how the client's actors retry their own store calls after a
	// transient failure (a lost connection, a restarting server, a
	// serialization failure): each waits Retry's backoff before its next
	// attempt; a Consume session logs an outage twice (SQL0101: when it
	// begins, and when it ends, with its length). Failures that retrying
	// cannot fix (a missing schema or table, a missing privilege, a closed
	// pool) are not retried: Consume returns them. Defaults per field: see
	// Backoff.
	Retry Backoff
	// DisableMigrate makes the client run no DDL on its schema: NewClient
	// only checks that the schema holds this library's tables, and fails
	// with ErrNotMigrated naming `sqlstreams migrate` when it does not. For
	// applications whose database role may not create tables; the schema's
	// owner migrates it (`sqlstreams migrate`, or a client without this
	// flag) and registers the streams. Default false: NewClient migrates.
	DisableMigrate bool
	// AllowDestroy permits DestroyStream and DestroyGroup, which remove a
	// stream or a group with everything it holds. Default false: they are
	// refused (ErrDestroyNotAllowed), so that a client an application builds
	// for producing and consuming cannot destroy anything by mistake.
	AllowDestroy bool
	// Observer, if set, receives the client's events for metrics and traces
	// (see Observer). Default none.
	Observer Observer
	// Tracer, if set, opens a span around every produce call and handler
	// attempt and carries trace context in the messages' headers (see
	// Tracer). Default none.
	Tracer Tracer
	// ReadPool, if set, serves the operator's reads: Streams, Groups, and
	// a group's Status, Inspect, Bindings, DeadLetters and DeadLetter (the
	// CLI's and the console's views), so that dashboards and tools polling
	// them load a streaming replica instead of the primary. Each result
	// says whether a replica served it and its replay lag then (ReadFrom).
	// Nothing that writes or must be current ever uses it: producing,
	// claiming, committing, heartbeats, config refreshes, registration,
	// the maintenance workers and the actions (Redrive, Seek, Declare, …)
	// run on the primary's pool, and Client.Group's lookup too (a handle
	// to a group just registered must resolve). The engine is never given
	// it (internal/store.Reader; decision 0029). Its schema is Schema; the
	// client neither migrates nor checks it there. Default nil: every read
	// on the primary's pool.
	ReadPool *pgxpool.Pool
	// Decoder decodes stored payloads into consumers' message types.
	// Default StandardJSON{} (encoding/json, which producers always encode
	// with); FastJSON{} (github.com/goccy/go-json) decodes about 5.5 times as
	// fast, where decoding is most of a typed consumer's CPU, but differs
	// from encoding/json at a few edges its comment lists (decision 0086).
	Decoder Decoder
	// PayloadPool is how many bytes of claimed payload memory the client
	// keeps, once the ranges that held them have settled, for its
	// consumers' next claims to copy payloads into (store.SlabPool). A
	// claim otherwise copies its payloads into fresh memory, which the Go
	// runtime zeroes and, when a burst follows an idle spell in which it
	// gave the last burst's memory back to the operating system, faults in
	// page by page: over 1,000 streams, every session's range is in memory
	// at once, and that copy was 15% of the consumers' CPU (decision
	// 0060). It is kept while the process runs, so it bounds memory
	// a client holds beyond what its consumers use. Slabs are recycled only
	// under this package's decoders (FastJSON, StandardJSON), which keep
	// no byte of what they decode; a Decoder of your own might, so its
	// consumers claim into fresh memory. Default (0): DefaultPayloadPool;
	// NoPayloadPool keeps none.
	PayloadPool int
	// EngineConns is how many of the pool's connections the consumers'
	// claim path (claims, commits, key leases, exception claims and
	// settlements, lease renewals) uses at once: it runs in that many lanes,
	// each running one statement at a time on a connection it keeps while a
	// consumer session runs and the pool has others idle or room to open
	// one (decisions 0048, 0057).
	// Every PostgreSQL backend warms its own caches for each stream's
	// tables; over 1,000 streams, a claim path spread over a pool of 16
	// connections a process ran at half the rate of one kept to 3 of them.
	// Default (0): GOMAXPROCS, at least 4, at most half the pool's MaxConns
	// (none for a pool of one): a process's few busy sessions of one stream
	// each have a lane, and its many sessions of many streams share few.
	// A lane plans the range claimers' statements and the lease renewals
	// generically (plan_cache_mode force_generic_plan on the connection it
	// keeps, the connection's own value put back before the pool has it
	// again or an exception claimer's statement runs; decision 0052), so that
	// a stream's claim is not planned afresh for each of its first five
	// executions on a backend. Behind a pooler in transaction mode, use
	// NoEngineLanes: a session-level setting could reach another client.
	// NoEngineLanes turns lanes off: every statement takes whatever
	// connection the pool gives. It must be below the pool's MaxConns:
	// heartbeats, produces and the application need the rest.
	EngineConns int
}

// DefaultPayloadPool is ClientConfig.PayloadPool's default, 64 MiB: a
// process's 250 sessions of a stream each, holding two ranges of 100 1 KB
// messages apiece, fill about 56 MiB.
const DefaultPayloadPool = 64 << 20

// NoPayloadPool is the ClientConfig.PayloadPool that keeps no payload
// memory: every claim copies into fresh memory.
const NoPayloadPool = -1

// NoEngineLanes is the ClientConfig.EngineConns that puts no bound on the
// claim path's connections and keeps no stream to one.
const NoEngineLanes = -1

// minDefaultLanes is the least default ClientConfig.EngineConns: on a 2-core
// machine, 2 lanes made a process's 4 sessions of one stream share them in
// pairs (the 4-instance burn-down ran at the 2-instance rate).
const minDefaultLanes = 4

// engineLanes resolves ClientConfig.EngineConns against the pool.
func engineLanes(n int, pool *pgxpool.Pool) (int, error) {
	maxConns := int(pool.Config().MaxConns)
	switch {
	case n == NoEngineLanes:
		return 0, nil
	case n < 0:
		return 0, fmt.Errorf("%w: ClientConfig.EngineConns %d: must be positive, 0 (the default: GOMAXPROCS, at least 4, at most half the pool) or NoEngineLanes (-1)", ErrInvalidConfig, n)
	case n == 0: // none for a pool of one: the heartbeats need a connection too
		return min(max(minDefaultLanes, runtime.GOMAXPROCS(0)), maxConns/2), nil
	case n >= maxConns:
		return 0, fmt.Errorf("%w: ClientConfig.EngineConns %d must be below the pool's MaxConns %d: heartbeats, produces and the application need the rest", ErrInvalidConfig, n, maxConns)
	}
	return n, nil
}

// Backoff is a retry curve for the client's own store calls: the first
// retry waits Initial, each further one twice the last, at most Max, each
// spread at random by ±Jitter of itself. A zero field is unset.
type Backoff struct {
	// Initial is the wait before the first retry. Default 100ms.
	Initial time.Duration
	// Max caps the wait. Default 5s. An actor with a shorter cadence of
	// its own (a heartbeat) retries at least that often.
	Max time.Duration
	// Jitter is the fraction of each wait drawn at random: a wait w
	// becomes between w×(1-Jitter) and w×(1+Jitter). Default 0.2; at most
	// 1; NoJitter for none.
	Jitter float64
}

// NoJitter, as Backoff.Jitter, means no jitter (0 is unset).
const NoJitter = -1

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = backoff.DefaultInitial
		if b.Max > 0 {
			b.Initial = min(b.Initial, b.Max)
		}
	}
	if b.Max == 0 {
		b.Max = max(backoff.DefaultMax, b.Initial)
	}
	if b.Jitter == 0 {
		b.Jitter = backoff.DefaultJitter
	}
	return b
}

func (b Backoff) validate() error {
	switch {
	case b.Initial < 0 || b.Max < 0:
		return fmt.Errorf("%w: ClientConfig.Retry: Initial and Max must not be negative", ErrInvalidConfig)
	case b.Max < b.Initial:
		return fmt.Errorf("%w: ClientConfig.Retry.Max %s is below Initial %s", ErrInvalidConfig, b.Max, b.Initial)
	case b.Jitter != NoJitter && (b.Jitter < 0 || b.Jitter > 1):
		return fmt.Errorf("%w: ClientConfig.Retry.Jitter %g outside 0..1 (NoJitter for none)", ErrInvalidConfig, b.Jitter)
	}
	return nil
}

func (b Backoff) policy() backoff.Policy {
	p := backoff.Policy{Initial: b.Initial, Max: b.Max, Jitter: b.Jitter}
	if b.Jitter == NoJitter {
		p.Jitter = 0
	}
	return p
}

func (c *ClientConfig) withDefaults() ClientConfig {
	var out ClientConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "sqlstreams"
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Clock == nil {
		out.Clock = clocks.Real()
	}
	out.Retry = out.Retry.withDefaults()
	if out.Decoder == nil {
		out.Decoder = StandardJSON{}
	}
	if out.PayloadPool == 0 {
		out.PayloadPool = DefaultPayloadPool
	}
	return out
}

func (c ClientConfig) validate() error {
	if err := ValidateSchema(c.Schema); err != nil {
		return fmt.Errorf("ClientConfig.Schema: %w", err)
	}
	if c.PayloadPool < NoPayloadPool {
		return fmt.Errorf("%w: ClientConfig.PayloadPool %d: must be a number of bytes, 0 (the default, DefaultPayloadPool) or NoPayloadPool (-1)", ErrInvalidConfig, c.PayloadPool)
	}
	return c.Retry.validate()
}

// ValidateSchema checks a schema name against the rule ClientConfig.Schema
// follows: a plain lower-case SQL identifier (a letter or '_', then
// letters, digits or '_', at most 63 bytes, so the quoted name is also the
// one a person types in psql), and not one of PostgreSQL's own
// (information_schema, or starting with pg_). The error wraps
// ErrInvalidSchema.
func ValidateSchema(name string) error { return store.ValidateSchema(name) }

// Client is the entry point: one per schema and pool, safe for concurrent use.
type Client struct {
	cfg   ClientConfig
	store *store.Store
	reads *store.Reader // ReadPool's, or the primary's when it is nil
	// engine is what the client's Consume sessions share: the wake-up
	// hub, the heartbeats' beats, the config reads (engine.Shared).
	engine *engine.Shared
	// slabs keeps settled ranges' payload slabs for the next claims
	// (store.SlabPool; at most ClientConfig.PayloadPool bytes free).
	slabs *store.SlabPool
	wakes wakeup.Combiner // pool produces' wake-ups, merged and paced (decision 0044)
	// managerTurn is held by the one Consume session of this client whose
	// manager runs (see oneManagerAProcess).
	managerTurn chan struct{}
}

// NewClient validates cfg and returns a client on pool. Unless
// cfg.DisableMigrate is set it first brings the schema's tables up to date
// (under an advisory lock, so many processes may start at once); with it,
// it only checks that they are (ErrNotMigrated otherwise).
func NewClient(ctx context.Context, pool *pgxpool.Pool, cfg *ClientConfig) (*Client, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	if pool == nil {
		return nil, fmt.Errorf("%w: NewClient needs a *pgxpool.Pool, got nil", ErrInvalidConfig)
	}
	lanes, err := engineLanes(c.EngineConns, pool)
	if err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	st, err := store.New(pool, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	st.SetLanes(lanes)
	if c.DisableMigrate {
		err = st.CheckSchema(ctx)
	} else {
		_, err = st.Migrate(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	readPool := pool
	if c.ReadPool != nil {
		readPool = c.ReadPool
	}
	reads, err := store.NewReader(readPool, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("new client: read pool: %w", err)
	}
	cl := &Client{cfg: c, store: st, reads: reads, engine: engine.NewShared(st, c.Clock, c.Logger, c.Observer),
		slabs:       store.NewSlabPool(max(c.PayloadPool, 0)),
		managerTurn: make(chan struct{}, 1)}
	// The wake-up hold-off paces database transactions in real time, not
	// on cfg.Clock: a mock clock that a test moves by hand would hold a
	// produce until it moved (decision 0044).
	cl.wakes.Clock, cl.wakes.PerMessage = clocks.Real(), wakeup.DefaultPerMessage
	return cl, nil
}

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

var (
	declarerOnce sync.Once
	declarer     string
)

// declaredBy names this process in every row it declares: hostname, pid and a
// random part, because containers often run as pid 1 under cloned hostnames.
// Computed once per process.
func declaredBy() string {
	declarerOnce.Do(func() {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown"
		}
		var b [4]byte
		_, _ = rand.Read(b[:])
		declarer = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	})
	return declarer
}

// redeclared logs SQL0059 for a declaration that changed a stored config,
// naming every changed field (old → new) and the declarer; a declaration
// that changed nothing logs nothing.
func (c *Client) redeclared(ctx context.Context, kind, name string, changes []groupconfig.Change) {
	if len(changes) == 0 {
		return
	}
	fields := make([]string, len(changes))
	for i, ch := range changes {
		fields[i] = ch.String()
	}
	key := "group"
	if kind == "stream" {
		key = "stream"
	}
	codes.ConfigRedeclared.Log(ctx, c.cfg.Logger, "SQL0059 "+kind+" config redeclared; newest wins: "+strings.Join(fields, "; "),
		key, name, "declared_by", declaredBy(), "changes", fields)
}

func (c *Client) dbNow() store.Now {
	if m, ok := c.cfg.Clock.(*clocks.Mock); ok {
		t := m.Now()
		return &t
	}
	return nil
}

// slabsFor is the slab pool a session's claimers may recycle payloads into:
// the client's when its Decoder is one of this package's, which keep no
// byte of the data they decode (encoding/json and go-json copy what they
// keep, and a json.RawMessage consumer gets a copy). A Decoder of the
// user's own might keep slices of its input, so its sessions claim into
// fresh memory as before.
func (c *Client) slabsFor() *store.SlabPool {
	switch c.cfg.Decoder.(type) {
	case StandardJSON, FastJSON:
		if c.cfg.PayloadPool > 0 {
			return c.slabs
		}
	}
	return nil
}
