package main

import (
	"bytes"
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
{"Action":"output","Package":"q","Output":"ok  \tq\t0.1s\n"}
{"Action":"pass","Package":"q","Test":"TestD","Elapsed":0.1}
{"Action":"pass","Package":"q","Elapsed":0.1}
`

// The filter prints what go test prints without -v: a failed test's
// output and the packages' lines, not a passing test's; it fails the run.
func TestTheFilterPrintsFailuresAndPackageLines(t *testing.T) {
	var out bytes.Buffer
	ok, err := filter(strings.NewReader(run), &out)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, "    b_test.go:9: it broke\nFAIL\tp\t3.6s\nok  \tq\t0.1s\n", out.String())

	ok, err = filter(strings.NewReader(`{"Action":"pass","Package":"q","Elapsed":0.1}`+"\n"), &out)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = filter(strings.NewReader("# a build error\n"), &out)
	require.NoError(t, err)
	require.False(t, ok, "no result at all is a failure")

	out.Reset()
	ok, err = filter(strings.NewReader(`{"ImportPath":"r","Action":"build-output","Output":"r/x.go:1: undefined: y\n"}
{"Action":"fail","Package":"r","Elapsed":0,"FailedBuild":"r"}
`), &out)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, "r/x.go:1: undefined: y\n", out.String(), "a build's errors are printed")
}

// The slowest top-level tests come first; subtests are their parents'.
func TestSlowestListsTopLevelTestsByTime(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, listSlowest(strings.NewReader(run), &out, 2))
	require.Equal(t, "    2.50s  TestA  (p)\n    1.00s  TestB  (p)\n", out.String())
}
