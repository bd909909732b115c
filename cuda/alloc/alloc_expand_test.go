package alloc

import (
	"errors"
	"testing"
)

func newExpandableAllocator(t testing.TB, total, limit int) (*Allocator, *fakeDevice) {
	t.Helper()
	d := newFakeDevice(total)
	a := NewAllocator(d, AllocatorOptions{Limit: limit, Expandable: true})
	if a.vm == nil {
		t.Fatal("the fake driver's VirtualMemory was not taken")
	}
	return a, d
}

func (d *fakeDevice) mappedPages() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pages)
}

// Blocks of every size share one address range per stream, end to end, and
// the range grows by whole pages only when no free block fits.
func TestAllocExpandablePacking(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 0)
	small := mustAlloc(t, a, 100, 0)
	large := mustAlloc(t, a, 3*oneMiB, 0)
	if small.Ptr()+uintptr(small.Size()) != large.Ptr() {
		t.Errorf("small block %#x+%d and large block %#x not adjacent", small.Ptr(), small.Size(), large.Ptr())
	}
	if got := a.Stats().Reserved.Current; got != 4*oneMiB || d.mappedPages() != 2 {
		t.Errorf("reserved %d with %d pages mapped, want 4 MiB in 2 pages", got, d.mappedPages())
	}
	// The rest of the second page serves the next request without mapping.
	next := mustAlloc(t, a, oneMiB-2048, 0)
	if st := a.Stats(); st.Reserved.Current != 4*oneMiB || st.DriverAllocs != 2 {
		t.Errorf("after a fitting request: reserved %d, %d driver allocations; want 4 MiB, 2", st.Reserved.Current, st.DriverAllocs)
	}
	// A request bigger than the free rest extends that rest: one more page.
	grown := mustAlloc(t, a, 1536*oneKiB, 0)
	if grown.Ptr() != next.Ptr()+uintptr(next.Size()) || a.Stats().Reserved.Current != 6*oneMiB {
		t.Errorf("the free end was not extended: block %#x after %#x+%d, reserved %d", grown.Ptr(), next.Ptr(), next.Size(), a.Stats().Reserved.Current)
	}
	if st := a.Stats(); st.Segments != 1 {
		t.Errorf("%d segments, want the one expandable segment", st.Segments)
	}
	// Another stream gets its own range.
	other := mustAlloc(t, a, 100, 7)
	if seg := segOf(a, other); seg == segOf(a, small) || seg.va == 0 {
		t.Error("stream 7 shares stream 0's range")
	}
	for _, b := range []Block{small, large, next, grown, other} {
		mustFree(t, a, b)
	}
	// Everything free: one free chunk per range, still mapped (cached).
	if st := a.Stats(); st.Allocated.Current != 0 || st.Reserved.Current != 8*oneMiB {
		t.Errorf("after freeing all: %+v", st)
	}
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	d.mu.Lock()
	ranges := len(d.ranges)
	d.mu.Unlock()
	if st := a.Stats(); st.Reserved.Current != 0 || st.Segments != 0 || d.mappedPages() != 0 || ranges != 0 {
		t.Errorf("after EmptyCache: reserved %d, %d segments, %d pages, %d address ranges; want none",
			st.Reserved.Current, st.Segments, d.mappedPages(), ranges)
	}
}

// Trimming gives back the whole free pages at the end of a range and keeps
// a page that a live block still touches.
func TestAllocExpandableTrim(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 0)
	keep := mustAlloc(t, a, 3*oneMiB, 0) // pages 0-1, half of page 1 free
	drop := mustAlloc(t, a, 5*oneMiB, 0) // to page 4
	mustFree(t, a, drop)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if got := a.Stats().Reserved.Current; got != 4*oneMiB || d.mappedPages() != 2 {
		t.Errorf("reserved %d in %d pages after trimming, want 4 MiB in 2", got, d.mappedPages())
	}
	// The kept page's free half is still usable.
	b := mustAlloc(t, a, 512*oneKiB, 0)
	if b.Ptr() != keep.Ptr()+uintptr(keep.Size()) {
		t.Errorf("the free rest of the last page was not reused")
	}
	mustFree(t, a, b)
	mustFree(t, a, keep)
}

