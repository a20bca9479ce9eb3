package claimer

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

func TestBooksRandomSequences(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	base := rand.Uint64()
	if v := os.Getenv("SQLSTREAMS_BOOKS_SEED"); v != "" {
		var err error
		base, err = strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SQLSTREAMS_BOOKS_SEED: %v", err)
		}
		n = 1
	}
	t.Logf("seeds %d..%d (SQLSTREAMS_BOOKS_SEED=<seed> replays one)", base, base+uint64(n)-1)
	steps := 0
	for i := range n {
		seed := base + uint64(i)
		rnd := newSeqRand(seed)
		length := 1 + rnd.IntN(200)
		steps += length
		if err := runSeq(rnd, length, nil); err != nil {
			t.Fatalf("seed %d (SQLSTREAMS_BOOKS_SEED=%d replays it): %v", seed, seed, err)
		}
	}
	t.Logf("%d sequences, %d steps", n, steps)
}

// FuzzBooks drives the books with the fuzzer's bytes as every choice: go
// test -fuzz FuzzBooks ./actors/claimer.
func FuzzBooks(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42} {
		rnd := newSeqRand(seed)
		b := make([]byte, 600)
		for i := range b {
			b[i] = byte(rnd.IntN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &byteRand{b: in}
		if err := runSeq(r, 400, r.done); err != nil {
			t.Fatal(err)
		}
	})
}
