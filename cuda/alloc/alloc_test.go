package alloc

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func newTestAllocator(t testing.TB, total, limit int) (*Allocator, *fakeDevice) {
	t.Helper()
	d := newFakeDevice(total)
	// The tests were written for PyTorch's shared 20 MiB mid-size segments;
	// TestAllocOwnSegments covers the default.
	return NewAllocator(d, AllocatorOptions{Limit: limit, SharedSegment: 20 * oneMiB}), d
}

func mustAlloc(t testing.TB, a *Allocator, n int, s Stream) Block {
	t.Helper()
	b, err := a.Alloc(n, s)
	if err != nil {
		t.Fatalf("Alloc(%d, %d): %v", n, s, err)
	}
	if err := checkBlock(a, b); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	return b
}

func mustFree(t testing.TB, a *Allocator, b Block) {
	t.Helper()
	if err := a.Free(b); err != nil {
		t.Fatalf("Free: %v", err)
	}
	check(t, a)
}

func check(t testing.TB, a *Allocator) {
	t.Helper()
	if err := a.checkInvariants(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

// segOf returns the segment of a live block.
func segOf(a *Allocator, b Block) *memSegment {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.live(b)
	if c == nil {
		panic("segOf: block not live")
	}
	return c.seg
}

// checkBlock verifies that b describes its chunk.
func checkBlock(a *Allocator, b Block) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.live(b)
	if c == nil {
		return fmt.Errorf("block %#x is not live", b.ptr)
	}
	if b.ptr != c.ptr || b.Size() != c.size || b.slot() != c.slot || b.owner() != a.id {
		return fmt.Errorf("block %#x+%d (slot %d) does not match its chunk %#x+%d (slot %d)",
			b.ptr, b.Size(), b.slot(), c.ptr, c.size, c.slot)
	}
	return nil
}

// segSizes returns the sizes of the segments the fake driver holds.
func segSizes(d *fakeDevice) map[int]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[int]int{}
	for _, n := range d.live {
		m[n]++
	}
	return m
}

func TestAllocRounding(t *testing.T) {
	for _, c := range []struct{ req, size int }{
		{1, 512},
		{511, 512},
		{512, 512},
		{513, 1024},
		{1000, 1024},
		{oneMiB, oneMiB},
		{oneMiB + 1, oneMiB + 512},         // large, split from a 20 MiB segment
		{18*oneMiB + 512, 18*oneMiB + 512}, // 20 MiB segment, rest 2 MiB-512 > 1 MiB: split
		{19 * oneMiB, 20 * oneMiB},         // 20 MiB segment, rest 1 MiB: not split
		{19*oneMiB + 512*3, 20 * oneMiB},   // rest under 1 MiB: not split
		{10 * oneMiB, 10 * oneMiB},         // own segment, exact
		{10*oneMiB + 1, 10*oneMiB + 512},   // 12 MiB segment, rest under 2 MiB-512 > 1 MiB: split
		{11*oneMiB - 100, 12 * oneMiB},     // 12 MiB segment, rest 1 MiB: not split
	} {
		a, _ := newTestAllocator(t, 1<<30, 0) // fresh, so that no earlier case's rest is reused
		b := mustAlloc(t, a, c.req, 0)
		if b.Size() != c.size || a.Requested(b) != c.req {
			t.Errorf("Alloc(%d): Size %d Requested %d, want %d %d", c.req, b.Size(), a.Requested(b), c.size, c.req)
		}
		if b.Ptr()%512 != 0 {
			t.Errorf("Alloc(%d): ptr %#x not 512-aligned", c.req, b.Ptr())
		}
	}
	a, _ := newTestAllocator(t, 1<<30, 0)
	for _, n := range []int{0, -1} {
		if _, err := a.Alloc(n, 0); err == nil {
			t.Errorf("Alloc(%d) succeeded", n)
		}
	}
	if _, err := a.Alloc(maxAllocRequest+1, 0); err == nil {
		t.Errorf("Alloc(huge) succeeded")
	}
}

func TestAllocSegmentSizes(t *testing.T) {
	for _, c := range []struct{ req, seg, min int }{
		{1, 2 * oneMiB, 2 * oneMiB},
		{oneMiB, 2 * oneMiB, 2 * oneMiB},
		{oneMiB + 1, 20 * oneMiB, 2 * oneMiB},
		{3 * oneMiB, 20 * oneMiB, 4 * oneMiB},
		{10*oneMiB - 512, 20 * oneMiB, 10 * oneMiB},
		{10 * oneMiB, 10 * oneMiB, 10 * oneMiB},
		{10*oneMiB + 1, 12 * oneMiB, 12 * oneMiB},
		{64 * oneMiB, 64 * oneMiB, 64 * oneMiB},
	} {
		r := roundSize(c.req)
		if got := segmentSize(r, 20*oneMiB); got != c.seg {
			t.Errorf("segmentSize(%d) = %d, want %d", r, got, c.seg)
		}
		if got := minSegmentSize(r); got != c.min {
			t.Errorf("minSegmentSize(%d) = %d, want %d", r, got, c.min)
		}
	}
}

