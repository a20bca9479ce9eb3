// Command sqlstreams is the sqlstreams command line: a demo that shows
// messages flowing, the operator's verbs (streams, groups, inspect,
// bindings, dead letters), schema migrations, a standalone manager, and the
// explanation of the log codes.
//
//	sqlstreams demo [-duration 10s] [-rate 2000] [-backlog 20000] [-linger 5s] [-schema NAME]
//	sqlstreams streams ls | rm S [-execute]
//	sqlstreams groups ls [-stream S] | describe S [G] | seek S G -to-… [-execute] | declare S G -f FILE | rm S G [-execute]
//	sqlstreams inspect S G
//	sqlstreams bindings S G [-stale-after 30s]
//	sqlstreams dlq ls S G [-limit N] | show S G ID | redrive S G ID... | -all [-dry-run]
//	sqlstreams console [-http 127.0.0.1:8080] [-allow-payloads] [-allow-actions]
//	sqlstreams migrate [up|status|sql] [-schema sqlstreams]
//	sqlstreams manager [-schema sqlstreams] [-instance-ttl 30s]
//	sqlstreams explain [-o text|json] [CODE]
//
// SQLSTREAMS_DATABASE_URL names the database; every verb but demo and
// explain needs it. The demo starts a private throwaway PostgreSQL from the
// installed binaries when it is unset, and prints the URL and schema it
// uses so that the other verbs can watch it. The demo never touches a schema
// it did not create. The operator verbs take -schema (default sqlstreams)
// and -o table|json; the reads never write (their client runs no DDL and
// every statement is a read), and the actions (groups seek -execute, groups
// declare, dlq redrive, streams rm and groups rm -execute) say so in their
// names. Every verb takes -h; an error
// is one line on stderr and exit status 1.
//
// It is a tool for users (operators), built on the public API.
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/c1702965/sqlstreams"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sqlstreams:", oneLine(err.Error()))
		os.Exit(1)
	}
}

// oneLine keeps the CLI's error to the one line its convention promises,
// whatever a wrapped error holds.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage:
  sqlstreams demo [-duration 10s] [-rate 2000] [-backlog 20000] [-linger 5s] [-schema NAME]
  sqlstreams streams ls | rm S [-execute]
  sqlstreams groups ls [-stream S] | describe S [G] | seek S G -to-... [-execute] | declare S G -f FILE
                  | rm S G [-execute]
  sqlstreams inspect S G
  sqlstreams bindings S G [-stale-after 30s]
  sqlstreams dlq ls S G [-limit N] | show S G ID | redrive S G ID... | -all [-dry-run]
  sqlstreams console [-http 127.0.0.1:8080] [-allow-payloads] [-allow-actions]
  sqlstreams migrate [up|status|sql] [-schema sqlstreams]
  sqlstreams manager [-schema sqlstreams] [-instance-ttl 30s]
  sqlstreams explain [-o text|json] [CODE]
  sqlstreams help [VERB]

The operator verbs (streams, groups, inspect, bindings, dlq) take -schema
(default sqlstreams) and -o table|json; their reads never write, and their
actions (seek, declare, redrive, rm) say so.

SQLSTREAMS_DATABASE_URL names the database; the demo starts a private
PostgreSQL from the installed binaries when it is unset. The demo works in
a fresh schema of its own and drops it at its end; migrate creates or
upgrades a schema; manager runs on a schema migrate has set up. Run
'sqlstreams VERB -h' for a verb's flags.`)
}

func run(args []string, out io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runCtx(ctx, args, out)
}

// verbs are the commands, in the order usage lists them.
var verbs = []string{"demo", "streams", "groups", "inspect", "bindings", "dlq", "console", "migrate", "manager", "explain"}

