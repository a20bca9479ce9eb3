package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// snakeCase is the one style of every key in -o json.
var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// keysNotSnakeCase walks a decoded JSON value and returns the paths of the
// keys that are not snake_case. A message's headers are the producer's
// names, not ours: their keys are skipped.
func keysNotSnakeCase(v any, path string) []string {
	var bad []string
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if !snakeCase.MatchString(k) {
				bad = append(bad, path+"."+k)
			}
			if k == "headers" {
				continue
			}
			bad = append(bad, keysNotSnakeCase(c, path+"."+k)...)
		}
	case []any:
		for i, c := range x {
			bad = append(bad, keysNotSnakeCase(c, path+"["+strconv.Itoa(i)+"]")...)
		}
	}
	return bad
}

// subcommands returns the subcommands a verb lists when given one it does
// not know (none for a verb without subcommands).
func subcommands(t *testing.T, verb string) []string {
	t.Helper()
	var out bytes.Buffer
	err := runCtx(context.Background(), []string{verb, "no-such-subcommand"}, &out)
	if err == nil {
		return nil
	}
	m := regexp.MustCompile(`unknown subcommand "no-such-subcommand" \(one of: ([a-z, ]+)\)`).FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	return strings.Split(m[1], ", ")
}

// Every verb that prints output takes -o json, and every key it prints,
// at any depth, is snake_case (issue 60: `migrate status -o json` mixed
// "Stream" and "Applied" with snake_case). The list of invocations is held
// to the verbs: a verb or subcommand whose -h offers -o must be in it.
func TestEveryVerbsJSONIsSnakeCase(t *testing.T) {
	f := newOpsFixture(t, 3, 1)
	id := strconv.FormatInt(f.dead[0], 10)
	file := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"message":{"timeout":"10s"},"delivery_log":"all"}`), 0o600))
	runs := map[string][]string{
		"streams ls":      {"streams", "ls"},
		"streams rm":      {"streams", "rm", "orders"},
		"groups ls":       {"groups", "ls"},
		"groups describe": {"groups", "describe", "orders"},
		"groups seek":     {"groups", "seek", "orders", "billing", "-to-beginning"},
		"groups declare":  {"groups", "declare", "orders", "billing", "-f", file},
		"groups rm":       {"groups", "rm", "orders", "billing"},
		"inspect":         {"inspect", "orders", "billing"},
		"bindings":        {"bindings", "orders", "billing"},
		"dlq ls":          {"dlq", "ls", "orders", "billing"},
		"dlq show":        {"dlq", "show", "orders", "billing", id},
		"dlq redrive":     {"dlq", "redrive", "orders", "billing", id, "-dry-run"},
		"migrate status":  {"migrate", "status"},
		"migrate up":      {"migrate", "up"},
		"migrate sql":     {"migrate", "sql"},
		"explain":         {"explain", "SQL0059"},
	}
	for name, args := range runs {
		args = append(args, "-o", "json")
		if args[0] != "explain" {
			args = append(args, "-schema", f.schema)
		}
		var out bytes.Buffer
		require.NoError(t, runCtx(context.Background(), args, &out), name)
		var v any
		require.NoError(t, json.Unmarshal(out.Bytes(), &v), "%s prints JSON:\n%s", name, out.String())
		require.Empty(t, keysNotSnakeCase(v, name), "%s: keys not in snake_case", name)
	}
	for _, verb := range verbs {
		subs := subcommands(t, verb)
		if len(subs) == 0 {
			subs = []string{""}
		}
		for _, sub := range subs {
			name := strings.TrimSpace(verb + " " + sub)
			var help bytes.Buffer
			require.NoError(t, runCtx(context.Background(), strings.Fields(name+" -h"), &help), name)
			if strings.Contains(help.String(), "\n  -o ") {
				require.Contains(t, runs, name, "%s takes -o: its JSON must be checked here", name)
			}
		}
	}
}

// `sqlstreams -h` names every subcommand of every verb (issue 60: it left
// out streams rm and groups rm).
func TestUsageNamesEverySubcommand(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runCtx(context.Background(), []string{"-h"}, &out))
	lines := map[string]string{} // a verb's line, with the lines that continue it ("| ...")
	last := ""
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "sqlstreams":
			last = f[1]
			lines[last] = l
		case len(f) > 0 && f[0] == "|" && last != "":
			lines[last] += " " + l
		default:
			last = ""
		}
	}
	for _, verb := range verbs {
		line, ok := lines[verb]
		require.True(t, ok, "usage has no line for %s", verb)
		for _, sub := range subcommands(t, verb) {
			require.Regexp(t, `(^|[\s|\[])`+regexp.QuoteMeta(sub)+`([\s|\]]|$)`, line, "usage's %s line names %s", verb, sub)
		}
	}
}
