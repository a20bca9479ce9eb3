package sqlstreams

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/benbjohnson/clock"
	"github.com/c1702965/sqlstreams/engine"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ClientConfig is the ambient config of a Client. The zero value is usable.
type ClientConfig struct {
	// Schema holds every table of this client. Default "sqlstreams". Must be
	// a plain lower-case identifier.
	Schema string
	// Logger receives the library's events. Default slog.Default(). In the
	// steady state nothing is logged.
	Logger *slog.Logger
	// Clock drives every Go-side interval. Default the real clock. A
	// *clock.Mock also becomes the database's now() for every time-dependent
	// statement, which is how tests and the simulator control leases.
	Clock clock.Clock
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
		out.Clock = clock.New()
	}
	return out
}

// Client is the entry point: one per schema and pool, safe for concurrent use.
type Client struct {
	cfg   ClientConfig
	store *store.Store
	hub   *engine.Hub
}

// NewClient validates cfg, brings the schema's tables up to date (under an
// advisory lock, so many processes may start at once) and returns a client.
func NewClient(ctx context.Context, pool *pgxpool.Pool, cfg *ClientConfig) (*Client, error) {
	c := cfg.withDefaults()
	st, err := store.New(pool, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	return &Client{cfg: c, store: st, hub: engine.NewHub(st, c.Clock, c.Logger)}, nil
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

func (c *Client) dbNow() store.Now {
	if m, ok := c.cfg.Clock.(*clock.Mock); ok {
		t := m.Now()
		return &t
	}
	return nil
}