func runCtx(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		usage(out)
		return fmt.Errorf("missing command (one of %s, help)", strings.Join(verbs, ", "))
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch args[0] {
	case "demo":
		return demoVerb(ctx, args[1:], out, logger)
	case "streams":
		return streamsVerb(ctx, args[1:], out)
	case "groups":
		return groupsVerb(ctx, args[1:], out)
	case "inspect":
		return inspectVerb(ctx, args[1:], out)
	case "bindings":
		return bindingsVerb(ctx, args[1:], out)
	case "dlq":
		return dlqVerb(ctx, args[1:], out)
	case "console":
		return consoleVerb(ctx, args[1:], out)
	case "migrate":
		return migrateVerb(ctx, args[1:], out)
	case "manager":
		return managerVerb(ctx, args[1:], out, logger)
	case "explain":
		return explainVerb(args[1:], out)
	case "help", "-h", "-help", "--help":
		switch len(args) {
		case 1:
			usage(out)
			return nil
		case 2:
			for _, v := range verbs {
				if args[1] == v {
					return runCtx(ctx, []string{v, "-h"}, out)
				}
			}
			return fmt.Errorf("help: unknown command %q (one of %s)", args[1], strings.Join(verbs, ", "))
		default:
			return unexpected("help", args[2:])
		}
	default:
		usage(out)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// verbUsage is what `sqlstreams VERB -h` prints.
type verbUsage struct {
	synopsis string // the usage line, after "usage: sqlstreams "
	about    string // what the verb does, as a paragraph
}

// newFlags returns a flag set for verb that prints nothing by itself: parse
// prints the verb's usage on -h, and an error is the CLI's one line.
func newFlags(verb string) *flag.FlagSet {
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses args into fs. It reports help when args asked for it
// (-h, -help, --help), after printing the verb's usage to out; the verb then
// returns nil. Positional arguments are returned for the verb to accept or
// refuse.
func parse(fs *flag.FlagSet, args []string, out io.Writer, u verbUsage) (positional []string, help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printVerbUsage(fs, out, u)
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("%s: %w (see sqlstreams %s -h)", fs.Name(), err, fs.Name())
	}
	return fs.Args(), false, nil
}

func printVerbUsage(fs *flag.FlagSet, out io.Writer, u verbUsage) {
	fmt.Fprintf(out, "usage: sqlstreams %s\n\n%s\n", u.synopsis, u.about)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(out, "\nflags:")
		fs.SetOutput(out)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

// unexpected is the error for positional arguments a verb does not take.
func unexpected(verb string, args []string) error {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	if len(q) == 1 {
		return fmt.Errorf("%s: unexpected argument %s", verb, q[0])
	}
	return fmt.Errorf("%s: unexpected arguments %s", verb, strings.Join(q, " "))
}

// validSchemaFlag checks a -schema value before anything connects.
func validSchemaFlag(verb, schema string) error {
	if err := sqlstreams.ValidateSchema(schema); err != nil {
		return fmt.Errorf("%s: -schema: %w", verb, err)
	}
	return nil
}

var demoUsage = verbUsage{
	synopsis: "demo [-duration 10s] [-rate 2000] [-backlog 20000] [-linger 5s] [-schema NAME]",
	about: `Produces to a stream at a steady rate and consumes it with two instances of
one consumer group, printing progress and a summary. It works in a schema it
creates itself and drops at its end, also when the run fails or is
interrupted: by default a fresh sqlstreams_demo_<8 random hex> schema; with
-schema NAME a new schema of that name, refused when one already exists (the
demo never drops a schema it did not create). SQLSTREAMS_DATABASE_URL names
the database; unset, the demo starts a private PostgreSQL and removes it at
the end.`,
}

func demoVerb(ctx context.Context, args []string, out io.Writer, logger *slog.Logger) error {
	fs := newFlags("demo")
	o := demoOptions{}
	fs.DurationVar(&o.duration, "duration", defaultDemoDuration, "how long to produce")
	fs.IntVar(&o.rate, "rate", 2000, "messages produced per second")
	fs.IntVar(&o.backlog, "backlog", 20000, "messages produced before the consumers start")
	fs.DurationVar(&o.linger, "linger", 5*time.Second, "after the run, keep its schema this long so that other verbs (groups describe) can look at the final state")
	fs.StringVar(&o.schema, "schema", "", "a new schema for the demo's tables, created and dropped by the run (default: a fresh sqlstreams_demo_<random hex>)")
	rest, help, err := parse(fs, args, out, demoUsage)
	if help || err != nil {
		return err
	}
	if len(rest) > 0 {
		return unexpected("demo", rest)
	}
	return demo(ctx, out, logger, o)
}

var migrateUsage = verbUsage{
	synopsis: "migrate [up|status|sql] [-schema sqlstreams] [-o table|json]",
	about: `up (the default) creates the schema and its tables, or brings them up to this
version's (an up-to-date schema is left as it is). Run it as a role that may
create tables, before the first client with DisableMigrate or manager starts.
status reads the applied versions next to this version's, changing nothing.
sql prints the shared tables' DDL for goose, golang-migrate or Atlas users
(each version guarded, so it may run again); the library still creates a
stream's own tables when the stream is first registered, and its manager
adds and drops log partitions. SQLSTREAMS_DATABASE_URL must name the
database (not for sql).`,
}

func migrateVerb(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("migrate")
	schema := fs.String("schema", "sqlstreams", "schema to create or migrate")
	format := fs.String("o", "table", "output: table (for people) or json (for machines; sql prints {\"schema\", \"sql\"})")
	rest, help, err := parseVerb(fs, args, out, migrateUsage, 0, 1)
	if help || err != nil {
		return err
	}
	if err := validSchemaFlag("migrate", *schema); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("migrate: -o %q: want table or json", *format)
	}
	sub := "up"
	if len(rest) == 1 {
		sub = rest[0]
	}
	switch sub {
	case "up":
		return migrate(ctx, out, *schema, *format)
	case "status":
		return migrateStatus(ctx, out, *schema, *format)
	case "sql":
		sql, err := sqlstreams.SchemaSQL(*schema)
		if err != nil {
			return fmt.Errorf("migrate sql: %w", err)
		}
		if *format == "json" {
			return writeJSON(out, map[string]any{"schema": *schema, "sql": sql})
		}
		_, err = io.WriteString(out, sql)
		return err
	}
	return fmt.Errorf("migrate: unknown subcommand %q (one of: up, status, sql)", sub)
}

var managerUsage = verbUsage{
	synopsis: "manager [-schema sqlstreams] [-instance-ttl 30s]",
	about: `Runs a schema's maintenance workers (retention, pruning, schedules) until
SIGINT or SIGTERM, for deployments that run them apart from their consumers.
The schema must have been set up by 'sqlstreams migrate'; the manager creates
nothing, and a schema without sqlstreams tables is an error.
SQLSTREAMS_DATABASE_URL must name the database.`,
}

func managerVerb(ctx context.Context, args []string, out io.Writer, logger *slog.Logger) error {
	fs := newFlags("manager")
	schema := fs.String("schema", "sqlstreams", "schema whose maintenance workers to run (set up by sqlstreams migrate)")
	ttl := fs.Duration("instance-ttl", 30*time.Second, "how long a held worker slot outlives its last heartbeat")
	rest, help, err := parse(fs, args, out, managerUsage)
	if help || err != nil {
		return err
	}
	if len(rest) > 0 {
		return unexpected("manager", rest)
	}
	if err := validSchemaFlag("manager", *schema); err != nil {
		return err
	}
	return manage(ctx, out, logger, *schema, *ttl)
}
