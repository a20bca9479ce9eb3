package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
