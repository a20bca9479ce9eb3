package sqlstreams

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goPackages returns the module's package directories (relative, "" for
// the root): every directory with non-test Go files, other modules (bench/)
// and test data aside.
func goPackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != "." {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dir := filepath.ToSlash(filepath.Dir(path))
			if dir == "." {
				dir = ""
			}
			if !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
		return nil
	})
	require.NoError(t, err)
	slices.Sort(dirs)
	return dirs
}

// TestArchitectureMapNamesEveryPackage holds ARCHITECTURE.md's code map to
// the code: every package of the module has a row, and every row names a
// package (or a file of one) that exists.
func TestArchitectureMapNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("ARCHITECTURE.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `([^`]+)`")
	named := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		p := m[1]
		switch {
		case p == "*.go":
			named[""] = true
		case strings.HasSuffix(p, "/"):
			named[strings.TrimSuffix(p, "/")] = true
		case strings.HasSuffix(p, ".go"):
			named[filepath.ToSlash(filepath.Dir(p))] = true
		default:
			t.Errorf("ARCHITECTURE.md names %q: a row names a package directory (ending in /) or a Go file", p)
		}
	}
	pkgs := goPackages(t)
	for _, p := range pkgs {
		require.True(t, named[p], "ARCHITECTURE.md's code map misses package %q", p+"/")
	}
	for p := range named {
		if p == "bench" || p == "prometheus" || p == "otel" || p == "browsertest" { // modules of their own, described in the map
			continue
		}
		require.True(t, slices.Contains(pkgs, p), "ARCHITECTURE.md's code map names %q, which is not a package of the module", p+"/")
	}
}

// TestEveryPackageSaysWhoItIsFor: each package's doc comment says whether
// it is an API for users or the engine's inside (or a test helper).
func TestEveryPackageSaysWhoItIsFor(t *testing.T) {
	fset := token.NewFileSet()
	for _, dir := range goPackages(t) {
		if dir == "" {
			dir = "."
		}
		pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments|parser.PackageClauseOnly)
		require.NoError(t, err)
		var docs []string
		for _, p := range pkgs {
			for _, f := range p.Files {
				if f.Doc != nil {
					docs = append(docs, f.Doc.Text())
				}
			}
		}
		doc := strings.Join(docs, "\n")
		require.Truef(t, strings.Contains(doc, "API for users") || strings.Contains(doc, "tool for users"),
			"package %s: its doc comment must say whether it is an API for users or the engine's inside", dir)
	}
}

// TestToolsUseThePublicAPIOnly: the tools users touch — the CLI, the
// console, sqlstreamstest, the examples and the optional modules — are
// built on the public API (DESIGN §3): none imports internal/store, an
// actor, the engine or the supervisor. The CLI's demo may use the test
// harness's private cluster (internal/pgcluster), and every tool the code
// registry (internal/codes), which only describe.
func TestToolsUseThePublicAPIOnly(t *testing.T) {
	const module = "github.com/c1702965/sqlstreams/"
	forbidden := []string{module + "internal/store", module + "actors/", module + "engine", module + "supervisor"}
	fset := token.NewFileSet()
	for _, root := range []string{"cmd", "console", "sqlstreamstest", "examples", "prometheus", "otel", "browsertest"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				p := strings.Trim(imp.Path.Value, `"`)
				for _, bad := range forbidden {
					if p == bad || strings.HasPrefix(p, bad) && (strings.HasSuffix(bad, "/") || strings.HasPrefix(p, bad+"/")) {
						t.Errorf("%s imports %s: a tool reaches the engine only through the public API", path, p)
					}
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
}

// LineBudget is the most lines a production Go file holds: a file with one
// job fits. The test harnesses (internal/pgcluster, internal/pgtest) and the
// benchmark module are exempt; in actors/claimer, whose state the budget
// keeps in reviewable pieces, test files keep it too.
const LineBudget = 600

// overBudget lists the files under root (a directory of the module, "."
// for all) that break LineBudget.
func overBudget(t *testing.T, root string) []string {
	t.Helper()
	var over []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		path = filepath.ToSlash(path)
		if d.IsDir() {
			switch {
			case path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
				return filepath.SkipDir
			case path == "bench" || path == "internal/pgcluster" || path == "internal/pgtest":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (strings.HasSuffix(path, "_test.go") && !strings.HasPrefix(path, "actors/claimer/")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := strings.Count(string(b), "\n"); n > LineBudget {
			over = append(over, fmt.Sprintf("%s (%d lines)", path, n))
		}
		return nil
	})
	require.NoError(t, err)
	return over
}

func TestEveryFileKeepsTheLineBudget(t *testing.T) {
	require.Empty(t, overBudget(t, "."), "files over %d lines: split them along the seams of what they do", LineBudget)
}

// The budget check sees a file over it.
func TestTheLineBudgetCatchesALongFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "long.go"), []byte("package x\n"+strings.Repeat("\n", LineBudget)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "short.go"), []byte("package x\n"), 0o644))
	require.Len(t, overBudget(t, dir), 1)
}
