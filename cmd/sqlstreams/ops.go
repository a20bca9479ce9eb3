package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/c1702965/sqlstreams"
)

// The operator's verbs: streams, groups, inspect, bindings, dlq. Reads go
// through a client that runs no DDL (DisableMigrate) and the read-only
// group handle; actions say so in their names and take a dry run or an
// explicit flag first. This file holds what every verb shares (flags,
// client, arguments); each noun has its own file (streams.go, groups.go,
// inspect.go, dlq.go), and output.go is how they print.

// common are the flags every operator verb takes.
type common struct {
	schema string
	format string
}

func (c *common) register(fs *flag.FlagSet) {
	c.registerSchema(fs)
	fs.StringVar(&c.format, "o", "table", "output: table (for people) or json (for machines)")
}

// registerSchema is register for a verb that prints nothing for machines
// (the console serves pages): -schema only.
func (c *common) registerSchema(fs *flag.FlagSet) {
	c.format = "table"
	fs.StringVar(&c.schema, "schema", "sqlstreams", "the schema sqlstreams works in (ClientConfig.Schema)")
}

func (c *common) check(verb string) error {
	if c.format != "table" && c.format != "json" {
		return fmt.Errorf("%s: -o %q: want table or json", verb, c.format)
	}
	return validSchemaFlag(verb, c.schema)
}

// reader opens a client that creates nothing: a schema that migrate has not
// set up is an error, not a new schema.
func (c *common) reader(ctx context.Context, out io.Writer, verb string) (*sqlstreams.Client, func(), error) {
	// Errors only: what a verb changed, it prints itself (declare's SQL0059
	// is its output), and the CLI's reads log nothing.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	return openClient(ctx, out, verb, &sqlstreams.ClientConfig{Schema: c.schema, DisableMigrate: true, Logger: logger})
}

// group opens the handle of stream's group name.
func (c *common) group(ctx context.Context, out io.Writer, verb, stream, name string) (*sqlstreams.Group, func(), error) {
	client, done, err := c.reader(ctx, out, verb)
	if err != nil {
		return nil, nil, err
	}
	g, err := client.Group(ctx, stream, name)
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("%s: %w", verb, err)
	}
	return g, done, nil
}

// parseVerb parses a verb's flags and positional arguments, in any order
// (flags may follow the positionals, as in `groups describe S G -o json`),
// and checks the count of positionals against min and max (-1: any).
func parseVerb(fs *flag.FlagSet, args []string, out io.Writer, u verbUsage, min, max int) (pos []string, help bool, err error) {
	for {
		rest, help, err := parse(fs, args, out, u)
		if help || err != nil {
			return nil, help, err
		}
		if len(rest) == 0 {
			break
		}
		if rest[0] == "--" {
			pos = append(pos, rest[1:]...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	switch {
	case len(pos) < min:
		return nil, false, fmt.Errorf("%s: missing arguments (usage: sqlstreams %s)", fs.Name(), u.synopsis)
	case max >= 0 && len(pos) > max:
		return nil, false, unexpected(fs.Name(), pos[max:])
	}
	return pos, false, nil
}
