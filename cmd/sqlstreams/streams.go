package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/c1702965/sqlstreams"
)

// streams ls and the rm verbs (streams rm, groups rm).

var streamsUsage = verbUsage{
	synopsis: "streams ls | streams rm STREAM [-execute] [-schema sqlstreams] [-o table|json]",
	about: `ls lists the registered streams with their config, the on-disk size of their
retained log and their consumer groups; it reads only. rm removes a stream
with its tables, messages, consumer groups and schedules: a dry run that
lists what would go unless -execute is given, refused while an instance of
one of its groups is live.`,
}

func streamsVerb(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "rm" {
		return rmVerb(ctx, "streams rm", args[1:], out)
	}
	fs := newFlags("streams")
	var c common
	c.register(fs)
	pos, help, err := parseVerb(fs, args, out, streamsUsage, 1, 1)
	if help || err != nil {
		return err
	}
	if pos[0] != "ls" {
		return fmt.Errorf("streams: unknown subcommand %q (one of: ls, rm)", pos[0])
	}
	if err := c.check("streams"); err != nil {
		return err
	}
	client, done, err := c.reader(ctx, out, "streams")
	if err != nil {
		return err
	}
	defer done()
	streams, err := client.Streams(ctx)
	if err != nil {
		return fmt.Errorf("streams: %w", err)
	}
	if c.format == "json" {
		type row struct {
			Name          string                  `json:"name"`
			Config        sqlstreams.StreamConfig `json:"config"`
			CreatedAt     time.Time               `json:"created_at"`
			UpdatedAt     time.Time               `json:"updated_at"`
			RetainedBytes int64                   `json:"retained_bytes"`
			Groups        []string                `json:"groups"`
		}
		rows := make([]row, len(streams))
		for i, s := range streams {
			rows[i] = row{s.Name, s.Config, s.CreatedAt, s.UpdatedAt, s.RetainedBytes, s.Groups}
		}
		return writeJSON(out, rows)
	}
	var rows [][]string
	for _, s := range streams {
		cfg, _ := json.Marshal(s.Config)
		rows = append(rows, []string{s.Name, bytesHuman(s.RetainedBytes), strconv.Itoa(len(s.Groups)), strings.Join(s.Groups, ","), string(cfg)})
	}
	return table(out, []string{"STREAM", "RETAINED", "GROUPS", "NAMES", "CONFIG"}, rows)
}

// rmVerb is streams rm and groups rm: a dry run unless -execute, whose
// client alone is built with AllowDestroy.
func rmVerb(ctx context.Context, verb string, args []string, out io.Writer) error {
	fs := newFlags(verb)
	var c common
	c.register(fs)
	execute := fs.Bool("execute", false, "remove (without it, a dry run that lists what would go)")
	n, synopsis := 1, "streams rm STREAM [-execute] [-schema sqlstreams] [-o table|json]"
	if verb == "groups rm" {
		n, synopsis = 2, "groups rm STREAM GROUP [-execute] [-schema sqlstreams] [-o table|json]"
	}
	pos, help, err := parseVerb(fs, args, out, verbUsage{synopsis: synopsis,
		about: `An action: removes a stream (with its tables, messages, groups and schedules) or
one consumer group (with everything it holds), in one transaction. Without
-execute it is a dry run that lists what would go and changes nothing. It is
refused while an instance of the stream's groups (or of the group) is live.`}, n, n)
	if help || err != nil {
		return err
	}
	if err := c.check(verb); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	client, done, err := openClient(ctx, out, verb, &sqlstreams.ClientConfig{Schema: c.schema, DisableMigrate: true,
		AllowDestroy: *execute, Logger: logger})
	if err != nil {
		return err
	}
	defer done()
	opts := &sqlstreams.DestroyOptions{DryRun: !*execute}
	var res *sqlstreams.DestroyResult
	if n == 1 {
		res, err = client.DestroyStream(ctx, pos[0], opts)
	} else {
		res, err = client.DestroyGroup(ctx, pos[0], pos[1], opts)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	if c.format == "json" {
		return writeJSON(out, map[string]any{"stream": res.Stream, "group": res.Group, "dry_run": res.DryRun,
			"relations": orEmpty(res.Relations), "rows": res.Rows, "groups": orEmpty(res.Groups)})
	}
	what := "stream " + res.Stream
	if res.Group != "" {
		what = "group " + res.Group + " of stream " + res.Stream
	}
	if res.DryRun {
		fmt.Fprintf(out, "dry run: would remove %s (-execute removes it):\n", what)
	} else {
		fmt.Fprintf(out, "removed %s:\n", what)
	}
	if res.Group == "" {
		fmt.Fprintf(out, "  %d message(s), %d table(s) and partition(s): %s\n", res.Rows["log"], len(res.Relations), strings.Join(res.Relations, " "))
		fmt.Fprintf(out, "  %d consumer group(s): %s\n", len(res.Groups), strings.Join(res.Groups, " "))
		return nil
	}
	var rows [][]string
	for _, t := range []string{"cursor", "range", "exception", "key_lease", "delivery", "binding", "binding_declaration"} {
		rows = append(rows, []string{t, strconv.FormatInt(res.Rows[t], 10)})
	}
	return table(out, []string{"TABLE", "ROWS"}, rows)
}
