package codes

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite docs/codes.md from the registry")

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "go.mod not found")
		dir = parent
	}
}

var idRe = regexp.MustCompile(`^SQL\d{4}$`)

func TestRegistryIsWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range All() {
		require.Regexp(t, idRe, c.ID)
		require.False(t, seen[c.ID], "%s registered twice", c.ID)
		seen[c.ID] = true
		require.NotEmpty(t, c.Title, c.ID)
		require.NotEmpty(t, c.Meaning, c.ID)
		require.NotEmpty(t, c.Remedy, c.ID)
		require.True(t, c.Level >= 4, "%s: codes are for WARN and ERROR lines", c.ID)
		got, ok := Lookup(strings.ToLower(c.ID))
		require.True(t, ok)
		require.Equal(t, c.ID, got.ID)
	}
	c, ok := Lookup("59")
	require.True(t, ok)
	require.Equal(t, "SQL0059", c.ID, "SQL0059 keeps its number")
	_, ok = Lookup("SQL9999")
	require.False(t, ok)
}

// TestDocsAreCurrent fails when docs/codes.md is not what the registry
// generates; go test ./internal/codes -update rewrites it.
func TestDocsAreCurrent(t *testing.T) {
	path := filepath.Join(moduleRoot(t), "docs", "codes.md")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(Markdown()), 0o644))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err, "docs/codes.md is generated: go test ./internal/codes -update")
	require.Equal(t, Markdown(), string(b), "docs/codes.md is stale: go test ./internal/codes -update")
}

// TestEveryWarningGoesThroughACode reads the module's Go sources (tests and
// the separate bench module aside) and fails on a WARN or ERROR logged any
// other way than through a Code, and on a code named in the source that the
// registry lacks.
func TestEveryWarningGoesThroughACode(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	var bad []string
	literal := regexp.MustCompile(`SQL\d{4}`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir // hidden folders, test data, other modules (bench/)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		inCodes := filepath.Dir(rel) == filepath.Join("internal", "codes")
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || inCodes || len(n.Args) == 0 {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "http" {
					return true // http.Error writes a response, it logs nothing
				}
				switch sel.Sel.Name {
				case "Warn", "Error", "WarnContext", "ErrorContext":
					bad = append(bad, fset.Position(n.Pos()).String()+": "+sel.Sel.Name+" called directly; log through a codes.Code")
				case "Log", "LogAttrs":
					for _, a := range n.Args {
						if s, ok := a.(*ast.SelectorExpr); ok && (s.Sel.Name == "LevelWarn" || s.Sel.Name == "LevelError") {
							bad = append(bad, fset.Position(n.Pos()).String()+": a WARN or ERROR logged directly; log through a codes.Code")
						}
					}
				}
			case *ast.BasicLit:
				if n.Kind != token.STRING || inCodes {
					return true
				}
				for _, id := range literal.FindAllString(n.Value, -1) {
					if _, ok := Lookup(id); !ok {
						bad = append(bad, fset.Position(n.Pos()).String()+": "+id+" is not in the registry")
					}
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, bad)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