// A limit counts mapped pages, and a range that cannot grow under it fails
// with the typed error after giving back what it can.
func TestAllocExpandableLimitAndOOM(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 8*oneMiB)
	b1 := mustAlloc(t, a, 5*oneMiB, 0)
	_, err := a.Alloc(4*oneMiB, 0)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Fatalf("Alloc over the limit: %v", err)
	}
	if st := a.Stats(); st.Reserved.Current > 8*oneMiB || st.OOMs != 1 {
		t.Errorf("reserved %d (limit 8 MiB), %d OOMs", st.Reserved.Current, st.OOMs)
	}
	check(t, a)
	// The driver running out while mapping is the same error, and nothing
	// is left half mapped.
	d.mu.Lock()
	d.failAllocs = 100
	d.mu.Unlock()
	if _, err := a.Alloc(2*oneMiB, 3); !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Fatalf("Alloc with the driver out of memory: %v", err)
	}
	d.mu.Lock()
	d.failAllocs = 0
	ranges := len(d.ranges)
	d.mu.Unlock()
	check(t, a)
	if ranges != 1 {
		t.Errorf("%d address ranges reserved, want stream 0's only (stream 3's was given back)", ranges)
	}
	mustFree(t, a, b1)
}

// A driver error while unmapping leaves the cache as it was.
func TestAllocExpandableUnmapError(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 0)
	mustFree(t, a, mustAlloc(t, a, 3*oneMiB, 0))
	d.mu.Lock()
	d.unmapErr = errFakeDriver
	d.mu.Unlock()
	if err := a.EmptyCache(); !errors.Is(err, errFakeDriver) {
		t.Fatalf("EmptyCache with a failing unmap: %v", err)
	}
	check(t, a)
	if got := a.Stats().Reserved.Current; got != 4*oneMiB {
		t.Errorf("reserved %d after a failed unmap, want 4 MiB kept", got)
	}
	d.mu.Lock()
	d.unmapErr = nil
	d.mu.Unlock()
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if a.Stats().Reserved.Current != 0 {
		t.Error("memory left after EmptyCache")
	}
}

// A private pool maps its own range: its blocks of every size pack end to
// end, and blocks freed next to each other merge, so a later larger
// request of the captured sequence fits where two freed ones were (with a
// segment per block it would take a new segment). Released with every
// block free, or when its last block is freed after the release, the
// pool's pages are unmapped and its range given back.
func TestAllocExpandablePrivatePool(t *testing.T) {
	for _, lateFree := range []bool{false, true} {
		a, d := newExpandableAllocator(t, oneGiB, 0)
		general := mustAlloc(t, a, 1000, 0)
		id := a.BeginPrivatePool(0)
		x := mustAlloc(t, a, 6*oneMiB, 0)
		y := mustAlloc(t, a, 6*oneMiB, 0)
		if seg := segOf(a, x); seg.va == 0 || seg == segOf(a, general) || segOf(a, y) != seg {
			t.Fatal("the private pool's blocks are not in one range of its own")
		}
		mustFree(t, a, x)
		mustFree(t, a, y)
		z := mustAlloc(t, a, 11*oneMiB, 0)
		if z.Ptr() != x.Ptr() {
			t.Errorf("11 MiB after freeing two adjacent 6 MiB blocks at %#x: got %#x, want the merged space", x.Ptr(), z.Ptr())
		}
		a.EndPrivatePool(0)
		check(t, a)
		if st := a.Stats(); st.Reserved.Peak != 14*oneMiB {
			t.Errorf("peak reserved %d MiB, want 12 for the pool and 2 for the general range", st.Reserved.Peak>>20)
		}
		if !lateFree {
			mustFree(t, a, z)
		}
		if err := a.ReleasePool(id); err != nil {
			t.Fatal(err)
		}
		if lateFree {
			mustFree(t, a, z) // the pool goes with its last block
		}
		check(t, a)
		d.mu.Lock()
		ranges := len(d.ranges)
		d.mu.Unlock()
		if st := a.Stats(); st.Reserved.Current != 2*oneMiB || st.Segments != 1 || d.mappedPages() != 1 || ranges != 1 {
			t.Errorf("released pool (last block freed after the release: %v): reserved %d, %d segments, %d pages, %d ranges; want the general range's 2 MiB alone",
				lateFree, st.Reserved.Current, st.Segments, d.mappedPages(), ranges)
		}
		mustFree(t, a, general)
	}
}

