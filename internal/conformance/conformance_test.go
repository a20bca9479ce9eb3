package conformance

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCopyMatchesShared holds the repository's copy of the conformance cases
// to the shared folder whenever it sits beside the checkout (as CI lays it
// out): the same files, byte for byte, and no file of either missing from
// the other.
func TestCopyMatchesShared(t *testing.T) {
	shared, ok, err := SharedDir()
	require.NoError(t, err)
	if !ok {
		t.Skipf("%s is not beside this checkout; the repository's copy is used as is", shared)
	}
	local, err := Dir()
	require.NoError(t, err)
	names := func(dir string) []string {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			if !e.IsDir() {
				out = append(out, e.Name())
			}
		}
		slices.Sort(out)
		return out
	}
	want := slices.Clone(Files)
	slices.Sort(want)
	require.Equal(t, names(shared), names(local),
		"testdata/conformance must hold exactly the files of %s: copy them (cp %s/* testdata/conformance/)", shared, shared)
	require.Equal(t, want, names(local), "conformance.Files must list every file of testdata/conformance")
	for _, name := range Files {
		a, err := os.ReadFile(filepath.Join(shared, name))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(local, name))
		require.NoError(t, err)
		require.Equal(t, string(a), string(b),
			"testdata/conformance/%s differs from %s/%s: the shared cases are the spec; copy them over", name, shared, name)
	}
}

func TestReadFindsTheCopy(t *testing.T) {
	for _, name := range Files {
		s, err := Read(name)
		require.NoError(t, err)
		require.NotEmpty(t, s, name)
	}
}
