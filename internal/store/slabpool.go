package store

import (
	"math/bits"
	"sync"
)

// SlabPool keeps the payload slabs of settled ranges for later claims, so
// a claim copies its payloads into memory the process already has instead
// of a fresh allocation: one the runtime zeroes and, when the burst before
// it was scavenged, page-faults in again. Over 1,000 streams, whose ranges
// are all in memory at once after an idle spell, the copy into fresh slabs
// was 15% of the consumers' CPU (decision 0060). A client has
// one; its bound is the free bytes kept (in use, slabs are the ranges'):
// a put that does not fit evicts slabs of other sizes first, so the pool
// follows the sizes claims ask for now. A sync.Pool would not do: the
// collector empties it, and the memory it held is what the scavenger gives
// back.
//
// Only the claimer that knows no handler still reads a range's payloads
// gives its slabs back (claimer.Common.Slabs).
type SlabPool struct {
	max int

	mu    sync.Mutex
	free  map[int][][]byte // by capacity, a slab class
	bytes int
}

// NewSlabPool returns a pool keeping at most max free bytes (0: none, every
// put is dropped).
func NewSlabPool(max int) *SlabPool {
	return &SlabPool{max: max, free: map[int][][]byte{}}
}

// slabClass rounds n up to a slab class: at least 4 KB, then steps of an
// eighth of the next power of two above it, so a slab wastes at most a
// quarter of its size and classes stay few (four an octave).
func slabClass(n int) int {
	n = max(n, 4096)
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return (n + step - 1) / step * step
}

// get returns an empty slab with room for at least n bytes.
func (p *SlabPool) get(n int) []byte {
	c := slabClass(n)
	p.mu.Lock()
	if l := p.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[c] = l[:len(l)-1]
		p.bytes -= c
		p.mu.Unlock()
		return b[:0]
	}
	p.mu.Unlock()
	return make([]byte, 0, c)
}

// put keeps b for a later get. The caller no longer reads or writes it,
// and neither does anything it handed b's bytes to.
func (p *SlabPool) put(b []byte) {
	c := cap(b)
	if c != slabClass(c) || c > p.max {
		return // not one of the pool's, or larger than it keeps
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for other, l := range p.free {
		if p.bytes+c <= p.max {
			break
		}
		if other == c {
			continue
		}
		for len(l) > 0 && p.bytes+c > p.max {
			l[len(l)-1] = nil
			l = l[:len(l)-1]
			p.bytes -= other
		}
		if len(l) == 0 {
			delete(p.free, other)
		} else {
			p.free[other] = l
		}
	}
	if p.bytes+c > p.max {
		return
	}
	p.free[c] = append(p.free[c], b[:0])
	p.bytes += c
}

// Held reports the free bytes the pool keeps (for tests and stats).
func (p *SlabPool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// Recycle gives the range's payload slabs to p. Only a caller that knows
// nothing reads the range's Payload, Options or Headers any more may call
// it; a range not claimed from p has none to give.
func (r *Range) Recycle(p *SlabPool) {
	if p != nil {
		for _, b := range r.slabs {
			p.put(b)
		}
	}
	r.slabs = nil
}

// Largest reports the capacity of the largest free slab the pool keeps (0:
// none), for tests.
func (p *SlabPool) Largest() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c, l := range p.free {
		if len(l) > 0 {
			n = max(n, c)
		}
	}
	return n
}
