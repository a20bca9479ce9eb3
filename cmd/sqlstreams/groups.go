package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/c1702965/sqlstreams"
)

// groups ls, describe, seek and declare.

var groupsUsage = verbUsage{
	synopsis: `groups ls [-stream S] | groups describe S [G] | groups seek S G -to-… [-execute] | groups declare S G -f FILE
                  | groups rm S G [-execute]   [-schema sqlstreams] [-o table|json]`,
	about: `ls lists consumer groups (of one stream with -stream). describe shows one row per
group: committed and head positions (message ids), lag and what makes it up
(available, in flight, retrying), dead letters, the age of the oldest
unconsumed message and the live Consume sessions (see groups describe -h).
ls and describe read only.

seek moves a stopped group's cursor (it is refused while an instance is
live): -to-beginning, -to-head, -to-time RFC3339 or -to-id N. It is a dry run
that prints before and after unless -execute is given.

declare stores a whole consumer config document (-f FILE, or - for stdin):
the "config" object of 'sqlstreams inspect -o json', in ConsumerConfig's
JSON shape; it prints the fields it changed (SQL0059). It never changes the
binding set. An application keeps it by registering with Attach, not
Register (see groups declare -h).

rm removes a group with its cursor, retries, dead letters, delivery log,
bindings, config and history, leaving the stream and its other groups: a dry
run unless -execute is given, refused while an instance of the group is live.`,
}

func groupsVerb(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("groups: missing subcommand (one of: ls, describe, seek, declare, rm; see sqlstreams groups -h)")
	}
	switch args[0] {
	case "ls":
		return groupsLs(ctx, args[1:], out)
	case "describe":
		return groupsDescribe(ctx, args[1:], out)
	case "seek":
		return groupsSeek(ctx, args[1:], out)
	case "declare":
		return groupsDeclare(ctx, args[1:], out)
	case "rm":
		return rmVerb(ctx, "groups rm", args[1:], out)
	case "-h", "-help", "--help":
		printVerbUsage(newFlags("groups"), out, groupsUsage)
		return nil
	}
	return fmt.Errorf("groups: unknown subcommand %q (one of: ls, describe, seek, declare, rm)", args[0])
}

func groupsLs(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("groups ls")
	var c common
	c.register(fs)
	stream := fs.String("stream", "", "only this stream's groups")
	_, help, err := parseVerb(fs, args, out, verbUsage{synopsis: "groups ls [-stream S] [-schema sqlstreams] [-o table|json]",
		about: "Lists consumer groups, with their stream and creation. Reads only."}, 0, 0)
	if help || err != nil {
		return err
	}
	if err := c.check("groups ls"); err != nil {
		return err
	}
	client, done, err := c.reader(ctx, out, "groups ls")
	if err != nil {
		return err
	}
	defer done()
	gs, err := client.Groups(ctx, *stream)
	if err != nil {
		return fmt.Errorf("groups ls: %w", err)
	}
	if c.format == "json" {
		type row struct {
			Name      string    `json:"name"`
			Stream    string    `json:"stream"`
			Start     string    `json:"start"`
			CreatedAt time.Time `json:"created_at"`
		}
		rows := make([]row, len(gs))
		for i, g := range gs {
			rows[i] = row{g.Name, g.Stream, string(g.Start), g.CreatedAt}
		}
		return writeJSON(out, rows)
	}
	var rows [][]string
	for _, g := range gs {
		rows = append(rows, []string{g.Name, g.Stream, string(g.Start), stamp(g.CreatedAt)})
	}
	return table(out, []string{"GROUP", "STREAM", "START", "CREATED"}, rows)
}

// describeRow is one group's status as `groups describe -o json` prints it.
type describeRow struct {
	Stream           string              `json:"stream"`
	Group            string              `json:"group"`
	At               time.Time           `json:"at"`
	Committed        sqlstreams.Position `json:"committed"`
	Cursor           sqlstreams.Position `json:"cursor"`
	Head             sqlstreams.Position `json:"head"`
	Lag              int64               `json:"lag"`
	Available        int64               `json:"available"`
	InFlight         int64               `json:"in_flight"`
	Retrying         int64               `json:"retrying"`
	Quarantined      int64               `json:"quarantined"`
	Dead             int64               `json:"dead"`
	Estimated        bool                `json:"estimated"`
	OldestUnconsumed *time.Time          `json:"oldest_unconsumed,omitempty"`
	OldestAgeSeconds float64             `json:"oldest_age_seconds"`
	Ranges           int64               `json:"ranges"`
	ExpiredRanges    int64               `json:"expired_ranges"`
	Sessions         int                 `json:"sessions"`
	Members          []sqlstreams.Member `json:"members"`
}

