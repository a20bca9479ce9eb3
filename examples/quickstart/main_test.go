package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The quick start runs against the test database, prints what it consumed
// and stops by itself.
func TestQuickstartRuns(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), pgtest.URL(), pgtest.Schema(t), 5, &out))
	text := out.String()
	require.Contains(t, text, "produced 5 orders\n")
	for _, id := range []string{"o-1", "o-2", "o-3", "o-4", "o-5"} {
		require.Contains(t, text, "billing "+id+": 1250 cents\n")
	}
	require.True(t, strings.HasSuffix(text, "consumed 5 orders; stopped\n"), text)
	require.ErrorContains(t, run(context.Background(), "", "x", 1, &out), "set SQLSTREAMS_DATABASE_URL")
}

// Built and run as a user would run it.
func TestQuickstartAsABinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program: skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	cmd := exec.Command(bin, "-schema", pgtest.Schema(t), "-n", "3")
	cmd.Env = append(os.Environ(), "SQLSTREAMS_DATABASE_URL="+pgtest.URL())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "consumed 3 orders; stopped")
}

// No Go snippet of the README hands a database URL from the environment
// straight to pgx: unset, pgx connects to libpq's default server (the
// local socket, the user's own database) and NewClient creates its tables
// there. The usage snippet refuses an empty URL, as run does (issue 60).
func TestTheREADMEsSnippetsRefuseAnEmptyURL(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, blocks)
	straight := regexp.MustCompile(`(ParseConfig|pgxpool\.New|pgx\.Connect)\([^)]*os\.Getenv`)
	checked := false
	for _, b := range blocks {
		require.NotRegexp(t, straight, b[1], "a README snippet passes os.Getenv to pgx unchecked")
		if strings.Contains(b[1], `os.Getenv("SQLSTREAMS_DATABASE_URL")`) {
			require.Regexp(t, `(?s)url := os\.Getenv\("SQLSTREAMS_DATABASE_URL"\)\s*\n\s*if url == "" \{.*pgxpool\.ParseConfig\(url\)`, b[1])
			checked = true
		}
	}
	require.True(t, checked, "the usage snippet reads SQLSTREAMS_DATABASE_URL")
}
