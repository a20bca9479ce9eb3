package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/c1702965/sqlstreams"
)

// inspect and bindings: a group's config and its binding set, read only.

var inspectUsage = verbUsage{
	synopsis: "inspect STREAM GROUP [-schema sqlstreams] [-o table|json]",
	about: `Shows a group's config: every effective value with its source (declared,
default or clamped), the declared document, the declaration history and the
group's Consume sessions. The "config" object of -o json is what 'groups declare -f'
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
		doc, _ := json.Marshal(l.Config)
		rows = append(rows, []string{stamp(l.DeclaredAt), l.DeclaredBy, string(doc)})
	}
	if err := table(out, []string{"DECLARED-AT", "BY", "CONFIG"}, rows); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nsessions (%d):\n", len(in.Members))
	rows = nil
	for _, m := range in.Members {
		rows = append(rows, []string{m.DeclaredBy, stamp(m.StartedAt), stamp(m.HeartbeatAt), strconv.FormatBool(m.Live), strings.Join(m.Instances, ",")})
	}
	return table(out, []string{"BY", "STARTED", "HEARTBEAT", "LIVE", "INSTANCE-IDS"}, rows)
}

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
