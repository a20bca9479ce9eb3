// Command testtimes reads `go test -json` for the Makefile. As a filter
// (make check) it prints what `go test` prints without -v: each package's
// result line, build errors, and the output of the tests that failed; it
// exits 1 when a package or a test failed, or when it read no result at
// all. With -slowest N FILE (make slowest) it lists the N slowest top-level
// tests of a recorded run.
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
	"slices"
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
	slowest := flag.Int("slowest", 0, "list the N slowest tests of the run in the file named by the argument")
	flag.Parse()
	if *slowest > 0 {
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
		return
	}
	ok, err := filter(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
	}
	if !ok || err != nil {
		os.Exit(1)
	}
}

// filter copies what `go test` without -v would print, and reports whether
// every package passed.
func filter(in io.Reader, out io.Writer) (ok bool, err error) {
	held := map[string]*strings.Builder{} // output of tests not finished, by package and test
	results, failed := 0, false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event: a build error, say
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output" || e.Test == "" && e.Action == "output":
			fmt.Fprint(out, e.Output)
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			results++
			if e.Action == "fail" {
				failed = true
				for k, b := range held { // a test that never finished: a timeout or a panic
					if strings.HasPrefix(k, e.Package+" ") {
						fmt.Fprint(out, b.String())
						delete(held, k)
					}
				}
			}
		case e.Action == "output":
			if held[key] == nil {
				held[key] = &strings.Builder{}
			}
			held[key].WriteString(e.Output)
		case e.Action == "fail":
			failed = true
			if b := held[key]; b != nil {
				fmt.Fprint(out, b.String())
			}
			delete(held, key)
		case e.Action == "pass" || e.Action == "skip":
			delete(held, key)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return results > 0 && !failed, nil
}

// listSlowest prints the n slowest top-level tests of a recorded run.
func listSlowest(in io.Reader, out io.Writer, n int) error {
	type timing struct {
		secs      float64
		pkg, test string
	}
	var all []timing
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		if e.Action == "pass" || e.Action == "fail" {
			all = append(all, timing{e.Elapsed, e.Package, e.Test})
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(all) == 0 {
		return fmt.Errorf("no test results in the file")
	}
	slices.SortFunc(all, func(a, b timing) int {
		if a.secs != b.secs {
			if a.secs > b.secs {
				return -1
			}
			return 1
		}
		return strings.Compare(a.pkg+a.test, b.pkg+b.test)
	})
	for _, t := range all[:min(n, len(all))] {
		fmt.Fprintf(out, "%8.2fs  %s  (%s)\n", t.secs, t.test, t.pkg)
	}
	return nil
}
