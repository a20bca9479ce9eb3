package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// A claim of uniform rows allocates little more than it holds, and every
// copy is its own bytes: equal to its source, with no capacity to append
// into a neighbour.
func TestPayloadSlabSizesForTheRowsToCome(t *testing.T) {
	const limit = 1000
	payload := bytes.Repeat([]byte("x"), 1024)
	options := []byte(`{"timeout":"5s"}`)
	for _, c := range []struct {
		name             string
		options, headers []byte
	}{
		{"payloads only", nil, nil},
		{"with options and headers", options, []byte(`{"h":"v"}`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s payloadSlab
			held := 0
			for i := range limit {
				p, o, h := s.row(payload, c.options, c.headers, limit-i)
				require.Equal(t, payload, p)
				require.Equal(t, len(p), cap(p))
				require.Equal(t, c.options, o)
				require.Equal(t, c.headers, h)
				held += len(p) + len(o) + len(h)
			}
			require.LessOrEqual(t, s.allocated, held*9/8, "slab bytes allocated for %d bytes held", held)
		})
	}
}

// Rows of any sizes keep their bytes: a copy never changes when later rows
// fill the slab or start a new one.
func TestPayloadSlabKeepsEveryRow(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var s payloadSlab
	var want, got [][]byte
	const rows = 500
	for i := range rows {
		raw := make([]byte, rng.IntN(5000))
		for j := range raw {
			raw[j] = byte(rng.IntN(256))
		}
		p, o, h := s.row(raw, nil, []byte(fmt.Sprint(i)), rows-i)
		require.Nil(t, o)
		require.Equal(t, fmt.Sprint(i), string(h))
		want, got = append(want, raw), append(got, p)
	}
	for i := range want {
		require.Equal(t, want[i], got[i], "row %d (seed %d)", i, seed)
	}
	p, _, _ := s.row(nil, nil, nil, 1)
	require.Nil(t, p, "a NULL payload stays nil")
}
