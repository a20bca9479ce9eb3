package store

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// A slab class is at least 4 KB and wastes at most a quarter of itself.
func TestSlabClassesWasteAtMostAQuarter(t *testing.T) {
	for n := 1; n < 1<<22; n += 1 + n/7 {
		c := slabClass(n)
		require.GreaterOrEqual(t, c, n)
		require.GreaterOrEqual(t, c, 4096)
		if n > 4096 {
			require.LessOrEqual(t, c-n, c/4, "class %d for %d bytes", c, n)
		}
		require.Equal(t, c, slabClass(c), "a class is its own class")
	}
}

func base(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b[:1]))) }

// A slab given back is the next one of its class handed out, empty; the
// pool keeps no more free bytes than its bound, a slab not of its classes
// is dropped, and a put that does not fit evicts slabs of other classes.
func TestSlabPoolReusesWithinItsBound(t *testing.T) {
	p := NewSlabPool(64 << 10)
	a := p.get(5000)
	require.Equal(t, slabClass(5000), cap(a))
	a = append(a, "payload"...)
	p.put(a)
	require.Equal(t, cap(a), p.Held())
	b := p.get(5000)
	require.Equal(t, base(a), base(b), "the slab given back is handed out again")
	require.Empty(t, b)
	require.Zero(t, p.Held())

	p.put(make([]byte, 0, 5000)) // not a class: dropped
	require.Zero(t, p.Held())
	p.put(make([]byte, 0, 128<<10)) // larger than the bound: dropped
	require.Zero(t, p.Held())

	var held [][]byte
	for range 20 {
		held = append(held, p.get(8<<10))
	}
	for _, s := range held {
		p.put(s)
	}
	require.Equal(t, 64<<10, p.Held(), "eight 8 KB slabs of twenty fit the bound")
	big := p.get(48 << 10)
	p.put(big)
	require.LessOrEqual(t, p.Held(), 64<<10)
	require.Equal(t, 48<<10, p.Largest(), "the new size evicted older ones to fit")
}
