package alloc

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAllocFreeTree drives the B-tree directly through many random inserts
// and deletes, so that splits, borrows and merges at every level happen,
// and compares every query with a brute-force answer.
func TestAllocFreeTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := &blockPool{}
	seg := &memSegment{pool: p}
	var ref []*memChunk // the chunks in the tree, in no order
	nextPtr := uintptr(1 << 20)
	a := &Allocator{slots: []*memChunk{nil}}
	newChunk := func() *memChunk {
		nextPtr += 512
		c := &memChunk{
			ptr:    nextPtr,
			size:   512 * (1 + rng.IntN(40)),
			stream: Stream(rng.IntN(4)) * 7,
			seg:    seg,
			slot:   uint32(len(a.slots)),
		}
		a.slots = append(a.slots, c)
		return c
	}
	ops := 100_000
	if testing.Short() || allocRaceEnabled {
		ops = 30_000
	}
	remove := func(c *memChunk) {
		i := slices.Index(ref, c)
		ref[i] = ref[len(ref)-1]
		ref = ref[:len(ref)-1]
	}
	for op := range ops {
		// Grow to a few thousand items (three levels), shrink to zero,
		// grow again.
		grow := (op/10_000)%2 == 0
		if len(ref) == 0 || (grow && rng.IntN(10) < 7) || (!grow && rng.IntN(10) < 3) {
			c := newChunk()
			a.poolInsert(p, c)
			ref = append(ref, c)
		} else if rng.IntN(4) == 0 {
			// Best fit out, as Alloc does.
			st, size := Stream(rng.IntN(4))*7, 512*rng.IntN(45)
			want := bruteFind(ref, st, size)
			if got := a.takeBestFit(p, st, size); got != want {
				t.Fatalf("op %d: takeBestFit(%d, %d) = %v, want %v", op, st, size, got, want)
			}
			if want != nil {
				remove(want)
			}
		} else if rng.IntN(3) == 0 {
			// A split or a merge: one chunk's key changes a little (or a
			// lot) and replace puts it in its new place.
			c := ref[rng.IntN(len(ref))]
			old := keyOf(c)
			if rng.IntN(4) == 0 {
				c.size = 512 * (1 + rng.IntN(40))
			} else {
				c.size = max(512, c.size+512*(rng.IntN(5)-2))
			}
			p.tree.replace(old, btItem{keyOf(c), c.slot})
			if !p.contains(c) {
				t.Fatalf("op %d: replaced chunk not found under its new key", op)
			}
		} else {
			i := rng.IntN(len(ref))
			a.poolRemove(p, ref[i])
			ref[i] = ref[len(ref)-1]
			ref = ref[:len(ref)-1]
		}
		if op%997 == 0 || len(ref) < 3 {
			if n, err := a.checkTree(p); err != nil || n != len(ref) {
				t.Fatalf("op %d: %d items (want %d): %v", op, n, len(ref), err)
			}
		}
		if op%31 == 0 && len(ref) > 0 {
			s, size := Stream(rng.IntN(5))*7, 512*rng.IntN(45)
			if got, want := a.find(p, s, size), bruteFind(ref, s, size); got != want {
				t.Fatalf("op %d: find(%d, %d) = %v, want %v", op, s, size, got, want)
			}
			if got, want := p.largestFree(), bruteLargest(ref); got != want {
				t.Fatalf("op %d: largestFree = %d, want %d", op, got, want)
			}
			c := ref[rng.IntN(len(ref))]
			if !p.contains(c) || p.contains(&memChunk{ptr: 1, size: 512}) {
				t.Fatalf("op %d: contains wrong", op)
			}
		}
	}
	for _, c := range ref {
		a.poolRemove(p, c)
	}
	if n, err := a.checkTree(p); err != nil || n != 0 || p.tree.root.n != 0 {
		t.Fatalf("after removing all: %d items: %v", n, err)
	}
	// The highest stream must work too.
	c := newChunk()
	c.ptr, c.size, c.stream = 512, 4096, btMaxStream
	a.poolInsert(p, c)
	if a.find(p, btMaxStream, 1) != c || p.largestFree() != 4096 {
		t.Errorf("max stream not found")
	}
}

func bruteFind(cs []*memChunk, s Stream, size int) *memChunk {
	var best *memChunk
	for _, c := range cs {
		if c.stream == s && c.size >= size && (best == nil || keyOf(c).less(keyOf(best))) {
			best = c
		}
	}
	return best
}

func bruteLargest(cs []*memChunk) int {
	sizes := make([]int, 0, len(cs))
	for _, c := range cs {
		sizes = append(sizes, c.size)
	}
	if len(sizes) == 0 {
		return 0
	}
	return slices.Max(sizes)
}
