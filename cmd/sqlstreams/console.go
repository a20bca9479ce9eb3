package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/console"
)

var consoleUsage = verbUsage{
	synopsis: "console [-http 127.0.0.1:8080] [-allow-payloads] [-allow-actions] [-schema sqlstreams]",
	about: `Serves the web console (streams, groups, bindings, config, dead letters) on a
loopback address until SIGINT or SIGTERM. It is read-only and hides payloads
unless started with -allow-actions (redrive) or -allow-payloads; it refuses
an address other than loopback: put your own authentication in front of it
by mounting console.New in your application instead. SQLSTREAMS_DATABASE_URL
must name the database.`,
}

func consoleVerb(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("console")
	var c common
	c.registerSchema(fs)
	addr := fs.String("http", "127.0.0.1:8080", "the loopback address to listen on (port 0: any free one)")
	payloads := fs.Bool("allow-payloads", false, "show dead letters' payloads")
	actions := fs.Bool("allow-actions", false, "allow redrives")
	_, help, err := parseVerb(fs, args, out, consoleUsage, 0, 0)
	if help || err != nil {
		return err
	}
	if err := c.check("console"); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return fmt.Errorf("console: -http %q: %w", *addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("console: -http %q: only a loopback address (127.0.0.1, ::1, localhost); to serve others, mount console.New behind your own authentication", *addr)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	client, done, err := openClient(ctx, out, "console", &sqlstreams.ClientConfig{Schema: c.schema, DisableMigrate: true, Logger: logger})
	if err != nil {
		return err
	}
	defer done()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	access := console.Access{Read: true, Payloads: *payloads, Actions: *actions}
	srv := &http.Server{Handler: console.New(client, &console.Options{Authorize: func(*http.Request) console.Access { return access }}),
		ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "console on http://%s (schema %s; payloads %v, actions %v; stop with Ctrl-C)\n", ln.Addr(), c.schema, *payloads, *actions)
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(ln) }()
	select {
	case err := <-errs:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("console: shutdown: %w", err)
	}
	if err := <-errs; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: %w", err)
	}
	fmt.Fprintln(out, "console stopped")
	return nil
}