func TestAllocReuseFreedBlock(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	b := mustAlloc(t, a, 4096, 0)
	p := b.Ptr()
	mustFree(t, a, b)
	c := mustAlloc(t, a, 4000, 0)
	if c.Ptr() != p {
		t.Errorf("reused ptr %#x, want %#x", c.Ptr(), p)
	}
	if allocs, _, _ := d.counts(); allocs != 1 {
		t.Errorf("driver allocs = %d, want 1", allocs)
	}
	if st := a.Stats(); st.CacheHits != 1 || st.CacheMisses != 1 {
		t.Errorf("hits/misses = %d/%d, want 1/1", st.CacheHits, st.CacheMisses)
	}
	// The stale handle must not free the new allocation at the same address.
	if err := a.Free(b); !errors.Is(err, ErrInvalidBlock) {
		t.Errorf("Free of stale block: %v, want ErrInvalidBlock", err)
	}
	check(t, a)
	mustFree(t, a, c)
}

func TestAllocSplitCoalesceBestFit(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	x := make([]Block, 6)
	sizes := []int{1000, 4096, 2000, 2048, 2048, 100}
	for i, n := range sizes {
		x[i] = mustAlloc(t, a, n, 0)
	}
	// Split from one segment, back to back.
	for i := 1; i < len(x); i++ {
		if want := x[i-1].Ptr() + uintptr(x[i-1].Size()); x[i].Ptr() != want {
			t.Fatalf("block %d at %#x, want %#x", i, x[i].Ptr(), want)
		}
	}
	base := x[0].Ptr()
	used := 1024 + 4096 + 2048 + 2048 + 2048 + 512
	if st := a.Stats(); st.InactiveSplit.Current != smallBuffer-used || st.LargestFreeBlock != smallBuffer-used {
		t.Errorf("after splits: inactive split %d, largest free %d; want %d", st.InactiveSplit.Current, st.LargestFreeBlock, smallBuffer-used)
	}

	// Holes: 4096 at x[1], 2048 at x[3]; x[2] keeps them apart.
	mustFree(t, a, x[1])
	mustFree(t, a, x[3])
	// Best fit: the 2048 hole, though the 4096 one has a lower address.
	y := mustAlloc(t, a, 1500, 0)
	if y.Ptr() != x[3].Ptr() {
		t.Errorf("best fit gave %#x, want the 2048-byte hole at %#x", y.Ptr(), x[3].Ptr())
	}
	mustFree(t, a, y)
	// Ties go to the lower address: make a second 2048 hole below it.
	mustFree(t, a, x[0]) // 1024 at base, merges with the 4096 hole: 5120
	z := mustAlloc(t, a, 2048, 0)
	if z.Ptr() != x[3].Ptr() {
		t.Errorf("fit gave %#x, want %#x", z.Ptr(), x[3].Ptr())
	}
	mustFree(t, a, z)

	// Coalescing: free everything and the segment is one free block again.
	mustFree(t, a, x[2])
	mustFree(t, a, x[5])
	mustFree(t, a, x[4])
	if it, _ := a.small.tree.ceil(btKey{}); a.small.tree.n != 1 || it.key.ptr != base || it.key.size != smallBuffer {
		t.Errorf("after freeing all: %d free chunks, want one covering the segment", a.small.tree.n)
	}
	st := a.Stats()
	if st.InactiveSplit.Current != 0 || st.LargestFreeBlock != smallBuffer || st.Allocated.Current != 0 {
		t.Errorf("after freeing all: %+v", st)
	}
	if allocs, _, _ := d.counts(); allocs != 1 {
		t.Errorf("driver allocs = %d, want 1", allocs)
	}
}

func TestAllocPoolRouting(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	s := mustAlloc(t, a, oneMiB, 0)
	l := mustAlloc(t, a, oneMiB+1, 0)
	if got := segSizes(d); got[2*oneMiB] != 1 || got[20*oneMiB] != 1 || len(got) != 2 {
		t.Fatalf("segments %v, want one of 2 MiB and one of 20 MiB", got)
	}
	if segOf(a, s).pool != &a.small || segOf(a, l).pool != &a.large {
		t.Fatalf("wrong pools")
	}
	// A free small segment does not serve a large request, nor a large
	// free block a small one.
	mustFree(t, a, s)
	l2 := mustAlloc(t, a, oneMiB+oneMiB/2, 0)
	if segOf(a, l2) != segOf(a, l) {
		t.Errorf("1.5 MiB request not carved from the large segment")
	}
	mustFree(t, a, l)
	mustFree(t, a, l2)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	l3 := mustAlloc(t, a, 12*oneMiB, 0)
	s2 := mustAlloc(t, a, 512*1024, 0)
	if segOf(a, s2) == segOf(a, l3) || segOf(a, s2).size != smallBuffer {
		t.Errorf("small request served from a large segment")
	}
	if got := segSizes(d); got[12*oneMiB] != 1 || got[2*oneMiB] != 1 {
		t.Errorf("segments %v", got)
	}
}

