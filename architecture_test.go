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
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		var docs []string
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.PackageClauseOnly)
			require.NoError(t, err)
			if f.Doc != nil {
				docs = append(docs, f.Doc.Text())
			}
		}
		doc := strings.Join(docs, "\n")
		require.Truef(t, strings.Contains(doc, "API for users") || strings.Contains(doc, "tool for users"),
			"package %s: its doc comment must say whether it is an API for users or the engine's inside", dir)
	}
}

// module is this module's import path.
const module = "github.com/c1702965/sqlstreams"

// moduleImports parses (go/parser, ImportsOnly) every production Go file
// under root and returns, per package directory relative to root ("" for
// the root package; the optional modules' directories too), the packages of
// this module it imports, as directories; and the files (relative to root)
// that import archivedClock. Test files are not read: tests drive actors'
// steps directly and wire them as the engine does (DESIGN §3).
func moduleImports(t *testing.T, root string) (imports map[string][]string, clockFiles []string) {
	t.Helper()
	imports = map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		if dir == "." {
			dir = ""
		}
		if _, ok := imports[dir]; !ok {
			imports[dir] = nil // a package that imports nothing of the module is listed too
		}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if p == archivedClock {
				clockFiles = append(clockFiles, filepath.ToSlash(filepath.Join(rel, filepath.Base(path))))
			}
			if p != module && !strings.HasPrefix(p, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			if !slices.Contains(imports[dir], to) {
				imports[dir] = append(imports[dir], to)
			}
		}
		return nil
	})
	require.NoError(t, err)
	return imports, clockFiles
}

// archivedClock is archived upstream: it stays behind internal/clocks, so
// that a maintained clock can replace it there (decision 0088).
const archivedClock = "github.com/benbjohnson/clock"

// clockHomes are the production files that may import archivedClock: the
// adapter, and the root's clock.go, whose ClockOf names it in its signature.
var clockHomes = []string{"internal/clocks/adapt.go", "clock.go"}

// The tools users touch: the CLI, the console, sqlstreamstest, the examples
// and the optional modules (the benchmark harness included).
var toolDirs = []string{"cmd", "console", "sqlstreamstest", "examples", "prometheus", "otel", "browsertest", "bench"}

// under reports whether package directory dir is root or inside it.
func under(dir, root string) bool { return dir == root || strings.HasPrefix(dir, root+"/") }

// actorOf is the actor a package directory belongs to ("claimer" for
// actors/claimer), or "".
func actorOf(dir string) string {
	if !under(dir, "actors") {
		return ""
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(dir, "actors/"), "/")
	return name
}

// An importViolation is one import that breaks a rule.
type importViolation struct {
	from, to, rule string
}

func (v importViolation) String() string {
	from := v.from
	if from == "" {
		from = "the root package"
	}
	return fmt.Sprintf("%s imports %s: %s", from, v.to, v.rule)
}

// The dependency rules (DESIGN §3, ARCHITECTURE.md "Import rules").
const (
	ruleActors = "no actor imports another actor's package (what two actors exchange is a type in a small package below both, in internal/)"
	ruleEngine = "only engine/ (and the simulator, sim/) reach the actors: the root package goes through engine/"
	ruleTools  = "a tool reaches the engine only through the public API (no internal/store, actors/, engine/ or supervisor/)"
	ruleStore  = "internal/store imports nothing above it: only packages that import nothing of the module but internal/clocks"
	ruleClock  = "only internal/clocks' adapter (and the root's ClockOf) import " + archivedClock + ": every other package takes an internal/clocks.Clock"
)