// Out of memory under a limit gives back other streams' free pages, not the
// free end of the range that is about to grow (it would be mapped again).
func TestAllocExpandableOOMKeepsOwnEnd(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 13*oneMiB)
	mustFree(t, a, mustAlloc(t, a, 6*oneMiB, 1)) // stream 1: 6 MiB mapped, free
	b := mustAlloc(t, a, 1*oneMiB+512*oneKiB, 0) // stream 0: 1.5 MiB in use
	mustFree(t, a, mustAlloc(t, a, 3*oneMiB+512*oneKiB, 0))
	// Stream 0 has 6 MiB mapped, 4.5 MiB free at its end (4 MiB of whole
	// pages); 12 of 13 MiB are reserved. 8 MiB at stream 0's end needs 4
	// MiB more: giving back stream 1's 6 MiB is enough, and trimming
	// stream 0's own end (the smaller piece) would only be mapped again.
	unmapsBefore := d.unmaps
	big := mustAlloc(t, a, 8*oneMiB, 0)
	check(t, a)
	if st := a.Stats(); st.Reserved.Current != 10*oneMiB {
		t.Errorf("reserved %d, want 10 MiB", st.Reserved.Current)
	}
	if got := d.unmaps - unmapsBefore; got != 1 {
		t.Errorf("%d unmap calls, want 1 (stream 1's pages only)", got)
	}
	mustFree(t, a, big)
	mustFree(t, a, b)
}

// What Backend.Capture relies on: a step run eagerly and then captured
// (after a warm-up step) reserves its memory once when EmptyCache runs
// before the private pool begins, the long-lived blocks (weights,
// optimiser state) having been made before the step; without it the
// pool's segments come on top of the cached step. A block the warm-up
// step makes and keeps pins the range's end: then nothing is unmapped.
func TestAllocEmptyCacheBeforePrivatePool(t *testing.T) {
	step := []int{40 * oneMiB, 24 * oneMiB, 24*oneMiB + 512, 8 * oneMiB, 100}
	run := func(empty, pin bool) (eager, captured int) {
		a, _ := newExpandableAllocator(t, oneGiB, 0)
		weights := mustAlloc(t, a, 10*oneMiB, 0)
		var blocks []Block
		for _, n := range step {
			blocks = append(blocks, mustAlloc(t, a, n, 0))
		}
		var pinned Block
		if pin {
			pinned = mustAlloc(t, a, 4096, 0) // made by the warm-up, kept
		}
		for _, b := range blocks {
			mustFree(t, a, b)
		}
		eager = a.Stats().Reserved.Peak
		a.ResetPeakStats()
		if empty {
			if err := a.EmptyCache(); err != nil {
				t.Fatal(err)
			}
		}
		id := a.BeginPrivatePool(0)
		blocks = blocks[:0]
		for _, n := range step {
			blocks = append(blocks, mustAlloc(t, a, n, 0))
		}
		a.EndPrivatePool(0)
		captured = a.Stats().Reserved.Peak
		for _, b := range blocks {
			mustFree(t, a, b)
		}
		if err := a.ReleasePool(id); err != nil {
			t.Fatal(err)
		}
		if pin {
			mustFree(t, a, pinned)
		}
		mustFree(t, a, weights)
		check(t, a)
		return eager, captured
	}
	eager, captured := run(true, false)
	if captured > eager+4*oneMiB { // a segment's rounding
		t.Errorf("EmptyCache first: peak reserved %d MiB through the pool after an eager step of %d MiB; want about the step's once", captured>>20, eager>>20)
	}
	if _, twice := run(false, false); twice < eager+eager/2 {
		t.Errorf("without EmptyCache the pool's peak is %d MiB, the eager step's %d MiB: the test no longer tells them apart", twice>>20, eager>>20)
	}
	if _, pinned := run(true, true); pinned < eager+eager/2 {
		t.Errorf("a block kept above the step: peak %d MiB, eager %d MiB; want the step reserved twice (the end is pinned)", pinned>>20, eager>>20)
	}
}