func TestAllocStatsExact(t *testing.T) {
	a, _ := newTestAllocator(t, 1<<30, 0)
	expect := func(step string, want MemoryStats) {
		t.Helper()
		check(t, a)
		if got := a.Stats(); got != want {
			t.Fatalf("%s:\n got %+v\nwant %+v", step, got, want)
		}
	}
	sp := func(cur, peak int) StatPair { return StatPair{cur, peak} }
	const M = oneMiB

	b1 := mustAlloc(t, a, 1000, 0)
	expect("b1", MemoryStats{
		Allocated: sp(1024, 1024), Reserved: sp(2*M, 2*M), Active: sp(1024, 1024),
		Requested: sp(1000, 1000), InactiveSplit: sp(2*M-1024, 2*M-1024),
		DriverAllocs: 1, CacheMisses: 1, Segments: 1, ActiveBlocks: 1, LargestFreeBlock: 2*M - 1024,
	})
	b2 := mustAlloc(t, a, 3*M, 0)
	expect("b2", MemoryStats{
		Allocated: sp(3*M+1024, 3*M+1024), Reserved: sp(22*M, 22*M), Active: sp(3*M+1024, 3*M+1024),
		Requested: sp(3*M+1000, 3*M+1000), InactiveSplit: sp(19*M-1024, 19*M-1024),
		DriverAllocs: 2, CacheMisses: 2, Segments: 2, ActiveBlocks: 2, LargestFreeBlock: 17 * M,
	})
	mustFree(t, a, b1)
	expect("free b1", MemoryStats{
		Allocated: sp(3*M, 3*M+1024), Reserved: sp(22*M, 22*M), Active: sp(3*M, 3*M+1024),
		Requested: sp(3*M, 3*M+1000), InactiveSplit: sp(17*M, 19*M-1024),
		DriverAllocs: 2, CacheMisses: 2, Segments: 2, ActiveBlocks: 1, LargestFreeBlock: 17 * M,
	})
	b3 := mustAlloc(t, a, 512, 0)
	expect("b3", MemoryStats{
		Allocated: sp(3*M+512, 3*M+1024), Reserved: sp(22*M, 22*M), Active: sp(3*M+512, 3*M+1024),
		Requested: sp(3*M+512, 3*M+1000), InactiveSplit: sp(19*M-512, 19*M-512),
		DriverAllocs: 2, CacheHits: 1, CacheMisses: 2, Segments: 2, ActiveBlocks: 2, LargestFreeBlock: 17 * M,
	})
	a.ResetPeakStats()
	expect("reset peaks", MemoryStats{
		Allocated: sp(3*M+512, 3*M+512), Reserved: sp(22*M, 22*M), Active: sp(3*M+512, 3*M+512),
		Requested: sp(3*M+512, 3*M+512), InactiveSplit: sp(19*M-512, 19*M-512),
		DriverAllocs: 2, CacheHits: 1, CacheMisses: 2, Segments: 2, ActiveBlocks: 2, LargestFreeBlock: 17 * M,
	})
	mustFree(t, a, b2)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	expect("free b2, empty cache", MemoryStats{
		Allocated: sp(512, 3*M+512), Reserved: sp(2*M, 22*M), Active: sp(512, 3*M+512),
		Requested: sp(512, 3*M+512), InactiveSplit: sp(2*M-512, 19*M-512),
		DriverAllocs: 2, DriverFrees: 1, CacheHits: 1, CacheMisses: 2, Segments: 1, ActiveBlocks: 1,
		LargestFreeBlock: 2*M - 512,
	})
	mustFree(t, a, b3)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	expect("all freed", MemoryStats{
		Allocated: sp(0, 3*M+512), Reserved: sp(0, 22*M), Active: sp(0, 3*M+512),
		Requested: sp(0, 3*M+512), InactiveSplit: sp(0, 19*M-512),
		DriverAllocs: 2, DriverFrees: 2, CacheHits: 1, CacheMisses: 2,
	})
}

func TestAllocOOMRetriesThenSucceeds(t *testing.T) {
	// Cached: one small segment, one 12 MiB large segment. The request
	// needs a new 14 MiB segment.
	setup := func(t *testing.T) (*Allocator, *fakeDevice) {
		a, d := newTestAllocator(t, 1<<30, 0)
		s := mustAlloc(t, a, 4096, 0)
		l := mustAlloc(t, a, 12*oneMiB, 0)
		mustFree(t, a, s)
		mustFree(t, a, l)
		return a, d
	}
	t.Run("stage2", func(t *testing.T) {
		a, d := setup(t)
		d.set(func(d *fakeDevice) { d.failAllocs = 1 })
		b := mustAlloc(t, a, 13*oneMiB, 0)
		st := a.Stats()
		if st.Retries != 1 || st.DriverFrees != 1 || st.OOMs != 0 || st.Segments != 2 {
			t.Errorf("stats %+v, want 1 retry freeing only the large segment", st)
		}
		if got := segSizes(d); got[14*oneMiB] != 1 || got[2*oneMiB] != 1 || got[12*oneMiB] != 0 {
			t.Errorf("segments %v", got)
		}
		mustFree(t, a, b)
	})
	t.Run("stage3", func(t *testing.T) {
		a, d := setup(t)
		d.set(func(d *fakeDevice) { d.failAllocs = 2 })
		mustAlloc(t, a, 13*oneMiB, 0)
		st := a.Stats()
		if st.Retries != 2 || st.DriverFrees != 2 || st.OOMs != 0 || st.Segments != 1 {
			t.Errorf("stats %+v, want 2 retries freeing both segments", st)
		}
	})
	t.Run("stage4", func(t *testing.T) {
		// Nothing cached; the 20 MiB mid-size segment fails, 4 MiB works.
		a, d := newTestAllocator(t, 1<<30, 0)
		d.set(func(d *fakeDevice) { d.failAllocs = 1 })
		b := mustAlloc(t, a, 3*oneMiB, 0)
		if got := segSizes(d); got[4*oneMiB] != 1 || len(got) != 1 {
			t.Errorf("segments %v, want one of 4 MiB", got)
		}
		if b.Size() != 4*oneMiB { // rest of 1 MiB is not split off
			t.Errorf("size %d", b.Size())
		}
		if st := a.Stats(); st.Retries != 1 || st.CacheMisses != 1 {
			t.Errorf("stats %+v", st)
		}
	})
	t.Run("stage1", func(t *testing.T) {
		// The device is full; a block waiting on an event completes
		// while the allocator asks the driver.
		a, d := newTestAllocator(t, 2*oneMiB, 0)
		b := mustAlloc(t, a, oneMiB, 1)
		c := mustAlloc(t, a, oneMiB, 1)
		a.RecordStream(b, 2)
		mustFree(t, a, b)
		d.set(func(d *fakeDevice) { d.onAlloc = d.completeAll })
		e := mustAlloc(t, a, oneMiB, 1)
		if e.Ptr() != b.Ptr() {
			t.Errorf("got %#x, want the block freed by the event %#x", e.Ptr(), b.Ptr())
		}
		if st := a.Stats(); st.OOMs != 0 || st.CacheHits != 2 || st.Retries != 0 || st.DriverAllocs != 1 {
			t.Errorf("stats %+v", st)
		}
		mustFree(t, a, c)
		mustFree(t, a, e)
	})
}

