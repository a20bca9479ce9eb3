package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// timing is one top-level test's time in a recorded run.
type timing struct {
	secs      float64
	pkg, test string
}

// timings reads the top-level tests' times of a recorded run (subtests
// are their parents').
func timings(in io.Reader) ([]timing, error) {
	var all []timing
	sc := scanner(in)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		if e.Action == "pass" || e.Action == "fail" {
			all = append(all, timing{e.Elapsed, e.Package, e.Test})
		}
	}
	return all, sc.Err()
}

// listSlowest prints the n slowest top-level tests of a recorded run.
func listSlowest(in io.Reader, out io.Writer, n int) error {
	all, err := timings(in)
	if err != nil {
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
