package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// goTest are the flags of every go test the fast tier runs.
var goTest = []string{"test", "-short", "-count=1", "-timeout", "10m", "-json"}

// runCheck runs the fast tier (see the package comment) in the current
// module and prints it as the filter does; record, if set, names the file
// of the last run's go test -json, read to balance the shards and then
// replaced by this run's.
func runCheck(shards int, record string, out io.Writer) error {
	root, err := goOutput("list", ".")
	if err != nil {
		return err
	}
	all, err := goOutput("list", "./...")
	if err != nil {
		return err
	}
	var others []string
	for _, p := range strings.Fields(all) {
		if p != root {
			others = append(others, p)
		}
	}
	names, err := testNames(".")
	if err != nil {
		return err
	}
	var last []timing
	if f, err := os.Open(record); err == nil {
		last, _ = timings(f)
		f.Close()
	}
	// The root package compiles once, before its shards start at once.
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("sqlstreams-check-%d.test", os.Getpid()))
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	err = build.Run()
	_ = os.Remove(bin)
	if err != nil {
		return fmt.Errorf("build the root package's tests: %w", err)
	}

	var runs [][]string
	if len(others) > 0 {
		runs = append(runs, append(slices.Clone(goTest), others...))
	}
	for _, shard := range balance(names, root, last, shards) {
		runs = append(runs, append(slices.Clone(goTest), "-run", "^("+strings.Join(shard, "|")+")$", "."))
	}
	var rec io.Writer = io.Discard
	if record != "" {
		f, err := os.Create(record)
		if err != nil {
			return err
		}
		defer f.Close()
		rec = f
	}
	lines := make(chan []byte)
	errs := make(chan error, len(runs))
	var wg sync.WaitGroup
	for _, args := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- stream(args, lines)
		}()
	}
	go func() { wg.Wait(); close(lines) }()
	f := newFilter(out)
	for l := range lines {
		_, _ = rec.Write(append(l, '\n'))
		f.line(l)
	}
	close(errs)
	var failed []error
	for err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if !f.ok() && len(failed) == 0 {
		failed = append(failed, errors.New("a test failed"))
	}
	return errors.Join(failed...)
}

// stream runs go with args and sends each line it prints.
func stream(args []string, lines chan<- []byte) error {
	cmd := exec.Command("go", args...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := scanner(stdout)
	for sc.Scan() {
		lines <- bytes.Clone(sc.Bytes())
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args[:min(len(args), 8)], " "), err)
	}
	return sc.Err()
}

func goOutput(args ...string) (string, error) {
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// testName is what go test runs of a package: its tests, examples and fuzz
// targets' seeds.
var testName = regexp.MustCompile(`^(Test|Example|Fuzz)([^a-z].*)?$`)

// testNames lists the top-level tests of the package in dir, as -run
// matches them.
func testNames(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var names []string
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && testName.MatchString(fd.Name.Name) && fd.Name.Name != "TestMain" {
				names = append(names, fd.Name.Name)
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// balance splits names over n shards, the longest first, each to the
// shard with the least time so far by the last run (a test it did not
// see counts as its median).
func balance(names []string, pkg string, last []timing, n int) [][]string {
	took := map[string]float64{}
	var secs []float64
	for _, t := range last {
		if t.pkg == pkg {
			took[t.test] = t.secs
			secs = append(secs, t.secs)
		}
	}
	median := 1.0
	if len(secs) > 0 {
		slices.Sort(secs)
		median = secs[len(secs)/2]
	}
	cost := func(name string) float64 {
		if s, ok := took[name]; ok {
			return s
		}
		return median
	}
	order := slices.Clone(names)
	slices.SortStableFunc(order, func(a, b string) int {
		switch ca, cb := cost(a), cost(b); {
		case ca > cb:
			return -1
		case ca < cb:
			return 1
		}
		return 0
	})
	n = max(1, min(n, len(order)))
	shards := make([][]string, n)
	load := make([]float64, n)
	for _, name := range order {
		i := slices.Index(load, slices.Min(load))
		shards[i] = append(shards[i], name)
		load[i] += cost(name)
	}
	return slices.DeleteFunc(shards, func(s []string) bool { return len(s) == 0 })
}