func TestAllocOOMError(t *testing.T) {
	a, d := newTestAllocator(t, 80*oneGiB, 0)
	keep := mustAlloc(t, a, 120*oneMiB, 0) // own 120 MiB segment
	s2 := mustAlloc(t, a, 4096, 0)         // keeps the small segment
	s := mustAlloc(t, a, oneMiB, 0)
	mustFree(t, a, s) // 2 MiB-4096 free in one block
	d.set(func(d *fakeDevice) { d.failAllocs = 1 << 30; d.used = d.total - oneGiB/2 })
	_, err := a.Alloc(8_000_000, 0)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("err %v (%T), want *OutOfMemoryError", err, err)
	}
	if !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Errorf("errors.Is(err, ErrDeviceOutOfMemory) = false")
	}
	want := OutOfMemoryError{
		Requested:           8_000_000,
		Rounded:             8_000_000,
		SegmentSize:         20 * oneMiB,
		DeviceFree:          oneGiB / 2,
		DeviceTotal:         80 * oneGiB,
		Allocated:           120*oneMiB + 4096,
		Reserved:            122 * oneMiB,
		ReservedUnallocated: 2*oneMiB - 4096,
		LargestFreeBlock:    2*oneMiB - 4096,
		Limit:               0,
	}
	if *oom != want {
		t.Errorf("got  %+v\nwant %+v", *oom, want)
	}
	const msg = "cuda: out of memory allocating 7.63 MiB (rounded 7.63 MiB, segment 20.00 MiB): " +
		"device 0.50 of 80.00 GiB free, 120.00 MiB allocated, 122.00 MiB reserved " +
		"(2.00 MiB reserved but unallocated, largest free block 2.00 MiB), no limit"
	if oom.Error() != msg {
		t.Errorf("message\n got %q\nwant %q", oom.Error(), msg)
	}
	if strings.Contains(oom.Error(), "\n") {
		t.Errorf("message is not one line")
	}
	st := a.Stats()
	// Tried: 20 MiB, then (nothing cached to free) the 8 MiB minimum.
	if st.OOMs != 1 || st.Retries != 1 || st.Reserved.Current != 122*oneMiB {
		t.Errorf("stats %+v", st)
	}
	check(t, a)

	// With the limit in the message.
	a.SetLimit(122 * oneMiB)
	_, err = a.Alloc(oneMiB, 7)
	if !errors.As(err, &oom) || oom.Limit != 122*oneMiB || !strings.HasSuffix(oom.Error(), "limit 122.00 MiB") {
		t.Errorf("err %v", err)
	}

	// A driver that cannot report memory: both errors are returned.
	d.set(func(d *fakeDevice) { d.infoErr = errFakeDriver })
	_, err = a.Alloc(oneMiB, 7)
	if !errors.As(err, &oom) || !errors.Is(err, errFakeDriver) || !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Errorf("err %v", err)
	}
	mustFree(t, a, keep)
	mustFree(t, a, s2)
}

