package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/c1702965/sqlstreams"
)

// The operator's verbs: streams, groups, inspect, bindings, dlq. Reads go
// through a client that runs no DDL (DisableMigrate) and the read-only
// group handle; actions say so in their names and take a dry run or an
// explicit flag first.

// common are the flags every operator verb takes.
type common struct {
	schema string
	format string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.schema, "schema", "sqlstreams", "the schema sqlstreams works in (ClientConfig.Schema)")
	fs.StringVar(&c.format, "o", "table", "output: table (for people) or json (for machines)")
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

// table writes aligned columns for people.
func table(out io.Writer, header []string, rows [][]string) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

func ago(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ---- streams ----

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

// ---- groups ----

var groupsUsage = verbUsage{
	synopsis: `groups ls [-stream S] | groups describe S [G] | groups seek S G -to-… [-execute] | groups declare S G -f FILE
                  | groups rm S G [-execute]   [-schema sqlstreams] [-o table|json]`,
	about: `ls lists consumer groups (of one stream with -stream). describe shows one row per
group, Kafka's columns: committed and head positions (message ids), lag (log
positions after the committed one; ">=N" past the count's cap), the age of
the oldest unconsumed message, ranges in flight, retrying and dead messages,
live instances. ls and describe read only.

seek moves a stopped group's cursor (it is refused while an instance is
live): -to-beginning, -to-head, -to-time RFC3339 or -to-id N. It is a dry run
that prints before and after unless -execute is given.

declare stores a whole consumer config document (-f FILE, or - for stdin):
the "config" object of 'sqlstreams inspect -o json', in ConsumerConfig's
JSON shape; it prints the fields it changed (SQL0059). It does not change
the binding set.

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
	Stream           string                `json:"stream"`
	Group            string                `json:"group"`
	At               time.Time             `json:"at"`
	Committed        sqlstreams.Position   `json:"committed"`
	Cursor           sqlstreams.Position   `json:"cursor"`
	Head             sqlstreams.Position   `json:"head"`
	Lag              int64                 `json:"lag"`
	LagAtLeast       bool                  `json:"lag_at_least"`
	LagCountsAll     bool                  `json:"lag_counts_all_positions"`
	OldestUnconsumed *time.Time            `json:"oldest_unconsumed,omitempty"`
	OldestAgeSeconds float64               `json:"oldest_age_seconds"`
	InFlight         int64                 `json:"in_flight_ranges"`
	ExpiredRanges    int64                 `json:"expired_ranges"`
	Retrying         int64                 `json:"retrying"`
	Quarantined      int64                 `json:"quarantined"`
	Dead             int64                 `json:"dead"`
	Instances        []sqlstreams.Instance `json:"instances"`
}

func groupsDescribe(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("groups describe")
	var c common
	c.register(fs)
	u := verbUsage{synopsis: "groups describe STREAM [GROUP] [-schema sqlstreams] [-o table|json]",
		about: `One row per group of STREAM (or only GROUP): committed and head message ids, lag
(log positions after the committed one, ">=N" past the count's cap; for a group
with bindings it counts every position, matching or not), the age of the
oldest unconsumed message, ranges in flight, retrying, dead, live instances.
Reads only.`}
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
	var rows []describeRow
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
			Lag: s.Lag, LagAtLeast: s.LagAtLeast, LagCountsAll: s.LagCountsAll, OldestAgeSeconds: s.OldestAge.Seconds(),
			InFlight: s.InFlight, ExpiredRanges: s.ExpiredRanges, Retrying: s.Retrying, Quarantined: s.Quarantined, Dead: s.Dead,
			Instances: s.Instances}
		if !s.OldestUnconsumed.IsZero() {
			t := s.OldestUnconsumed
			r.OldestUnconsumed = &t
		}
		if r.Instances == nil {
			r.Instances = []sqlstreams.Instance{}
		}
		rows = append(rows, r)
	}
	if c.format == "json" {
		if rows == nil {
			rows = []describeRow{}
		}
		return writeJSON(out, rows)
	}
	var t [][]string
	bound := false
	for _, r := range rows {
		lag := strconv.FormatInt(r.Lag, 10)
		if r.LagAtLeast {
			lag = ">=" + lag
		}
		if r.LagCountsAll {
			lag += "*"
			bound = true
		}
		t = append(t, []string{r.Group, r.Stream, strconv.FormatInt(r.Committed.ID, 10), strconv.FormatInt(r.Head.ID, 10), lag,
			ago(time.Duration(r.OldestAgeSeconds * float64(time.Second))), strconv.FormatInt(r.InFlight, 10),
			strconv.FormatInt(r.Retrying+r.Quarantined, 10), strconv.FormatInt(r.Dead, 10), strconv.Itoa(len(r.Instances))})
	}
	if err := table(out, []string{"GROUP", "STREAM", "COMMITTED", "HEAD", "LAG", "OLDEST-AGE", "IN-FLIGHT", "RETRYING", "DEAD", "INSTANCES"}, t); err != nil {
		return err
	}
	if bound {
		fmt.Fprintln(out, "* the group has bindings: its lag counts every position of the stream, matching or not")
	}
	return nil
}

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
a set changes through the code that consumes.`}
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

// ---- inspect ----

var inspectUsage = verbUsage{
	synopsis: "inspect STREAM GROUP [-schema sqlstreams] [-o table|json]",
	about: `Shows a group's config: every effective value with its source (declared,
default or clamped), the declared document, the declaration history and the
group's instances. The "config" object of -o json is what 'groups declare -f'
takes. Reads only.`,
}

func inspectVerb(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("inspect")
	var c common
	c.register(fs)
	pos, help, err := parseVerb(fs, args, out, inspectUsage, 2, 2)
	if help || err != nil {
		return err
	}
	if err := c.check("inspect"); err != nil {
		return err
	}
	g, done, err := c.group(ctx, out, "inspect", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	in, err := g.Inspect(ctx)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	if c.format == "json" {
		return writeJSON(out, in)
	}
	var rows [][]string
	for _, s := range in.Effective {
		rows = append(rows, []string{s.Field, s.Value, s.Source})
	}
	if err := table(out, []string{"FIELD", "VALUE", "SOURCE"}, rows); err != nil {
		return err
	}
	doc, _ := json.Marshal(in.Config)
	fmt.Fprintf(out, "\ndeclared: %s\n", doc)
	fmt.Fprintf(out, "\nhistory (newest first, %d):\n", len(in.Log))
	rows = nil
	for _, l := range in.Log {
		rows = append(rows, []string{stamp(l.DeclaredAt), l.Worker, l.DeclaredBy, string(l.Document)})
	}
	if err := table(out, []string{"DECLARED-AT", "WORKER", "BY", "DOCUMENT"}, rows); err != nil {
		return err
	}
	fmt.Fprintln(out, "\ninstances:")
	rows = nil
	for _, i := range in.Instances {
		rows = append(rows, []string{i.ID, i.Worker, i.DeclaredBy, stamp(i.StartedAt), stamp(i.HeartbeatAt), strconv.FormatBool(i.Live)})
	}
	return table(out, []string{"ID", "WORKER", "BY", "STARTED", "HEARTBEAT", "LIVE"}, rows)
}

// ---- bindings ----

var bindingsUsage = verbUsage{
	synopsis: "bindings STREAM GROUP [-stale-after 30s] [-schema sqlstreams] [-o table|json]",
	about: `Shows a group's installed binding set and the declarers waiting to change it:
their set, since when they wait, their last attempt, and "stale" when that
attempt is older than -stale-after (the declarer probably stopped). Reads only.`,
}

func bindingsVerb(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("bindings")
	var c common
	c.register(fs)
	stale := fs.Duration("stale-after", 3*sqlstreams.DefaultBindingRetryInterval, "a waiter whose last attempt is older is stale")
	pos, help, err := parseVerb(fs, args, out, bindingsUsage, 2, 2)
	if help || err != nil {
		return err
	}
	if err := c.check("bindings"); err != nil {
		return err
	}
	if *stale <= 0 {
		return fmt.Errorf("bindings: -stale-after %s must be positive", *stale)
	}
	g, done, err := c.group(ctx, out, "bindings", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	l, err := g.Bindings(ctx, *stale)
	if err != nil {
		return fmt.Errorf("bindings: %w", err)
	}
	if c.format == "json" {
		if l.Waiting == nil {
			l.Waiting = []sqlstreams.BindingDeclaration{}
		}
		return writeJSON(out, l)
	}
	var rows [][]string
	set := func(p []string) string {
		if len(p) == 0 {
			return "(the whole stream)"
		}
		return strings.Join(p, " ")
	}
	if l.Installed != nil {
		i := l.Installed
		rows = append(rows, []string{i.Status, set(i.Patterns), i.DeclaredBy, stamp(i.DeclaredAt), stamp(i.AttemptAt)})
	} else {
		rows = append(rows, []string{"installed", "(none declared: the whole stream)", "-", "-", "-"})
	}
	for _, w := range l.Waiting {
		rows = append(rows, []string{w.Status, set(w.Patterns), w.DeclaredBy, stamp(w.DeclaredAt), stamp(w.AttemptAt)})
	}
	return table(out, []string{"STATUS", "PATTERNS", "DECLARED-BY", "SINCE", "LAST-ATTEMPT"}, rows)
}

// ---- dlq ----

var dlqUsage = verbUsage{
	synopsis: `dlq ls STREAM GROUP [-limit 100] [-after ID] | dlq show STREAM GROUP ID | dlq redrive STREAM GROUP ID... | -all [-dry-run]
                  [-schema sqlstreams] [-o table|json]`,
	about: `ls lists a group's dead letters in message id order (a page of -limit, after
message -after); show prints one with its payload and delivery history. Both
read only. redrive is an action: it puts the named dead letters (or, with
-all, every one) back on their retry curve from attempt zero, due now; with
-dry-run it only says what it would redrive.`,
}

func dlqVerb(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("dlq: missing subcommand (one of: ls, show, redrive; see sqlstreams dlq -h)")
	}
	switch args[0] {
	case "ls":
		return dlqLs(ctx, args[1:], out)
	case "show":
		return dlqShow(ctx, args[1:], out)
	case "redrive":
		return dlqRedrive(ctx, args[1:], out)
	case "-h", "-help", "--help":
		printVerbUsage(newFlags("dlq"), out, dlqUsage)
		return nil
	}
	return fmt.Errorf("dlq: unknown subcommand %q (one of: ls, show, redrive)", args[0])
}

func dlqLs(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("dlq ls")
	var c common
	c.register(fs)
	limit := fs.Int("limit", 100, "at most this many (1..1000)")
	after := fs.Int64("after", 0, "after this message id (the last id of the page before)")
	pos, help, err := parseVerb(fs, args, out, verbUsage{synopsis: "dlq ls STREAM GROUP [-limit 100] [-after ID] [-schema sqlstreams] [-o table|json]",
		about: "Lists a group's dead letters in message id order, one page. Reads only."}, 2, 2)
	if help || err != nil {
		return err
	}
	if err := c.check("dlq ls"); err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		return fmt.Errorf("dlq ls: -limit %d outside 1..1000", *limit)
	}
	g, done, err := c.group(ctx, out, "dlq ls", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	dead, err := g.DeadLetters(ctx, *after, *limit)
	if err != nil {
		return fmt.Errorf("dlq ls: %w", err)
	}
	if c.format == "json" {
		if dead == nil {
			dead = []sqlstreams.DeadLetter{}
		}
		return writeJSON(out, dead)
	}
	var rows [][]string
	for _, d := range dead {
		rows = append(rows, []string{strconv.FormatInt(d.MessageID, 10), strconv.Itoa(d.Attempts), stamp(d.DiedAt), orDash(d.Key),
			orDash(d.RoutingKey), oneLine(truncate(d.LastError, 80))})
	}
	if err := table(out, []string{"ID", "ATTEMPTS", "DIED", "KEY", "ROUTING-KEY", "LAST-ERROR"}, rows); err != nil {
		return err
	}
	if len(dead) == *limit {
		fmt.Fprintf(out, "(more: -after %d)\n", dead[len(dead)-1].MessageID)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func dlqShow(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("dlq show")
	var c common
	c.register(fs)
	pos, help, err := parseVerb(fs, args, out, verbUsage{synopsis: "dlq show STREAM GROUP ID [-schema sqlstreams] [-o table|json]",
		about: "Prints one dead letter: its metadata, its payload (JSON, as stored) and its delivery history. Reads only."}, 3, 3)
	if help || err != nil {
		return err
	}
	if err := c.check("dlq show"); err != nil {
		return err
	}
	id, err := strconv.ParseInt(pos[2], 10, 64)
	if err != nil || id < 1 {
		return fmt.Errorf("dlq show: message id %q: want a positive integer", pos[2])
	}
	g, done, err := c.group(ctx, out, "dlq show", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	d, err := g.DeadLetter(ctx, id)
	if err != nil {
		return fmt.Errorf("dlq show: %w", err)
	}
	if c.format == "json" {
		type detail struct {
			sqlstreams.DeadLetter
			Payload    json.RawMessage       `json:"payload"`
			Deliveries []sqlstreams.Delivery `json:"deliveries"`
		}
		ds := d.Deliveries
		if ds == nil {
			ds = []sqlstreams.Delivery{}
		}
		return writeJSON(out, detail{d.DeadLetter, d.Payload, ds})
	}
	fmt.Fprintf(out, "message %d of stream %s, dead for group %s\n", d.MessageID, pos[0], pos[1])
	err = table(out, []string{"FIELD", "VALUE"}, [][]string{
		{"attempts", strconv.Itoa(d.Attempts)}, {"died", stamp(d.DiedAt)}, {"produced", stamp(d.ProducedAt)},
		{"key", orDash(d.Key)}, {"routing key", orDash(d.RoutingKey)}, {"version", strconv.Itoa(d.Version)},
		{"last error", oneLine(d.LastError)},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\npayload:\n%s\n", d.Payload)
	fmt.Fprintf(out, "\ndeliveries (%d):\n", len(d.Deliveries))
	var rows [][]string
	for _, l := range d.Deliveries {
		rows = append(rows, []string{strconv.Itoa(l.Attempt), l.Outcome, stamp(l.At), oneLine(l.Error)})
	}
	return table(out, []string{"ATTEMPT", "OUTCOME", "AT", "ERROR"}, rows)
}

func dlqRedrive(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("dlq redrive")
	var c common
	c.register(fs)
	all := fs.Bool("all", false, "every dead letter of the group")
	dry := fs.Bool("dry-run", false, "say what would be redriven; change nothing")
	pos, help, err := parseVerb(fs, args, out, verbUsage{synopsis: "dlq redrive STREAM GROUP ID... | -all [-dry-run] [-schema sqlstreams] [-o table|json]",
		about: `An action: puts the named dead letters (or every one, -all) back on their retry
curve from attempt zero, due now. -all works in pages of 1000 and prints its
progress. -dry-run changes nothing and says what would be redriven.`}, 2, -1)
	if help || err != nil {
		return err
	}
	if err := c.check("dlq redrive"); err != nil {
		return err
	}
	if *all == (len(pos) > 2) {
		return errors.New("dlq redrive: give message ids or -all, not both and not neither")
	}
	var ids []int64
	for _, p := range pos[2:] {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id < 1 {
			return fmt.Errorf("dlq redrive: message id %q: want a positive integer", p)
		}
		ids = append(ids, id)
	}
	if len(ids) > sqlstreams.MaxRedriveIDs {
		return fmt.Errorf("dlq redrive: at most %d ids at once (or -all)", sqlstreams.MaxRedriveIDs)
	}
	g, done, err := c.group(ctx, out, "dlq redrive", pos[0], pos[1])
	if err != nil {
		return err
	}
	defer done()
	var n, seen int64
	progress := c.format != "json"
	if *all {
		// Pages of dead letters, each redriven in one statement; a page
		// redriven is no longer dead, so the next page starts after it.
		var after int64
		for {
			page, err := g.DeadLetters(ctx, after, sqlstreams.MaxRedriveIDs)
			if err != nil {
				return fmt.Errorf("dlq redrive: %w (%d redriven before this failure)", err, n)
			}
			if len(page) == 0 {
				break
			}
			ids := make([]int64, len(page))
			for i, d := range page {
				ids[i] = d.MessageID
			}
			after = ids[len(ids)-1]
			seen += int64(len(ids))
			if !*dry {
				k, err := g.RedriveIDs(ctx, ids)
				if err != nil {
					return fmt.Errorf("dlq redrive: %w (%d redriven before this failure)", err, n)
				}
				n += k
			}
			if progress && seen >= sqlstreams.MaxRedriveIDs {
				fmt.Fprintf(out, "... %d dead letters seen, %d redriven\n", seen, n)
			}
		}
	} else {
		dead := map[int64]bool{}
		for _, id := range ids {
			_, err := g.DeadLetter(ctx, id)
			switch {
			case err == nil:
				dead[id] = true
			case !errors.Is(err, sqlstreams.ErrNotRegistered):
				return fmt.Errorf("dlq redrive: %w", err)
			}
		}
		seen = int64(len(dead))
		if !*dry {
			n, err = g.RedriveIDs(ctx, ids)
			if err != nil {
				return fmt.Errorf("dlq redrive: %w", err)
			}
		}
		if int64(len(ids)) > seen && progress {
			var not []string
			for _, id := range ids {
				if !dead[id] {
					not = append(not, strconv.FormatInt(id, 10))
				}
			}
			fmt.Fprintf(out, "not dead letters of %s (skipped): %s\n", pos[1], strings.Join(not, " "))
		}
	}
	if c.format == "json" {
		return writeJSON(out, map[string]any{"stream": pos[0], "group": pos[1], "dry_run": *dry, "dead": seen, "redriven": n})
	}
	if *dry {
		fmt.Fprintf(out, "dry run: would redrive %d dead letter(s) of group %s\n", seen, pos[1])
		return nil
	}
	fmt.Fprintf(out, "redrove %d dead letter(s) of group %s\n", n, pos[1])
	return nil
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

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