func groupsDescribe(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("groups describe")
	var c common
	c.register(fs)
	u := verbUsage{synopsis: "groups describe STREAM [GROUP] [-schema sqlstreams] [-o table|json]",
		about: describeAbout}
	pos, help, err := parseVerb(fs, args, out, u, 1, 2)
	if help || err != nil {
		return err
	}
	if err := c.check("groups describe"); err != nil {
		return err
	}
	client, done, err := c.reader(ctx, out, "groups describe")
	if err != nil {
		return err
	}
	defer done()
	var names []string
	if len(pos) == 2 {
		names = []string{pos[1]}
	} else {
		gs, err := client.Groups(ctx, pos[0])
		if err != nil {
			return fmt.Errorf("groups describe: %w", err)
		}
		for _, g := range gs {
			names = append(names, g.Name)
		}
	}
	rows := []describeRow{}
	for _, n := range names {
		g, err := client.Group(ctx, pos[0], n)
		if err != nil {
			return fmt.Errorf("groups describe: %w", err)
		}
		s, err := g.Status(ctx)
		if err != nil {
			return fmt.Errorf("groups describe: %w", err)
		}
		r := describeRow{Stream: s.Stream, Group: s.Group, At: s.At, Committed: s.Committed, Cursor: s.Cursor, Head: s.Head,
			Lag: s.Lag, Available: s.Available, InFlight: s.InFlight, Retrying: s.Retrying, Quarantined: s.Quarantined, Dead: s.Dead,
			Estimated: s.Estimated, OldestAgeSeconds: s.OldestAge.Seconds(), Ranges: s.Ranges, ExpiredRanges: s.ExpiredRanges,
			Sessions: len(s.Members), Members: s.Members}
		if !s.OldestUnconsumed.IsZero() {
			t := s.OldestUnconsumed
			r.OldestUnconsumed = &t
		}
		rows = append(rows, r)
	}
	if c.format == "json" {
		return writeJSON(out, rows)
	}
	var t [][]string
	estimated := false
	for _, r := range rows {
		n := func(v int64) string {
			if r.Estimated {
				return "~" + strconv.FormatInt(v, 10)
			}
			return strconv.FormatInt(v, 10)
		}
		estimated = estimated || r.Estimated
		t = append(t, []string{r.Group, r.Stream, strconv.FormatInt(r.Committed.ID, 10), strconv.FormatInt(r.Head.ID, 10), n(r.Lag),
			n(r.Available), n(r.InFlight), strconv.FormatInt(r.Retrying+r.Quarantined, 10), strconv.FormatInt(r.Dead, 10),
			ago(time.Duration(r.OldestAgeSeconds * float64(time.Second))), strconv.Itoa(r.Sessions)})
	}
	if err := table(out, []string{"GROUP", "STREAM", "COMMITTED", "HEAD", "LAG", "AVAILABLE", "IN-FLIGHT", "RETRYING", "DEAD", "OLDEST-AGE", "SESSIONS"}, t); err != nil {
		return err
	}
	if estimated {
		fmt.Fprintf(out, "~ estimated: more than %d messages, counted up to that many and estimated from the message ids after\n", sqlstreams.StatusCountBound)
	}
	return nil
}

// describeAbout is what `groups describe -h` says of its columns.
var describeAbout = fmt.Sprintf(`One row per group of STREAM (or only GROUP): committed and head message ids;
what the group has left to handle, by state: LAG is AVAILABLE (produced and
not claimed yet; for a group with bindings, only what they match) plus
IN-FLIGHT (claimed, not settled) plus RETRYING (waiting for a retry, or
quarantined); DEAD counts its dead letters, which are not lag. Each count is
exact up to %d messages and an estimate past that, marked "~". Then the
age of the oldest unconsumed message and the live Consume sessions (one each,
whatever rows a session holds). Reads only.`, sqlstreams.StatusCountBound)