func TestAllocDriverErrors(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	d.set(func(d *fakeDevice) { d.allocErr = errFakeDriver })
	_, err := a.Alloc(100, 0)
	if !errors.Is(err, errFakeDriver) || errors.Is(err, ErrDeviceOutOfMemory) {
		t.Errorf("Alloc with failing driver: %v", err)
	}
	d.set(func(d *fakeDevice) { d.allocErr = nil })
	b := mustAlloc(t, a, 100, 0)
	mustFree(t, a, b)

	// A failing cuMemFree leaves the segment cached and says so.
	d.set(func(d *fakeDevice) { d.freeErr = errFakeDriver })
	if err := a.EmptyCache(); !errors.Is(err, errFakeDriver) {
		t.Errorf("EmptyCache: %v", err)
	}
	check(t, a)
	if st := a.Stats(); st.Segments != 1 || st.Reserved.Current != smallBuffer {
		t.Errorf("stats after failed free: %+v", st)
	}
	d.set(func(d *fakeDevice) { d.freeErr = nil })
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if _, _, used := d.counts(); used != 0 {
		t.Errorf("device still has %d bytes", used)
	}

	// A failing event record leaves the block allocated.
	b = mustAlloc(t, a, 100, 0)
	a.RecordStream(b, 1)
	d.set(func(d *fakeDevice) { d.recordErr = errFakeDriver })
	if err := a.Free(b); !errors.Is(err, errFakeDriver) {
		t.Errorf("Free with failing EventRecord: %v", err)
	}
	check(t, a)
	if st := a.Stats(); st.Allocated.Current != 512 {
		t.Errorf("allocated %d after a failed free", st.Allocated.Current)
	}
	d.set(func(d *fakeDevice) { d.recordErr = nil })
	mustFree(t, a, b)

	// A failing event query is reported by Alloc.
	d.set(func(d *fakeDevice) { d.queryErr = errFakeDriver })
	if _, err := a.Alloc(100, 0); !errors.Is(err, errFakeDriver) {
		t.Errorf("Alloc with failing EventQuery: %v", err)
	}
	d.set(func(d *fakeDevice) { d.queryErr = nil })
	d.completeAll()
	mustFree(t, a, mustAlloc(t, a, 100, 0))
	if a.Stats().Active.Current != 0 {
		t.Errorf("block still pending")
	}
}

func TestAllocBadFree(t *testing.T) {
	a, _ := newTestAllocator(t, 1<<30, 0)
	other, _ := newTestAllocator(t, 1<<30, 0)
	b := mustAlloc(t, a, 100, 0)
	ob := mustAlloc(t, other, 100, 0)
	for name, blk := range map[string]Block{"zero": {}, "foreign": ob, "forged": {meta: b.meta, gen: b.gen + 1}} {
		if err := a.Free(blk); !errors.Is(err, ErrInvalidBlock) {
			t.Errorf("Free(%s) = %v, want ErrInvalidBlock", name, err)
		}
	}
	mustFree(t, a, b)
	if err := a.Free(b); !errors.Is(err, ErrInvalidBlock) || !strings.Contains(err.Error(), "double free") {
		t.Errorf("double Free = %v", err)
	}
	check(t, a)
	// A block waiting for events is freed already too.
	c := mustAlloc(t, a, 100, 0)
	a.RecordStream(c, 3)
	mustFree(t, a, c)
	if err := a.Free(c); !errors.Is(err, ErrInvalidBlock) {
		t.Errorf("double Free of pending block = %v", err)
	}
	mustPanic(t, "RecordStream after free", func() { a.RecordStream(b, 1) })
	mustPanic(t, "RecordStream foreign", func() { a.RecordStream(ob, 1) })
	mustPanic(t, "EndPrivatePool without Begin", func() { a.EndPrivatePool(5) })
	check(t, a)
}

func mustPanic(t *testing.T, name string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", name)
		}
	}()
	f()
}

func TestAllocLimit(t *testing.T) {
	const limit = 10 * oneMiB
	a, d := newTestAllocator(t, 1<<30, limit)
	var live []Block
	for {
		b, err := a.Alloc(100*1024, 0)
		if st := a.Stats(); st.Reserved.Current > limit {
			t.Fatalf("reserved %d over the limit", st.Reserved.Current)
		}
		if err != nil {
			var oom *OutOfMemoryError
			if !errors.As(err, &oom) || oom.Limit != limit || oom.Reserved != limit || oom.SegmentSize != smallBuffer {
				t.Fatalf("err %v", err)
			}
			break
		}
		live = append(live, b)
	}
	if st := a.Stats(); st.Segments != 5 || len(live) != 5*(smallBuffer/(100*1024)) {
		t.Errorf("%d segments, %d blocks", st.Segments, len(live))
	}
	check(t, a)
	for _, b := range live {
		mustFree(t, a, b)
	}
	// Large request: its 20 MiB segment is over the limit; the cached small
	// segments go, then the 4 MiB minimum fits.
	big := mustAlloc(t, a, 3*oneMiB, 0)
	if got := segSizes(d); got[4*oneMiB] != 1 || len(got) != 1 {
		t.Errorf("segments %v", got)
	}

	// Lowering the limit below what is live frees nothing live, reserves
	// nothing more, and gives the memory back when it is freed.
	a.SetLimit(2 * oneMiB)
	check(t, a)
	if _, err := a.Alloc(100, 0); !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Errorf("Alloc over the lowered limit: %v", err)
	}
	mustFree(t, a, big)
	if st := a.Stats(); st.Reserved.Current != 0 {
		t.Errorf("reserved %d after freeing the block over the limit", st.Reserved.Current)
	}
	mustFree(t, a, mustAlloc(t, a, 100, 0))
	a.SetLimit(0)
	mustFree(t, a, mustAlloc(t, a, 64*oneMiB, 0))
}

