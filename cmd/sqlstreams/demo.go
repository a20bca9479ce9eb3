package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/console"
	"github.com/c1702965/sqlstreams/internal/pgcluster"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultDemoDuration = 10 * time.Second

type demoOptions struct {
	duration time.Duration
	linger   time.Duration
	rate     int
	schema   string
	backlog  int
}

// OrderPlaced is the demo's message type.
type OrderPlaced struct {
	OrderID  int64  `json:"order_id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

func (OrderPlaced) SchemaVersion() int { return 1 }

// connect returns a pool on SQLSTREAMS_DATABASE_URL, or on a private cluster
// it starts, the URL it connected to, and the func that closes the pool and
// stops the cluster.
func connect(ctx context.Context, out io.Writer) (_ *pgxpool.Pool, url string, _ func(), _ error) {
	url = os.Getenv("SQLSTREAMS_DATABASE_URL")
	stop := func() {}
	if url == "" {
		if _, err := pgcluster.FindBinaries(); err != nil {
			return nil, "", nil, err
		}
		fmt.Fprintln(out, "starting a private PostgreSQL (set SQLSTREAMS_DATABASE_URL to use your own)...")
		c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
		if err != nil {
			return nil, "", nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		url = c.URL("postgres")
		stop = func() {
			if err := c.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "stop PostgreSQL:", err)
			}
		}
		fmt.Fprintf(out, "PostgreSQL is up on 127.0.0.1:%d (removed when the demo ends)\n", c.Port())
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		stop()
		return nil, "", nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = 16
	// What the library recommends for an application's pool: JIT off unless
	// the URL sets it (decision 0013), and a larger read buffer a connection
	// (decision 0059).
	sqlstreams.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		stop()
		return nil, "", nil, fmt.Errorf("connect: %w", err)
	}
	return pool, url, func() { pool.Close(); stop() }, nil
}

// openClient is what the verbs that act on a user's database share: they
// need SQLSTREAMS_DATABASE_URL (a throwaway server would be pointless) and a
// client, whose creation migrates the schema unless cfg.DisableMigrate.
// done closes the pool.
func openClient(ctx context.Context, out io.Writer, verb string, cfg *sqlstreams.ClientConfig) (client *sqlstreams.Client, done func(), err error) {
	pool, _, done, err := connectFor(ctx, out, verb)
	if err != nil {
		return nil, nil, err
	}
	client, err = sqlstreams.NewClient(ctx, pool, cfg)
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("%s: %w", verb, err)
	}
	return client, done, nil
}

// connectFor is connect for a verb that acts on the user's database: it
// needs SQLSTREAMS_DATABASE_URL (a throwaway server would be pointless).
func connectFor(ctx context.Context, out io.Writer, verb string) (*pgxpool.Pool, string, func(), error) {
	if os.Getenv("SQLSTREAMS_DATABASE_URL") == "" {
		return nil, "", nil, fmt.Errorf("%s needs SQLSTREAMS_DATABASE_URL", verb)
	}
	pool, url, done, err := connect(ctx, out)
	if err != nil {
		return nil, "", nil, fmt.Errorf("%s: %w", verb, err)
	}
	return pool, url, done, nil
}

// migrateStatus prints a schema's applied versions; it writes nothing.
func migrateStatus(ctx context.Context, out io.Writer, schema, format string) error {
	if os.Getenv("SQLSTREAMS_DATABASE_URL") == "" {
		return errors.New("migrate status needs SQLSTREAMS_DATABASE_URL")
	}
	pool, _, done, err := connect(ctx, out)
	if err != nil {
		return fmt.Errorf("migrate status: %w", err)
	}
	defer done()
	m, err := sqlstreams.MigrationStatus(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("migrate status: %w", err)
	}
	if format == "json" {
		if m.Streams == nil {
			m.Streams = []sqlstreams.StreamMigration{}
		}
		return writeJSON(out, map[string]any{"schema": m.Schema, "exists": m.Exists, "applied": m.Applied, "latest": m.Latest,
			"stream_latest": m.StreamLatest, "streams": m.Streams})
	}
	state := "up to date"
	switch {
	case !m.Exists:
		state = "not migrated (run sqlstreams migrate up)"
	case m.Applied < m.Latest:
		state = "behind (run sqlstreams migrate up)"
	case m.Applied > m.Latest:
		state = "ahead of this binary (a newer version migrated it)"
	}
	fmt.Fprintf(out, "schema %s: version %d of %d, %s\n", schema, m.Applied, m.Latest, state)
	var rows [][]string
	for _, s := range m.Streams {
		st := "up to date"
		if s.Applied < m.StreamLatest {
			st = "behind (brought up to date when a client registers the stream)"
		}
		rows = append(rows, []string{s.Stream, fmt.Sprintf("%d of %d", s.Applied, m.StreamLatest), st})
	}
	if len(rows) == 0 {
		return nil
	}
	return table(out, []string{"STREAM", "VERSION", "STATE"}, rows)
}

// migrate is the verb that creates a schema: its client migrates.
func migrate(ctx context.Context, out io.Writer, schema, format string) error {
	pool, _, done, err := connectFor(ctx, out, "migrate")
	if err != nil {
		return err
	}
	defer done()
	if _, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Schema: schema}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if format == "json" {
		m, err := sqlstreams.MigrationStatus(ctx, pool, schema)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		return writeJSON(out, map[string]any{"schema": schema, "applied": m.Applied, "latest": m.Latest})
	}
	fmt.Fprintf(out, "schema %s is up to date\n", schema)
	return nil
}

// manage runs the schema's maintenance workers (retention, pruning,
// schedules) the way Consume does by default, for deployments that run them
// apart from their consumers; it stops on SIGINT or SIGTERM. It runs no DDL:
// a schema migrate has not set up (a misspelled -schema, say) is an error
// naming sqlstreams migrate, and is not created.
func manage(ctx context.Context, out io.Writer, logger *slog.Logger, schema string, ttl time.Duration) error {
	client, done, err := openClient(ctx, out, "manager", &sqlstreams.ClientConfig{Schema: schema, Logger: logger, DisableMigrate: true})
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "manager running on schema %s (stop with Ctrl-C)\n", schema)
	if err := client.Manager().Run(ctx, &sqlstreams.ManagerOptions{InstanceTTL: ttl}); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	fmt.Fprintln(out, "manager stopped")
	return nil
}

// demoSchemaPrefix starts the name of the fresh schema a demo run creates
// when -schema is not given.
const demoSchemaPrefix = "sqlstreams_demo_"

// demo produces at a steady rate for a while and consumes with two instances
// of one group, printing a progress line and a summary. It works in a schema
// it creates itself (a fresh random one, or o.schema when that does not
// exist yet) and drops that schema when it returns, whatever the outcome; it
// never drops a schema it did not create.
func demo(ctx context.Context, out io.Writer, logger *slog.Logger, o demoOptions) (err error) {
	if o.rate < 1 || o.duration <= 0 {
		return errors.New("demo: -rate and -duration must be positive")
	}
	if o.backlog < 0 {
		return errors.New("demo: -backlog must not be negative")
	}
	if o.linger < 0 {
		return errors.New("demo: -linger must not be negative")
	}
	if o.schema != "" {
		if err := validSchemaFlag("demo", o.schema); err != nil {
			return err
		}
	}
	pool, url, done, err := connect(ctx, out)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer done()
	fmt.Fprintf(out, "database %s\n", redactURL(url))
	schema := o.schema
	if schema == "" {
		schema = demoSchemaPrefix + randomHex(4)
	} else {
		exists, err := sqlstreams.SchemaExists(ctx, pool, schema)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if exists {
			return schemaExistsError(schema)
		}
	}
	// Created here without IF NOT EXISTS: success proves the schema is this
	// run's, so the drop below can never destroy someone else's, even if
	// another session created the name since the check above.
	if err := sqlstreams.CreateSchema(ctx, pool, schema); err != nil {
		if errors.Is(err, sqlstreams.ErrSchemaExists) {
			return schemaExistsError(schema)
		}
		return fmt.Errorf("demo: %w", err)
	}
	defer func() {
		// Also after an interrupt, when ctx is already done.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := sqlstreams.DropSchema(dctx, pool, schema); derr != nil {
			derr = fmt.Errorf("demo: %w (drop it by hand)", derr)
			if err == nil {
				err = derr
			} else {
				err = fmt.Errorf("%w; and %v", err, derr)
			}
			return
		}
		fmt.Fprintf(out, "dropped schema %s\n", schema)
	}()
	fmt.Fprintf(out, "schema %s (created by this run, dropped when it ends)\n", schema)
	exe, _ := os.Executable()
	fmt.Fprintf(out, "watch it from another terminal while it runs:\n  SQLSTREAMS_DATABASE_URL='%s' %s groups describe orders.placed -schema %s\n",
		redactURL(url), selfCommand(exe, os.Args[0]), schema)
	clk := sqlstreams.RealClock()
	client, err := sqlstreams.NewClient(ctx, pool, &sqlstreams.ClientConfig{Schema: schema, Logger: logger, Clock: clk})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	orders := sqlstreams.Stream[OrderPlaced](client, "orders.placed")
	if err := orders.Register(ctx, nil); err != nil {
		return err
	}
	billing, err := orders.Consumer("billing").Register(ctx, nil)
	if err != nil {
		return err
	}
	// The console, read-only, on a free loopback port for as long as the
	// demo runs.
	stopConsole, err := demoConsole(client, out)
	if err != nil {
		return err
	}
	defer stopConsole()

	var produced, consumed atomic.Int64
	// A backlog first, so the two instances visibly burn it down.
	for sent := 0; sent < o.backlog; {
		n := min(1000, o.backlog-sent)
		items := make([]sqlstreams.BatchItem[OrderPlaced], n)
		for i := range items {
			id := int64(-(sent + i + 1))
			items[i] = sqlstreams.BatchItem[OrderPlaced]{Msg: OrderPlaced{OrderID: id, Customer: "backlog", Cents: 100}}
		}
		if _, err := orders.ProduceBatch(ctx, items, nil); err != nil {
			return err
		}
		sent += n
		produced.Add(int64(n))
	}
	if o.backlog > 0 {
		fmt.Fprintf(out, "produced a backlog of %d messages before starting the consumers\n", o.backlog)
	}
	var perInstance [2]atomic.Int64
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range perInstance {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- billing.Consume(cctx, func(ctx context.Context, m *OrderPlaced) error {
				consumed.Add(1)
				perInstance[i].Add(1)
				return nil
			}, &sqlstreams.ConsumeOptions{BatchLimit: 200, MessageConcurrency: 8, ClaimPollRate: 20 * time.Millisecond})
		}()
	}

	fmt.Fprintf(out, "producing %d msg/s to stream %q for %s; group %q runs 2 instances\n", o.rate, orders.Name(), o.duration, billing.Name())
	start := clk.Now()
	pctx, stopProducer := context.WithTimeout(ctx, o.duration)
	defer stopProducer()
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- produce(ctx, pctx.Done(), clk, orders, o.rate, &produced)
	}()

	tick := clk.Ticker(500 * time.Millisecond)
	defer tick.Stop()
	lastConsumed, lastAt := int64(0), start
	producerDone := pctx.Done()
	for {
		select {
		case <-ctx.Done():
			stopConsumers()
			wg.Wait()
			return fmt.Errorf("demo interrupted: %w", ctx.Err())
		case <-producerDone:
			producerDone = nil
		case now := <-tick.C():
			p, c := produced.Load(), consumed.Load()
			rate := float64(c-lastConsumed) / now.Sub(lastAt).Seconds()
			lastConsumed, lastAt = c, now
			fmt.Fprintf(out, "%6.1fs  produced %7d  consumed %7d  backlog %6d  rate %7.0f msg/s\n",
				now.Sub(start).Seconds(), p, c, p-c, rate)
			if producerDone == nil && c >= p {
				stopConsumers()
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						return err
					}
				}
				elapsed := clk.Since(start)
				fmt.Fprintf(out, "\ndone: produced %d, consumed %d (instance 1: %d, instance 2: %d), lost %d, in %.1fs (%.0f msg/s end to end)\n",
					p, c, perInstance[0].Load(), perInstance[1].Load(), p-c, elapsed.Seconds(), float64(c)/elapsed.Seconds())
				st := billing.Stats()
				fmt.Fprintf(out, "ranges committed %d, failures %d, reclaims %d\n", st.Committed, st.Failed, st.Reclaimed)
				if c != p {
					return fmt.Errorf("consumed %d of %d", c, p)
				}
				if o.linger > 0 {
					// The consumers stopped with everything committed: the
					// other verbs can see the final state (lag 0) meanwhile.
					fmt.Fprintf(out, "keeping schema %s for %s so that other verbs can look at it (Ctrl-C ends it)\n", schema, o.linger)
					select {
					case <-clk.Timer(o.linger).C():
					case <-ctx.Done():
					}
				}
				return nil
			}
		}
	}
}

// produce sends batches every 50ms so the offered rate holds, until stop is
// closed. Each batch runs to its end under ctx (not under stop): a call cut
// off mid-flight may or may not have committed, and the count must be
// exact.
func produce(ctx context.Context, stop <-chan struct{}, clk sqlstreams.Clock, s *sqlstreams.StreamHandle[OrderPlaced], rate int, produced *atomic.Int64) error {
	tick := clk.Ticker(50 * time.Millisecond)
	defer tick.Stop()
	start := clk.Now()
	var id int64
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case now := <-tick.C():
			due := int64(now.Sub(start).Seconds()*float64(rate)) - id
			if due <= 0 {
				continue
			}
			items := make([]sqlstreams.BatchItem[OrderPlaced], due)
			for i := range items {
				id++
				items[i] = sqlstreams.BatchItem[OrderPlaced]{
					Msg:        OrderPlaced{OrderID: id, Customer: fmt.Sprintf("cust-%d", id%97), Cents: 100 + id%5000},
					RoutingKey: "orders.eu", Key: fmt.Sprintf("cust-%d", id%97),
				}
			}
			if _, err := s.ProduceBatch(ctx, items, nil); err != nil {
				if ctx.Err() != nil {
					return nil // interrupted: the run ends without a verdict
				}
				return err
			}
			produced.Add(due)
		}
	}
}

func schemaExistsError(schema string) error {
	return fmt.Errorf("demo: -schema: schema %q already exists, and the demo only works in a schema it creates (and drops at its end): "+
		"name one that does not exist, or leave -schema out for a fresh %s<random> schema", schema, demoSchemaPrefix)
}

// selfCommand is how another terminal runs this command: under `go run`
// (make demo; the binary is in a go-build directory) `go run
// ./cmd/sqlstreams` from the module's root; started by its bare name, that
// name (the shell found it on the PATH); else the binary's own path.
func selfCommand(exe, arg0 string) string {
	switch {
	case strings.Contains(filepath.ToSlash(exe), "/go-build"):
		return "go run ./cmd/sqlstreams"
	case arg0 != "" && !strings.ContainsRune(arg0, filepath.Separator):
		return arg0
	case exe != "":
		return exe
	}
	return "sqlstreams"
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails, see crypto/rand.Read
	return hex.EncodeToString(b)
}

// secretParam matches a password-like key=value pair of a keyword/value
// connection string (password, sslpassword), quoted or not.
var secretParam = regexp.MustCompile(`(?i)(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)

// redactURL returns a connection string fit to print: any password in it
// (the URL's user info, a password-like query parameter, or a keyword/value
// pair) is replaced by xxxxx.
func redactURL(s string) string {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return secretParam.ReplaceAllString(s, "${1}xxxxx")
	}
	u, err := neturl.Parse(s)
	if err != nil {
		return "(a connection URL that does not parse)"
	}
	q := u.Query()
	redacted := false
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q.Set(k, "xxxxx")
			redacted = true
		}
	}
	if redacted {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// demoConsole serves the web console (read-only) on a free loopback port
// and prints its URL; the returned func stops it.
func demoConsole(client *sqlstreams.Client, out io.Writer) (func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: console: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: console.New(client, &console.Options{
		Authorize: func(*http.Request) console.Access { return console.Access{Read: true} }})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln) // ends with ErrServerClosed at the demo's end
	}()
	fmt.Fprintf(out, "console (read-only) on http://%s/ while the demo runs\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}, nil
}
