package sqlstreams

import (
	"bufio"
	"io"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolReadBuffer is the read buffer ConfigurePool gives each connection of a
// pool (decision 0059). pgx reads the server's replies into an 8 KiB buffer,
// so a claimed range of 1,000 messages of 1 KB arrives in up to about 128
// reads from the socket; with this buffer, in a few. It costs this much
// memory a connection: 8 MiB for a pool of 32.
const PoolReadBuffer = 256 << 10

// ConfigurePool applies what sqlstreams recommends to the config of the pool
// an application gives NewClient, before the pool is built (the library takes
// the pool as it is and never changes it):
//
//   - PostgreSQL's JIT off (runtime parameter jit=off) unless the config sets
//     jit already: sqlstreams' statements are short, and once a log holds
//     millions of rows PostgreSQL compiles each one for 25–190 ms (decision
//     0013);
//   - each connection reads through a buffer of PoolReadBuffer bytes, wrapped
//     around the reader of any BuildFrontend set already: in the benchmark's
//     burn-down of 200,000 messages by 4 instances on 2 cores, 8–12% more
//     messages a second and 13–16% less client CPU a message (decision
//     0059).
//
// Both apply to everything else the application runs on the pool. One thing
// to know: PgConn.SyncConn, which an application calls before using a
// connection's net.Conn directly (pgx and pgxpool never call it), does not
// see bytes held in the buffer. ConfigurePool may be called more than once.
func ConfigurePool(cfg *pgxpool.Config) {
	if cfg == nil || cfg.ConnConfig == nil {
		return
	}
	cc := cfg.ConnConfig
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if _, set := cc.RuntimeParams["jit"]; !set {
		cc.RuntimeParams["jit"] = "off"
	}
	next := cc.BuildFrontend
	if next == nil {
		next = pgproto3.NewFrontend
	}
	cc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		// NewReaderSize returns r itself when r is a large enough
		// bufio.Reader already: a second call adds no second buffer.
		return next(bufio.NewReaderSize(r, PoolReadBuffer), w)
	}
}
