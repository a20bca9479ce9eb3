package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/c1702965/sqlstreams"
)

// dlq ls, show and redrive: a group's dead letters.

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
		about: `Lists a group's dead letters in message id order, one page. When more follow,
the table ends with the -after that reads the next page, and -o json gives it
as "next_after" (null on the last page). Reads only.`}, 2, 2)
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
	// A full page may be the last: one more read says whether any follow.
	var next *int64
	if len(dead) == *limit {
		last := dead[len(dead)-1].MessageID
		more, err := g.DeadLetters(ctx, last, 1)
		if err != nil {
			return fmt.Errorf("dlq ls: %w", err)
		}
		if len(more) > 0 {
			next = &last
		}
	}
	if c.format == "json" {
		if dead == nil {
			dead = []sqlstreams.DeadLetter{}
		}
		return writeJSON(out, struct {
			DeadLetters []sqlstreams.DeadLetter `json:"dead_letters"`
			NextAfter   *int64                  `json:"next_after"`
		}{dead, next})
	}
	var rows [][]string
	for _, d := range dead {
		rows = append(rows, []string{strconv.FormatInt(d.MessageID, 10), strconv.Itoa(d.Attempts), stamp(d.DiedAt), orDash(d.Key),
			orDash(d.RoutingKey), oneLine(truncate(d.LastError, 80))})
	}
	if err := table(out, []string{"ID", "ATTEMPTS", "DIED", "KEY", "ROUTING-KEY", "LAST-ERROR"}, rows); err != nil {
		return err
	}
	if next != nil {
		fmt.Fprintf(out, "(more: -after %d)\n", *next)
	}
	return nil
}

func dlqShow(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("dlq show")
	var c common
	c.register(fs)
	pos, help, err := parseVerb(fs, args, out, verbUsage{synopsis: "dlq show STREAM GROUP ID [-schema sqlstreams] [-o table|json]",
		about: "Prints one dead letter: its metadata and headers, its payload (JSON, as stored) and its delivery history. Reads only."}, 3, 3)
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
			Headers    sqlstreams.Headers    `json:"headers"`
			Payload    json.RawMessage       `json:"payload"`
			Deliveries []sqlstreams.Delivery `json:"deliveries"`
		}
		ds := d.Deliveries
		if ds == nil {
			ds = []sqlstreams.Delivery{}
		}
		hs := d.Headers
		if hs == nil {
			hs = sqlstreams.Headers{}
		}
		return writeJSON(out, detail{d.DeadLetter, hs, d.Payload, ds})
	}
	fmt.Fprintf(out, "message %d of stream %s, dead for group %s\n", d.MessageID, pos[0], pos[1])
	fields := [][]string{
		{"attempts", strconv.Itoa(d.Attempts)}, {"died", stamp(d.DiedAt)}, {"produced", stamp(d.ProducedAt)},
		{"key", orDash(d.Key)}, {"routing key", orDash(d.RoutingKey)}, {"version", strconv.Itoa(d.Version)},
		{"last error", oneLine(d.LastError)},
	}
	for _, name := range slices.Sorted(maps.Keys(d.Headers)) {
		fields = append(fields, []string{"header " + name, oneLine(d.Headers[name])})
	}
	err = table(out, []string{"FIELD", "VALUE"}, fields)
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
