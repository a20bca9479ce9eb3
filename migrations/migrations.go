// Package migrations holds the versioned SQL that builds a sqlstreams schema.
//
// Two sets live here. schema/ builds the shared tables once per schema
// (ClientConfig.Schema); stream/ is the template of one stream's own tables,
// applied at Stream.Register with the stream's table prefix. Both are embedded
// so a binary carries the exact SQL it was tested with, and both are applied
// in version order by internal/store under an advisory lock, which is what
// makes two processes migrating at once safe.
//
// It is part of the engine's inside, not an API for users.
package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

//go:embed schema/*.sql stream/*.sql
var files embed.FS

// Migration is one versioned SQL file. Its body holds placeholders that the
// store replaces with quoted identifiers: {{schema}} and, in stream templates,
// {{t}} (the stream's table prefix).
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Schema returns the shared-table migrations in version order.
func Schema() ([]Migration, error) { return load("schema") }

// Stream returns the per-stream table templates in version order.
func Stream() ([]Migration, error) { return load("stream") }

func load(dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations %s: %w", dir, err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("migration file %s/%s: want NNNN_name.sql", dir, name)
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration file %s/%s: version: %w", dir, name, err)
		}
		body, err := fs.ReadFile(files, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migration %s/%s: %w", dir, name, err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := range out {
		if out[i].Version != i+1 {
			return nil, fmt.Errorf("migrations %s: version %d where %d was expected", dir, out[i].Version, i+1)
		}
	}
	return out, nil
}