func groupsSeek(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("groups seek")
	var c common
	c.register(fs)
	begin := fs.Bool("to-beginning", false, "the start of the retained log")
	head := fs.Bool("to-head", false, "after every message final now")
	at := fs.String("to-time", "", "the first message produced at or after this time (RFC3339)")
	id := fs.Int64("to-id", 0, "message id N: delivered next")
	execute := fs.Bool("execute", false, "apply the seek (without it, a dry run that changes nothing)")
	u := verbUsage{synopsis: "groups seek STREAM GROUP -to-beginning|-to-head|-to-time T|-to-id N [-execute] [-schema sqlstreams] [-o table|json]",
		about: `Moves a stopped group's cursor, as Kafka's --reset-offsets does: the next message
delivered is the first after the new position. Refused while any instance of
the group is live or a lease of a stopped one has not lapsed. Exception rows
after the new position are dropped (those messages are delivered again from
attempt zero); those at or before it stay. Without -execute it is a dry run:
it prints the positions before and after and what would be dropped, and
changes nothing.`}
	pos, help, err := parseVerb(fs, args, out, u, 2, 2)
	if help || err != nil {
		return err
	}
	if err := c.check("groups seek"); err != nil {
		return err
	}
	var to []sqlstreams.SeekTo
	if *begin {
		to = append(to, sqlstreams.SeekBeginning())
	}
	if *head {
		to = append(to, sqlstreams.SeekHead())
	}
	if *at != "" {
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return fmt.Errorf("groups seek: -to-time %q: want RFC3339, like 2026-12-01T10:00:00Z", *at)
		}
		to = append(to, sqlstreams.SeekTime(t))
	}
	if *id != 0 {
		to = append(to, sqlstreams.SeekID(*id))
	}
	if len(to) != 1 {
		return errors.New("groups seek: give exactly one of -to-beginning, -to-head, -to-time, -to-id")
	}
	g, done, err := c.group(ctx, out, "groups seek", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	res, err := g.Seek(ctx, to[0], &sqlstreams.SeekOptions{DryRun: !*execute})
	if err != nil {
		return fmt.Errorf("groups seek: %w", err)
	}
	if c.format == "json" {
		return writeJSON(out, map[string]any{"stream": pos[0], "group": pos[1], "to": to[0].String(), "dry_run": res.DryRun,
			"before_cursor": res.BeforeCursor, "before_committed": res.BeforeCommitted, "after": res.After,
			"ranges_dropped": res.Ranges, "key_leases_dropped": res.KeyLeases, "retrying_dropped": res.Retrying, "dead_dropped": res.Dead})
	}
	verb := "moved"
	if res.DryRun {
		verb = "would move (dry run; -execute applies it)"
	}
	fmt.Fprintf(out, "group %s of stream %s %s to %s\n", pos[1], pos[0], verb, to[0])
	err = table(out, []string{"", "COMMITTED", "CURSOR"}, [][]string{
		{"before", fmt.Sprint(res.BeforeCommitted.ID), fmt.Sprint(res.BeforeCursor.ID)},
		{"after", fmt.Sprint(res.After.ID), fmt.Sprint(res.After.ID)},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "dropped: %d lapsed range(s), %d key lease(s), %d retrying and %d dead message(s) after the new position\n",
		res.Ranges, res.KeyLeases, res.Retrying, res.Dead)
	return nil
}

func groupsDeclare(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("groups declare")
	var c common
	c.register(fs)
	file := fs.String("f", "", "the config document (JSON; - for stdin)")
	u := verbUsage{synopsis: "groups declare STREAM GROUP -f FILE [-schema sqlstreams] [-o table|json]",
		about: `An action: stores FILE as the group's whole config document (newest wins;
running instances read it at their next refresh) and prints the fields it
changed. FILE is ConsumerConfig's JSON, the "config" object 'sqlstreams
inspect -o json' prints, for example:
  {"message": {"timeout": "10s", "retry": {"max_retries": 3}}, "delivery_log": "all"}
Unknown fields are errors. "bindings", if present, must be the installed set:
a set changes through the code that consumes, never here.

An application that registers the group with Consumer(name).Register declares
its own config again at its next start (newest wins), undoing this one. For a
group an operator manages, the application calls Consumer(name).Attach(ctx,
initial) instead: it declares initial only when it creates the group, and
otherwise consumes with what is stored here.`}
	pos, help, err := parseVerb(fs, args, out, u, 2, 2)
	if help || err != nil {
		return err
	}
	if err := c.check("groups declare"); err != nil {
		return err
	}
	if *file == "" {
		return errors.New("groups declare: -f FILE is required (- for stdin)")
	}
	var raw []byte
	if *file == "-" {
		raw, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		raw, err = os.ReadFile(*file)
	}
	if err != nil {
		return fmt.Errorf("groups declare: -f: %w", err)
	}
	var cfg sqlstreams.ConsumerConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("groups declare: %s: %w", *file, err)
	}
	g, done, err := c.group(ctx, out, "groups declare", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	d, err := g.Declare(ctx, cfg)
	if err != nil {
		return fmt.Errorf("groups declare: %w", err)
	}
	if c.format == "json" {
		changes := d.Changes
		if changes == nil {
			changes = []string{}
		}
		return writeJSON(out, map[string]any{"stream": pos[0], "group": pos[1], "changes": changes})
	}
	if len(d.Changes) == 0 {
		fmt.Fprintf(out, "group %s: unchanged (the stored document is the same)\n", pos[1])
		return nil
	}
	fmt.Fprintf(out, "group %s: declared; changed:\n", pos[1])
	for _, ch := range d.Changes {
		fmt.Fprintf(out, "  %s\n", ch)
	}
	return nil
}