// importViolations checks imports and the files importing archivedClock
// (moduleImports) against the rules.
func importViolations(imports map[string][]string, clockFiles []string) []importViolation {
	var out []importViolation
	for _, f := range clockFiles {
		if !slices.Contains(clockHomes, f) {
			out = append(out, importViolation{from: f, to: archivedClock, rule: ruleClock})
		}
	}
	for from, tos := range imports {
		for _, to := range tos {
			bad := func(rule string) { out = append(out, importViolation{from: from, to: to, rule: rule}) }
			fromActor, toActor := actorOf(from), actorOf(to)
			switch {
			case fromActor != "" && toActor != "" && fromActor != toActor:
				bad(ruleActors)
			case toActor != "" && fromActor == "" && !under(from, "engine") && !under(from, "sim"):
				bad(ruleEngine)
			}
			if slices.ContainsFunc(toolDirs, func(d string) bool { return under(from, d) }) &&
				(under(to, "internal/store") || under(to, "actors") || under(to, "engine") || under(to, "supervisor")) {
				bad(ruleTools)
			}
			// internal/clocks imports nothing of the module either: it stands
			// where the third-party clock it wraps stood.
			if from == "internal/store" && slices.ContainsFunc(imports[to], func(p string) bool { return p != "internal/clocks" }) {
				bad(ruleStore)
			}
		}
	}
	slices.SortFunc(out, func(a, b importViolation) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// TestImportRulesHold: the code keeps DESIGN §3's dependency rules, read
// from its imports.
func TestImportRulesHold(t *testing.T) {
	for _, v := range importViolations(moduleImports(t, ".")) {
		t.Error(v)
	}
}

// TestToolsUseThePublicAPIOnly: the tools users touch — the CLI, the
// console, sqlstreamstest, the examples and the optional modules — are
// built on the public API (DESIGN §3): none imports internal/store, an
// actor, the engine or the supervisor. The CLI's demo may use the test
// harness's private cluster (internal/pgcluster), and every tool the code
// registry (internal/codes), which only describe.
func TestToolsUseThePublicAPIOnly(t *testing.T) {
	for _, v := range importViolations(moduleImports(t, ".")) {
		if v.rule == ruleTools {
			t.Error(v)
		}
	}
}

// The import check sees each kind of bad import, in a tree written for it;
// test files and the imports the rules allow pass.
func TestTheImportRulesCatchBadImports(t *testing.T) {
	root := t.TempDir()
	write := func(path, pkg string, imports ...string) {
		t.Helper()
		src := "package " + pkg + "\n"
		for _, imp := range imports {
			switch imp {
			case archivedClock: // not of this module
			case "":
				imp = module
			default:
				imp = module + "/" + imp
			}
			src += "import _ \"" + imp + "\"\n"
		}
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, path), []byte(src), 0o644))
	}
	write("internal/leaf/leaf.go", "leaf")
	write("internal/exchange/exchange.go", "exchange", "internal/leaf")
	write("actors/a/a.go", "a", "actors/b", "internal/exchange") // bad: an actor imports another
	write("actors/a/a_test.go", "a", "actors/b")                 // a test may
	write("actors/b/b.go", "b", "internal/exchange")
	write("engine/engine.go", "engine", "actors/a", "actors/b")
	write("sim/sim.go", "sim", "actors/a", "engine")
	write("client.go", "sqlstreams", "engine", "actors/b") // bad: the root reaches an actor
	write("internal/timed/timed.go", "timed", "internal/clocks")
	write("internal/store/store.go", "store", "internal/leaf", "internal/timed", "engine", "internal/exchange") // bad twice: not leaves
	write("cmd/tool/main.go", "main", "", "internal/store")                                                     // bad: a tool reaches the store
	write("prometheus/collector.go", "prometheus", "", "engine")                                                // bad: an optional module reaches the engine
	write("internal/clocks/adapt.go", "clocks", archivedClock)                                                  // the adapter may
	write("internal/clocks/mock.go", "clocks", archivedClock)                                                   // bad: the rest of clocks may not
	write("clock.go", "sqlstreams", archivedClock)                                                              // ClockOf may
	write("config.go", "sqlstreams", archivedClock)                                                             // bad: no other file of the root
	write("actors/b/wait.go", "b", archivedClock)                                                               // bad: an actor takes a clocks.Clock
	write("actors/b/wait_test.go", "b", archivedClock)                                                          // a test may

	var got []string
	for _, v := range importViolations(moduleImports(t, root)) {
		got = append(got, v.String())
	}
	require.Equal(t, []string{
		"actors/a imports actors/b: " + ruleActors,
		"actors/b/wait.go imports " + archivedClock + ": " + ruleClock,
		"cmd/tool imports internal/store: " + ruleTools,
		"config.go imports " + archivedClock + ": " + ruleClock,
		"internal/clocks/mock.go imports " + archivedClock + ": " + ruleClock,
		"internal/store imports engine: " + ruleStore,
		"internal/store imports internal/exchange: " + ruleStore,
		"prometheus imports engine: " + ruleTools,
		"the root package imports actors/b: " + ruleEngine,
	}, got)
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

// importGroupProblems lists the Go files under root (other modules' too)
// whose imports are not in goimports' two groups: the standard library,
// then everything else (third-party and this module), each in one block.
func importGroupProblems(t *testing.T, root string) []string {
	t.Helper()
	var bad []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		var groups [][]bool // per group, whether each import is the standard library's
		last := -1
		for _, imp := range f.Imports {
			line := fset.Position(imp.Pos()).Line
			if imp.Doc != nil {
				line = fset.Position(imp.Doc.Pos()).Line
			}
			if last < 0 || line > last+1 {
				groups = append(groups, nil)
			}
			last = fset.Position(imp.End()).Line
			p := strings.Trim(imp.Path.Value, `"`)
			first, _, _ := strings.Cut(p, "/")
			groups[len(groups)-1] = append(groups[len(groups)-1], !strings.Contains(first, "."))
		}
		ok := len(groups) <= 2
		for i, g := range groups {
			std := slices.Contains(g, true)
			other := slices.Contains(g, false)
			ok = ok && !(std && other) && !(i == 1 && std) && !(i == 0 && len(groups) == 2 && other)
		}
		if !ok {
			bad = append(bad, filepath.ToSlash(path))
		}
		return nil
	})
	require.NoError(t, err)
	return bad
}

// TestImportsAreInGoimportsGroups: every Go file of the repository (its
// modules and tests included) imports the standard library in one group,
// then everything else in another (`make vet` runs goimports for the rest
// of its formatting).
func TestImportsAreInGoimportsGroups(t *testing.T) {
	require.Empty(t, importGroupProblems(t, "."), "regroup these files' imports: standard library, a blank line, the rest (goimports -w after joining the groups)")
}

// The grouping check sees a file whose groups are mixed or out of order.
func TestTheImportGroupCheckCatchesAMixedGroup(t *testing.T) {
	dir := t.TempDir()
	write := func(name, imports string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("package x\n\nimport (\n"+imports+")\n"), 0o644))
	}
	write("good.go", "\t\"fmt\"\n\t\"os\"\n\n\t\"github.com/a/b\"\n\t\"github.com/c1702965/sqlstreams\"\n")
	write("onlyother.go", "\t\"github.com/a/b\"\n")
	write("mixed.go", "\t\"fmt\"\n\t\"github.com/a/b\"\n")
	write("three.go", "\t\"fmt\"\n\n\t\"github.com/a/b\"\n\n\t\"github.com/c1702965/sqlstreams\"\n")
	write("reversed.go", "\t\"github.com/a/b\"\n\n\t\"fmt\"\n")
	var got []string
	for _, p := range importGroupProblems(t, dir) {
		got = append(got, filepath.Base(p))
	}
	require.ElementsMatch(t, []string{"mixed.go", "three.go", "reversed.go"}, got)
}
