package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/c1702965/sqlstreams/internal/codes"
)

var explainUsage = verbUsage{
	synopsis: "explain [-o text|json] [CODE]",
	about: `Explains a log code, the code=SQLnnnn attribute of every WARN and ERROR line
sqlstreams logs: its level, what it means and what to do about it. CODE may
be written SQL0059, sql0059 or 59. Without CODE it lists every code. -o json
prints an object for one code, an array for all. It needs no database.`,
}

// codeJSON is one code as `explain -o json` prints it.
type codeJSON struct {
	Code    string `json:"code"`
	Level   string `json:"level"`
	Title   string `json:"title"`
	Meaning string `json:"meaning"`
	Remedy  string `json:"remedy"`
}

func toJSON(c codes.Code) codeJSON {
	return codeJSON{Code: c.ID, Level: c.Level.String(), Title: c.Title, Meaning: c.Meaning, Remedy: c.Remedy}
}

func explainVerb(args []string, out io.Writer) error {
	fs := newFlags("explain")
	format := fs.String("o", "text", "output format: text or json")
	rest, help, err := parse(fs, args, out, explainUsage)
	if help || err != nil {
		return err
	}
	// The code may come before the flags too: explain SQL0059 -o json.
	var id string
	if len(rest) > 0 {
		id = rest[0]
		if rest, help, err = parse(fs, rest[1:], out, explainUsage); help || err != nil {
			return err
		}
		if len(rest) > 0 {
			return unexpected("explain", rest)
		}
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("explain: -o must be text or json, got %q", *format)
	}
	if id == "" {
		return explainAll(out, *format)
	}
	c, ok := codes.Lookup(id)
	if !ok {
		return fmt.Errorf("explain: unknown code %q ('sqlstreams explain' lists them all)", id)
	}
	if *format == "json" {
		return writeJSON(out, toJSON(c))
	}
	fmt.Fprintf(out, "%s  %s  %s\n\n%s\n\n%s\n", c.ID, c.Level, c.Title, wrap(c.Meaning, 76), wrap("What to do: "+c.Remedy, 76))
	return nil
}

func explainAll(out io.Writer, format string) error {
	all := codes.All()
	if format == "json" {
		list := make([]codeJSON, len(all))
		for i, c := range all {
			list[i] = toJSON(c)
		}
		return writeJSON(out, list)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tLEVEL\tTITLE")
	for _, c := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.ID, c.Level, c.Title)
	}
	return tw.Flush()
}

// wrap breaks s into lines of at most width characters where it can (a longer word
// stays whole).
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(s) {
		switch {
		case n == 0:
		case n+1+utf8.RuneCountInString(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += utf8.RuneCountInString(w)
	}
	return b.String()
}
