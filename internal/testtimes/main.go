// Command testtimes runs and reads `go test -json` for the Makefile.
//
//   - As a filter (make test: go test -json | testtimes) it prints what
//     `go test` prints without -v: each package's result line, build errors,
//     and the output of the tests that failed; it exits 1 when a package or
//     a test failed, or when it read no result at all.
//   - With -check (make check) it runs the fast tier itself: every package
//     with -short, the root package's tests split over -shards processes
//     that run at once, each with its own PostgreSQL (its tests wait on
//     timers and the database far more than they use the CPU, and they run
//     one at a time in a process: the claim gate reads the cluster's oldest
//     open transaction); the shards are balanced by the times of the run
//     recorded in -json, which it then replaces. It prints as the filter
//     does.
//   - With -slowest N FILE (make slowest) it lists the N slowest top-level
//     tests of a recorded run.
//
// It is a tool for the repository's Makefile, not an API for users.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json; a build's lines are
// build-output events).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	slowest := flag.Int("slowest", 0, "list the N slowest tests of the run recorded in the file named by the argument")
	check := flag.Bool("check", false, "run the fast tier: every package's tests with -short, the root package's in shards")
	shards := flag.Int("shards", 3, "with -check: the processes the root package's tests are split over")
	record := flag.String("json", "", "with -check: the file the run's go test -json is recorded in (and the last run's read from)")
	flag.Parse()
	switch {
	case *slowest > 0:
		f, err := os.Open(flag.Arg(0))
		if err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err, "(make check records a run)")
			os.Exit(2)
		}
		defer f.Close()
		if err := listSlowest(f, os.Stdout, *slowest); err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(2)
		}
	case *check:
		if err := runCheck(*shards, *record, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(1)
		}
	default:
		f := newFilter(os.Stdout)
		sc := scanner(os.Stdin)
		for sc.Scan() {
			f.line(sc.Bytes())
		}
		if err := sc.Err(); err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(1)
		}
		if !f.ok() {
			os.Exit(1)
		}
	}
}

func scanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	return sc
}

// filter prints, line by line of `go test -json`, what `go test` without
// -v would print.
type filter struct {
	out     io.Writer
	held    map[string]*strings.Builder // output of tests not finished, by package and test
	results int
	failed  bool
}

func newFilter(out io.Writer) *filter { return &filter{out: out, held: map[string]*strings.Builder{}} }

// ok reports whether every package passed (and there was one).
func (f *filter) ok() bool { return f.results > 0 && !f.failed }

func (f *filter) line(b []byte) {
	var e event
	if json.Unmarshal(b, &e) != nil || e.Action == "" {
		fmt.Fprintln(f.out, string(b)) // not an event: a build error, say
		return
	}
	key := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(f.out, e.Output)
	case e.Test == "" && e.Action == "output":
		if e.Output != "PASS\n" { // -v's line, which go test alone does not print
			fmt.Fprint(f.out, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
		f.results++
		if e.Action == "fail" {
			f.failed = true
			for k, b := range f.held { // a test that never finished: a timeout or a panic
				if strings.HasPrefix(k, e.Package+" ") {
					fmt.Fprint(f.out, b.String())
					delete(f.held, k)
				}
			}
		}
	case e.Action == "output":
		if f.held[key] == nil {
			f.held[key] = &strings.Builder{}
		}
		f.held[key].WriteString(e.Output)
	case e.Action == "fail":
		f.failed = true
		if b := f.held[key]; b != nil {
			fmt.Fprint(f.out, b.String())
		}
		delete(f.held, key)
	case e.Action == "pass" || e.Action == "skip":
		delete(f.held, key)
	}
}