func TestAllocEmptyCache(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	s1 := mustAlloc(t, a, 1000, 0)
	s2 := mustAlloc(t, a, oneMiB, 0) // same segment as s1
	s3 := mustAlloc(t, a, oneMiB, 0) // second small segment
	l1 := mustAlloc(t, a, 30*oneMiB, 0)
	l2 := mustAlloc(t, a, 2*oneMiB, 0)
	mustFree(t, a, s1)
	mustFree(t, a, s3)
	mustFree(t, a, l1)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	// Left: the small segment of s2 and the 20 MiB segment of l2.
	st := a.Stats()
	if st.Segments != 2 || st.Reserved.Current != 22*oneMiB || st.DriverFrees != 2 {
		t.Errorf("after EmptyCache: %+v", st)
	}
	if _, _, used := d.counts(); used != st.Reserved.Current {
		t.Errorf("driver has %d, allocator reserves %d", used, st.Reserved.Current)
	}
	// Blocks waiting for events keep their segment.
	a.RecordStream(s2, 9)
	mustFree(t, a, s2)
	mustFree(t, a, l2)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Segments != 1 || st.Reserved.Current != smallBuffer {
		t.Errorf("pending block's segment: %+v", st)
	}
	d.complete(9)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if st := a.Stats(); st.Segments != 0 || st.Reserved.Current != 0 {
		t.Errorf("after the event: %+v", st)
	}
}

func TestAllocStreams(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	b := mustAlloc(t, a, 4096, 1)
	bs := segOf(a, b)
	mustFree(t, a, b)
	c := mustAlloc(t, a, 4096, 2)
	if c.Ptr() == b.Ptr() || segOf(a, c) == bs {
		t.Errorf("block freed on stream 1 reused on stream 2")
	}
	if allocs, _, _ := d.counts(); allocs != 2 {
		t.Errorf("driver allocs %d, want 2", allocs)
	}
	e := mustAlloc(t, a, 4096, 1)
	if e.Ptr() != b.Ptr() {
		t.Errorf("block not reused on its own stream")
	}
	mustFree(t, a, c)
	mustFree(t, a, e)
}

func TestAllocRecordStream(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	b := mustAlloc(t, a, 4096, 1)
	a.RecordStream(b, 1) // own stream: nothing to wait for
	a.RecordStream(b, 2)
	a.RecordStream(b, 3)
	a.RecordStream(b, 2) // recorded once
	mustFree(t, a, b)
	if d.records != 2 {
		t.Errorf("%d events recorded, want 2", d.records)
	}
	st := a.Stats()
	if st.Allocated.Current != 0 || st.Active.Current != 4096 || st.ActiveBlocks != 1 {
		t.Errorf("pending block stats %+v", st)
	}
	c := mustAlloc(t, a, 4096, 1)
	if c.Ptr() == b.Ptr() {
		t.Errorf("block reused before its events completed")
	}
	d.complete(2)
	e := mustAlloc(t, a, 4096, 1)
	if e.Ptr() == b.Ptr() {
		t.Errorf("block reused before all its events completed")
	}
	d.complete(3)
	f := mustAlloc(t, a, 4096, 1)
	if f.Ptr() != b.Ptr() {
		t.Errorf("block not reused after its events completed: %#x, want %#x", f.Ptr(), b.Ptr())
	}
	if d.destroys != 2 || d.eventsUp != 0 {
		t.Errorf("%d events destroyed, %d left", d.destroys, d.eventsUp)
	}
	for _, x := range []Block{c, e, f} {
		mustFree(t, a, x)
	}
	if d.records != 2 {
		t.Errorf("events recorded for blocks without RecordStream")
	}
}

func TestAllocPrivatePool(t *testing.T) {
	a, d := newTestAllocator(t, 1<<30, 0)
	// A cached general segment that the pool must not use.
	mustFree(t, a, mustAlloc(t, a, 1000, 1))

	id := a.BeginPrivatePool(1)
	x := mustAlloc(t, a, 1000, 1)
	y := mustAlloc(t, a, 3*oneMiB, 1)
	if segOf(a, x).pool.private == nil || segOf(a, y).pool.private == nil {
		t.Fatal("blocks not from the private pool")
	}
	if allocs, _, _ := d.counts(); allocs != 3 {
		t.Errorf("driver allocs %d, want 3 (general cache not used)", allocs)
	}
	// Other streams are not captured.
	o := mustAlloc(t, a, 1000, 2)
	if segOf(a, o).pool != &a.small {
		t.Errorf("stream 2 allocated from the private pool")
	}
	// Nested pools.
	id2 := a.BeginPrivatePool(1)
	z := mustAlloc(t, a, 1000, 1)
	if segOf(a, z).pool.private.id != id2 {
		t.Errorf("nested pool not used")
	}
	a.EndPrivatePool(1)
	x2 := mustAlloc(t, a, 1000, 1)
	if segOf(a, x2) != segOf(a, x) {
		t.Errorf("outer pool not used after the inner one ended")
	}
	a.EndPrivatePool(1)
	if err := a.ReleasePool(id2); err != nil {
		t.Fatal(err)
	}

	// After the capture, stream 1 allocates from the general cache, and a
	// freed block of the pool stays in the pool.
	g := mustAlloc(t, a, 1000, 1)
	if segOf(a, g).pool != &a.small {
		t.Errorf("allocation after EndPrivatePool came from the pool")
	}
	xp := x.Ptr()
	mustFree(t, a, x)
	g2 := mustAlloc(t, a, 1000, 1)
	if g2.Ptr() == xp || segOf(a, g2).pool != &a.small {
		t.Errorf("general allocation reused a private block")
	}
	// Private segments survive EmptyCache and the OOM path.
	mustFree(t, a, x2)
	mustFree(t, a, y)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().Segments; got != 5 { // 2 general small (g, o), the pool's 2, the nested pool's
		t.Errorf("%d segments after EmptyCache, want 5", got)
	}
	check(t, a)

	if err := a.ReleasePool(id); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleasePool(id); err == nil {
		t.Errorf("second ReleasePool succeeded")
	}
	if err := a.ReleasePool(12345); err == nil {
		t.Errorf("ReleasePool of unknown pool succeeded")
	}
	check(t, a)
	// z still holds the nested pool; its segment joins the cache when freed.
	mustFree(t, a, z)
	mustFree(t, a, o)
	mustFree(t, a, g)
	mustFree(t, a, g2)
	if len(a.private) != 0 {
		t.Errorf("%d private pools left", len(a.private))
	}
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Segments != 0 || st.Reserved.Current != 0 {
		t.Errorf("after release and EmptyCache: %+v", st)
	}

	// ReleasePool of a pool still capturing is refused.
	id3 := a.BeginPrivatePool(4)
	if err := a.ReleasePool(id3); err == nil {
		t.Errorf("ReleasePool of an active pool succeeded")
	}
	a.EndPrivatePool(4)
	if err := a.ReleasePool(id3); err != nil {
		t.Error(err)
	}
	check(t, a)
}

