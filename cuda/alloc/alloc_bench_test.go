package alloc

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkAllocFreeCacheHit measures an Alloc/Free pair served entirely
// from the cache: a split off a free segment block and the merge back.
func BenchmarkAllocFreeCacheHit(b *testing.B) {
	a, _ := newTestAllocator(b, 1<<30, 0)
	if err := a.Free(mustAlloc(b, a, 4096, 0)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		blk, err := a.Alloc(4096, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(blk); err != nil {
			b.Fatal(err)
		}
	}
	if st := a.Stats(); st.DriverAllocs != 1 {
		b.Fatalf("%d driver allocs", st.DriverAllocs)
	}
}

// BenchmarkAllocFreeCacheHitBusy is the same pair with 10,000 free blocks of
// various sizes in the tree and as many live ones, to show the O(log n) cost.
func BenchmarkAllocFreeCacheHitBusy(b *testing.B) {
	a, _ := newTestAllocator(b, 64<<30, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	var blocks []Block
	for range 20_000 {
		blocks = append(blocks, mustAllocQuiet(b, a, 512*(1+rng.IntN(64)), Stream(rng.IntN(4))))
	}
	for i := 0; i < len(blocks); i += 2 { // every other one: free blocks cannot merge
		if err := a.Free(blocks[i]); err != nil {
			b.Fatal(err)
		}
	}
	sizes := make([]int, 1024)
	for i := range sizes {
		sizes[i] = 512 * (1 + rng.IntN(64))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		blk, err := a.Alloc(sizes[i&1023], Stream(i&3))
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(blk); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkAllocFreeCacheHitParallel runs the pair from all Ps on one
// allocator: the cost of contention on its mutex.
func BenchmarkAllocFreeCacheHitParallel(b *testing.B) {
	a, _ := newTestAllocator(b, 1<<30, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			blk, err := a.Alloc(4096, 0)
			if err != nil {
				b.Error(err)
				return
			}
			if err := a.Free(blk); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func mustAllocQuiet(b testing.TB, a *Allocator, n int, s Stream) Block {
	blk, err := a.Alloc(n, s)
	if err != nil {
		b.Fatal(err)
	}
	return blk
}
