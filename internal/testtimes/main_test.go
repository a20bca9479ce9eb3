package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const run = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (2.50s)\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":2.5}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: it broke\n"}
{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    inside\n"}
{"Action":"pass","Package":"p","Test":"TestB/sub","Elapsed":9}
{"Action":"fail","Package":"p","Test":"TestB","Elapsed":1}
{"Action":"skip","Package":"p","Test":"TestC","Elapsed":0}
{"Action":"output","Package":"p","Output":"FAIL\tp\t3.6s\n"}
{"Action":"fail","Package":"p","Elapsed":3.6}
{"Action":"output","Package":"q","Output":"PASS\n"}
{"Action":"output","Package":"q","Output":"ok  \tq\t0.1s\n"}
{"Action":"pass","Package":"q","Test":"TestD","Elapsed":0.1}
{"Action":"pass","Package":"q","Elapsed":0.1}
`

func filtered(t *testing.T, in string) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	f := newFilter(&out)
	for _, l := range strings.Split(strings.TrimSuffix(in, "\n"), "\n") {
		f.line([]byte(l))
	}
	return out.String(), f.ok()
}

// The filter prints what go test prints without -v: a failed test's
// output and the packages' lines, not a passing test's; it fails the run.
func TestTheFilterPrintsFailuresAndPackageLines(t *testing.T) {
	out, ok := filtered(t, run)
	require.False(t, ok)
	require.Equal(t, "    b_test.go:9: it broke\nFAIL\tp\t3.6s\nok  \tq\t0.1s\n", out)

	_, ok = filtered(t, `{"Action":"pass","Package":"q","Elapsed":0.1}`)
	require.True(t, ok)
	_, ok = filtered(t, "# a build error")
	require.False(t, ok, "no result at all is a failure")

	out, ok = filtered(t, `{"ImportPath":"r","Action":"build-output","Output":"r/x.go:1: undefined: y\n"}
{"Action":"fail","Package":"r","Elapsed":0,"FailedBuild":"r"}`)
	require.False(t, ok)
	require.Equal(t, "r/x.go:1: undefined: y\n", out, "a build's errors are printed")
}

// The slowest top-level tests come first; subtests are their parents'.
func TestSlowestListsTopLevelTestsByTime(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, listSlowest(strings.NewReader(run), &out, 2))
	require.Equal(t, "    2.50s  TestA  (p)\n    1.00s  TestB  (p)\n", out.String())
}

// The shards are balanced by the last run's times, the longest tests
// first; a test it did not see counts as its median.
func TestShardsAreBalancedByTheLastRun(t *testing.T) {
	last := []timing{{10, "p", "TestSlow"}, {4, "p", "TestA"}, {3, "p", "TestB"}, {3, "p", "TestC"}, {1, "p", "TestD"}, {50, "other", "TestNew"}}
	shards := balance([]string{"TestA", "TestB", "TestC", "TestD", "TestNew", "TestSlow"}, "p", last, 2)
	require.Equal(t, [][]string{{"TestSlow", "TestNew"}, {"TestA", "TestB", "TestC", "TestD"}}, shards) // 13 s and 11 s
	require.Len(t, balance([]string{"TestA"}, "p", nil, 3), 1, "no empty shard")
}

// The tests of a package are its Test, Example and Fuzz functions, not
// TestMain nor a helper whose name only begins with Test.
func TestTestNamesAreWhatGoTestRuns(t *testing.T) {
	dir := t.TempDir()
	src := `package x
import "testing"
func TestMain(m *testing.M) {}
func TestA(t *testing.T) {}
func Testimony() {}
func Example() {}
func Example_b() {}
func FuzzC(f *testing.F) {}
type s struct{}
func (s) TestD(t *testing.T) {}
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x_test.go"), []byte(src), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x.go"), []byte("package x\nfunc TestE() {}\n"), 0o644))
	names, err := testNames(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"Example", "Example_b", "FuzzC", "TestA"}, names)
}
