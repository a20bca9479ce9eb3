// Command sqlstreams is the sqlstreams command line: a demo that shows
// messages flowing, the schema migration verb, and a standalone manager.
//
//	sqlstreams demo [-duration 10s] [-rate 2000]   produce and consume on a local PostgreSQL
//	sqlstreams migrate                             bring a schema's tables up to date
//	sqlstreams manager                             run the maintenance workers until stopped
//
// All read SQLSTREAMS_DATABASE_URL; the demo starts a private throwaway
// PostgreSQL from the installed binaries when it is unset.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sqlstreams:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage:
  sqlstreams demo [-duration 10s] [-rate 2000] [-backlog 20000] [-schema sqlstreams_demo]
  sqlstreams migrate [-schema sqlstreams]
  sqlstreams manager [-schema sqlstreams] [-instance-ttl 30s]

SQLSTREAMS_DATABASE_URL names the database; the demo starts a private
PostgreSQL from the installed binaries when it is unset.`)
}

func run(args []string, out io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runCtx(ctx, args, out)
}

func runCtx(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		usage(out)
		return errors.New("missing command")
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch args[0] {
	case "demo":
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		o := demoOptions{}
		fs.DurationVar(&o.duration, "duration", defaultDemoDuration, "how long to produce")
		fs.IntVar(&o.rate, "rate", 2000, "messages produced per second")
		fs.IntVar(&o.backlog, "backlog", 20000, "messages produced before the consumers start")
		fs.StringVar(&o.schema, "schema", "sqlstreams_demo", "schema for the demo's tables")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return demo(ctx, out, logger, o)
	case "migrate":
		fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
		schema := fs.String("schema", "sqlstreams", "schema to migrate")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return migrate(ctx, out, *schema)
	case "manager":
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		schema := fs.String("schema", "sqlstreams", "schema whose fleet workers to run")
		ttl := fs.Duration("instance-ttl", 30*time.Second, "how long a held worker slot outlives its last heartbeat")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return manage(ctx, out, logger, *schema, *ttl)
	case "help", "-h", "--help":
		usage(out)
		return nil
	default:
		usage(out)
		return fmt.Errorf("unknown command %q", args[0])
	}
}
