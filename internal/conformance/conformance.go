// Package conformance finds the binding and routing-key conformance cases for
// tests. The cases every implementation must pass live in the project's
// shared folder (../shared/conformance beside a checkout); the repository
// keeps an identical copy in testdata/conformance, so that a clone of this
// repository alone runs its tests, and TestCopyMatchesShared fails when the
// two drift apart. Tests read the copy.
//
// It is a test helper: nothing outside _test.go files imports it.
//
// It is a test helper, not an API for users.
package conformance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Files are the conformance files the repository keeps a copy of.
var Files = []string{"bindings.tsv", "invalid-patterns.txt", "invalid-routing-keys.txt"}

// root returns the module's root: the nearest directory at or above the
// working directory (a test's package directory) holding go.mod.
func root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("conformance: no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// Dir returns the repository's copy of the cases: testdata/conformance at
// the module root.
func Dir() (string, error) {
	r, err := root()
	if err != nil {
		return "", err
	}
	return filepath.Join(r, "testdata", "conformance"), nil
}

// Read returns one file of the repository's copy.
func Read(name string) (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("conformance: %w", err)
	}
	return string(b), nil
}

// SharedDir returns ../shared/conformance beside the module root, and
// whether it exists (a clone of the repository alone does not have it).
func SharedDir() (string, bool, error) {
	r, err := root()
	if err != nil {
		return "", false, err
	}
	dir := filepath.Join(r, "..", "shared", "conformance")
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return dir, false, nil
	}
	if err != nil {
		return dir, false, err
	}
	return dir, fi.IsDir(), nil
}