func TestAllocPrivatePoolReuse(t *testing.T) {
	// Graph-capture pattern: during capture, intermediate blocks are freed
	// and reused within the pool, at stable addresses.
	a, _ := newTestAllocator(t, 1<<30, 0)
	id := a.BeginPrivatePool(1)
	t1 := mustAlloc(t, a, 8192, 1)
	p := t1.Ptr()
	mustFree(t, a, t1)
	t2 := mustAlloc(t, a, 8192, 1)
	if t2.Ptr() != p {
		t.Errorf("pool did not reuse its own freed block")
	}
	a.EndPrivatePool(1)
	mustFree(t, a, t2)
	if err := a.ReleasePool(id); err != nil {
		t.Fatal(err)
	}
	// Now in the general cache.
	g := mustAlloc(t, a, 8192, 1)
	if g.Ptr() != p {
		t.Errorf("released pool's segment not reused by the general cache")
	}
	if st := a.Stats(); st.DriverAllocs != 1 {
		t.Errorf("driver allocs %d", st.DriverAllocs)
	}
}

func TestAllocMemorySummary(t *testing.T) {
	a, _ := newTestAllocator(t, 1<<30, 64*oneMiB)
	b := mustAlloc(t, a, 3*oneMiB, 0)
	s := a.MemorySummary()
	for _, want := range []string{"Allocated memory", "3.00 MiB", "Reserved memory", "20.00 MiB",
		"Cache hits / misses", "Limit", "64.00 MiB", "Segments"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for _, l := range lines {
		if len(l) != len(lines[0]) {
			t.Errorf("ragged table line %q", l)
		}
	}
	mustFree(t, a, b)
}

// fillWithPending leaves a 2 MiB device full, with one block of it freed on
// stream 1 but waiting for an event on stream 2.
func fillWithPending(t *testing.T, dm DeviceMemory) (*Allocator, Block, Block) {
	t.Helper()
	a := NewAllocator(dm, AllocatorOptions{SharedSegment: 20 * oneMiB})
	b := mustAlloc(t, a, oneMiB, 1)
	c := mustAlloc(t, a, oneMiB, 1)
	a.RecordStream(b, 2)
	mustFree(t, a, b)
	return a, b, c
}

func TestAllocEventSynchronize(t *testing.T) {
	// Without EventSynchronize the allocator can only poll, and says why
	// the memory is not free.
	d := newFakeDevice(2 * oneMiB)
	a, _, _ := fillWithPending(t, d)
	_, err := a.Alloc(oneMiB, 1)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || oom.AwaitingEvents != oneMiB || oom.ReservedUnallocated != oneMiB {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(err.Error(), "(1.00 MiB reserved but unallocated, 1.00 MiB of it awaiting stream events, largest free block 0.00 MiB)") {
		t.Errorf("message %q", err.Error())
	}
	check(t, a)

	// With it, the last stage waits for the event and reuses the block.
	sd := &syncFakeDevice{fakeDevice: newFakeDevice(2 * oneMiB)}
	a, b, c := fillWithPending(t, sd)
	e := mustAlloc(t, a, oneMiB, 1)
	if e.Ptr() != b.Ptr() || sd.syncs != 1 {
		t.Errorf("got %#x after %d syncs, want %#x after 1", e.Ptr(), sd.syncs, b.Ptr())
	}
	if st := a.Stats(); st.OOMs != 0 || st.DriverAllocs != 1 {
		t.Errorf("stats %+v", st)
	}
	// EmptyCache waits too, so the segment goes back.
	a.RecordStream(e, 2)
	mustFree(t, a, e)
	mustFree(t, a, c)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Reserved.Current != 0 || sd.syncs != 2 {
		t.Errorf("after EmptyCache: %+v, %d syncs", st, sd.syncs)
	}
	check(t, a)

	// A failing wait is reported.
	a, _, _ = fillWithPending(t, &syncFakeDevice{fakeDevice: newFakeDevice(2 * oneMiB), syncErr: errFakeDriver})
	if _, err := a.Alloc(oneMiB, 1); !errors.Is(err, errFakeDriver) {
		t.Errorf("Alloc with failing EventSynchronize: %v", err)
	}
	check(t, a)
}

// TestAllocOwnSegments: by default every large request gets its own segment
// rounded to 2 MiB, so a small workload reserves little more than it uses.
func TestAllocOwnSegments(t *testing.T) {
	d := newFakeDevice(oneGiB)
	a := NewAllocator(d, AllocatorOptions{})
	for _, c := range []struct{ req, seg int }{
		{oneMiB + 1, 2 * oneMiB}, {3 * oneMiB, 4 * oneMiB}, {10*oneMiB - 512, 10 * oneMiB}, {10*oneMiB + 1, 12 * oneMiB},
	} {
		if got := segmentSize(roundSize(c.req), 0); got != c.seg {
			t.Errorf("segmentSize(%d) = %d, want %d", c.req, got, c.seg)
		}
	}
	b1, err := a.Alloc(3*oneMiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := a.Alloc(5*oneMiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Reserved.Current != 4*oneMiB+6*oneMiB || st.DriverAllocs != 2 {
		t.Errorf("reserved %d in %d driver allocations, want 10 MiB in 2", st.Reserved.Current, st.DriverAllocs)
	}
	a.Free(b1)
	a.Free(b2)
	// A freed 6 MiB segment serves a 4.5 MiB request without the driver.
	b3, err := a.Alloc(4*oneMiB+oneMiB/2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.DriverAllocs != 2 {
		t.Errorf("%d driver allocations, want the cached segment reused", st.DriverAllocs)
	}
	a.Free(b3)
}

// stepSizes is a LeNet-like training step at batch size bs: the large
// tensors it allocates (bytes), in order; each is freed in reverse order at
// the end of the step, with the im2col workspaces freed right after use.
func stepSizes(bs int) []int {
	return []int{bs * 784 * 4, bs * 25 * 576 * 4, bs * 20 * 576 * 4, bs * 500 * 64 * 4, bs * 50 * 64 * 4, bs * 20 * 576 * 4}
}

func runStep(t *testing.T, a *Allocator, bs int) {
	t.Helper()
	var live []Block
	for i, n := range stepSizes(bs) {
		b := mustAlloc(t, a, n, 0)
		if i == 1 || i == 3 { // workspaces
			mustFree(t, a, b)
			continue
		}
		live = append(live, b)
	}
	for i := len(live) - 1; i >= 0; i-- {
		mustFree(t, a, live[i])
	}
}

// TestAllocBatchSweep: batch sizes 64, 65, ..., 80 and back down. Segments
// outgrown as the batch grows are given back on the next miss, so reserved
// memory follows the memory in use instead of ratcheting up.
func TestAllocBatchSweep(t *testing.T) {
	a := NewAllocator(newFakeDevice(oneGiB), AllocatorOptions{})
	for bs := 64; bs <= 80; bs++ {
		runStep(t, a, bs)
	}
	for bs := 79; bs >= 64; bs-- {
		runStep(t, a, bs)
	}
	check(t, a)
	st := a.Stats()
	ratio := float64(st.Reserved.Peak) / float64(st.Allocated.Peak)
	t.Logf("peak reserved %d, peak allocated %d: %.3fx, %d driver allocations", st.Reserved.Peak, st.Allocated.Peak, ratio, st.DriverAllocs)
	if ratio > 1.25 {
		t.Errorf("peak reserved %.3fx peak allocated", ratio)
	}
}

// TestAllocSteadySteps: the same step again and again reaches a state in
// which it never calls the driver.
func TestAllocSteadySteps(t *testing.T) {
	a := NewAllocator(newFakeDevice(oneGiB), AllocatorOptions{})
	runStep(t, a, 64)
	runStep(t, a, 64)
	before := a.Stats().DriverAllocs
	for range 20 {
		runStep(t, a, 64)
	}
	if got := a.Stats().DriverAllocs; got != before {
		t.Errorf("%d driver allocations in steady state", got-before)
	}
}

// When an allocator's generation numbers run out they start again within
// its own range: Blocks keep naming their allocator and stay freeable.
func TestAllocGenerationWrap(t *testing.T) {
	a, _ := newTestAllocator(t, oneGiB, 0)
	a.mu.Lock()
	a.gen = uint64(a.id)<<genShift | (1<<genShift - 2)
	a.mu.Unlock()
	x := mustAlloc(t, a, 100, 0) // the last generation
	y := mustAlloc(t, a, 100, 0) // wraps
	if x.owner() != a.id || y.owner() != a.id || y.gen != uint64(a.id)<<genShift+1 {
		t.Fatalf("generations %#x %#x, owner %d %d, allocator %d", x.gen, y.gen, x.owner(), y.owner(), a.id)
	}
	mustFree(t, a, x)
	mustFree(t, a, y)
}
