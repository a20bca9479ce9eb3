package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every statement starts with a comment naming its Go caller (visible in
// pg_stat_statements): the per-stream templates, and every SQL text literal
// of the package (and of storetest) that starts a statement.
func TestEveryStatementNamesItsCaller(t *testing.T) {
	for i, tmpl := range templates {
		require.True(t, strings.HasPrefix(tmpl, "-- store."), "per-stream statement %d starts without its caller's name:\n%s", i, tmpl)
	}
	statement := regexp.MustCompile(`(?s)^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|LISTEN)\s`)
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range []string{".", "storetest"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			file, err := parser.ParseFile(fset, f, src, 0)
			require.NoError(t, err)
			ast.Inspect(file, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				text, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				// A per-stream fragment ({s}) is composed into the templates
				// checked above.
				if statement.MatchString(text) && !strings.Contains(text, "{s}") {
					t.Errorf("%s: a statement starts without a comment naming its caller:\n%s", fset.Position(lit.Pos()), text)
				}
				if strings.HasPrefix(text, "-- ") {
					checked++
				}
				return true
			})
		}
	}
	require.Greater(t, checked, 40, "the package's statements were found")
}
