package topic_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/c1702965/sqlstreams/internal/conformance"
	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/stretchr/testify/require"
)

// conformanceDir locates the repository's copy of the shared cases
// (testdata/conformance, held identical to ../shared/conformance by
// internal/conformance's tests), so a clone of this repository alone runs
// them.
func conformanceDir(t *testing.T) string {
	t.Helper()
	dir, err := conformance.Dir()
	require.NoError(t, err)
	return dir
}

// readLines yields non-blank, non-comment lines with their line numbers, so
// failures can point at the exact case in the shared file.
func readLines(t *testing.T, path string) (lines []string, numbers []int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err, "open %s", path)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, line)
		numbers = append(numbers, n)
	}
	require.NoError(t, sc.Err(), "read %s", path)
	require.NotEmpty(t, lines, "%s has no cases; a silently empty file would make this test vacuous", path)
	return lines, numbers
}

// readBarred unwraps "|value|" lines; bars are used so that spaces and the
// empty string are visible in the shared file.
func readBarred(t *testing.T, name string) []string {
	t.Helper()
	path := filepath.Join(conformanceDir(t), name)
	lines, numbers := readLines(t, path)
	values := make([]string, len(lines))
	for i, line := range lines {
		require.True(t, len(line) >= 2 && line[0] == '|' && line[len(line)-1] == '|',
			"%s:%d: value must be written between bars: %q", name, numbers[i], line)
		values[i] = line[1 : len(line)-1]
	}
	return values
}

func TestConformanceBindings(t *testing.T) {
	path := filepath.Join(conformanceDir(t), "bindings.tsv")
	lines, numbers := readLines(t, path)
	for i, line := range lines {
		fields := strings.Split(line, "\t")
		require.Len(t, fields, 3, "bindings.tsv:%d: want pattern<TAB>key<TAB>expected, got %q", numbers[i], line)
		pattern, key, expected := fields[0], fields[1], fields[2]
		if key == "(none)" {
			key = ""
		}
		var want bool
		switch expected {
		case "match":
			want = true
		case "no-match":
		default:
			t.Fatalf("bindings.tsv:%d: expected must be match or no-match, got %q", numbers[i], expected)
		}

		require.NoError(t, topic.ValidatePattern(pattern), "bindings.tsv:%d", numbers[i])
		require.NoError(t, topic.ValidateRoutingKey(key), "bindings.tsv:%d", numbers[i])
		require.Equal(t, want, topic.Match(pattern, key), "bindings.tsv:%d: Match(%q, %q)", numbers[i], pattern, key)

		p, err := topic.Compile(pattern)
		require.NoError(t, err)
		require.Equal(t, want, p.Match(key), "bindings.tsv:%d: Compile(%q).Match(%q)", numbers[i], pattern, key)
		require.Equal(t, want, topic.MatchAny([]string{"zzz.never", pattern}, key), "bindings.tsv:%d: MatchAny", numbers[i])
		require.Equal(t, want, refMatchStrings(pattern, key), "bindings.tsv:%d: reference matcher disagrees with the file", numbers[i])
	}
}

func TestConformanceInvalidPatterns(t *testing.T) {
	for _, p := range readBarred(t, "invalid-patterns.txt") {
		err := topic.ValidatePattern(p)
		require.Error(t, err, "pattern %q must be rejected", p)
		require.True(t, errors.Is(err, topic.ErrInvalidPattern), "pattern %q: %v does not wrap ErrInvalidPattern", p, err)
		require.Contains(t, err.Error(), strconv.Quote(p), "error must name the pattern")

		_, cerr := topic.Compile(p)
		require.ErrorIs(t, cerr, topic.ErrInvalidPattern)
		require.False(t, topic.Match(p, "a.b"), "invalid pattern %q must match nothing", p)
	}
}

func TestConformanceInvalidRoutingKeys(t *testing.T) {
	for _, k := range readBarred(t, "invalid-routing-keys.txt") {
		err := topic.ValidateRoutingKey(k)
		require.Error(t, err, "routing key %q must be rejected", k)
		require.True(t, errors.Is(err, topic.ErrInvalidRoutingKey), "key %q: %v does not wrap ErrInvalidRoutingKey", k, err)
		require.Contains(t, err.Error(), strconv.Quote(k), "error must name the routing key")
	}
}
