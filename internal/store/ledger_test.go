package store

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The binding declaration ledger is append-only (seed 0511): no statement
// that names it may update it, and only the deferred cleanup pass may delete
// from it (superseded waiting rows). This reads the package's own SQL.
func TestNoStatementUpdatesTheLedger(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	literal := regexp.MustCompile("(?s)`[^`]*`")
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, stmt := range literal.FindAllString(string(src), -1) {
			if !strings.Contains(stmt, "_binding_declaration") {
				continue
			}
			checked++
			require.NotRegexp(t, `(?i)\bUPDATE\b`, stmt, "%s: a statement updates the ledger:\n%s", f, stmt)
			if strings.HasPrefix(stmt, "`-- store.PruneBindingLedger") {
				// The deferred cleanup pass: it may delete, and only superseded
				// waiting rows.
				require.Contains(t, stmt, "b.status = 'waiting'", "the prune deletes waiting rows only")
				continue
			}
			require.NotRegexp(t, `(?i)\bDELETE\b[^;]*_binding_declaration`, stmt, "%s: a statement deletes from the ledger:\n%s", f, stmt)
		}
	}
	require.GreaterOrEqual(t, checked, 4, "the ledger's statements were found")
}
