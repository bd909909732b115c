package alloc

import "testing"

// capturedPool makes a private pool on stream 0 that held a 24 MiB and an
// 8 MiB block during its capture and freed them (a graph's transient
// tensors), and keeps a 1 MiB block (its output), as a captured step
// leaves its pool.
func capturedPool(t *testing.T, a *Allocator) (PoolID, Block) {
	t.Helper()
	id := a.BeginPrivatePool(0)
	big, small := mustAlloc(t, a, 24*oneMiB, 0), mustAlloc(t, a, 8*oneMiB, 0)
	out := mustAlloc(t, a, oneMiB, 0)
	mustFree(t, a, big)
	mustFree(t, a, small)
	a.EndPrivatePool(0)
	return id, out
}

// Lending hands an idle pool's free blocks to the lending stream's
// requests that fit them, without reserving more; what does not fit, and
// every request on another stream or outside lending, goes to the general
// cache. With ordinary and with expandable segments.
func TestAllocLendIdlePool(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		var a *Allocator
		if expandable {
			a, _ = newExpandableAllocator(t, oneGiB, 0)
		} else {
			a = NewAllocator(newFakeDevice(oneGiB), AllocatorOptions{})
		}
		id, out := capturedPool(t, a)
		reserved := a.Stats().Reserved.Current
		a.BeginLending(0)
		lent := mustAlloc(t, a, 20*oneMiB, 0)
		if segOf(a, lent).pool.private == nil || a.Lent(id) != 1 {
			t.Fatalf("expandable %v: 20 MiB while lending: not from the idle pool (lent %d)", expandable, a.Lent(id))
		}
		if got := a.Stats().Reserved.Current; got != reserved {
			t.Errorf("expandable %v: reserved %d after a lent block, want %d as before", expandable, got, reserved)
		}
		other := mustAlloc(t, a, 4*oneMiB, 1)   // another stream
		tooBig := mustAlloc(t, a, 64*oneMiB, 0) // no free block of the pool fits
		for _, b := range []Block{other, tooBig} {
			if segOf(a, b).pool.private != nil {
				t.Errorf("expandable %v: a block on stream 1 or of 64 MiB came from the private pool", expandable)
			}
		}
		check(t, a)
		mustFree(t, a, lent)
		if n := a.EndLending(); n != 0 || a.Lent(id) != 0 {
			t.Errorf("expandable %v: EndLending after freeing everything: %d still lent", expandable, n)
		}
		outside := mustAlloc(t, a, 4*oneMiB, 0)
		if segOf(a, outside).pool.private != nil {
			t.Errorf("expandable %v: a block after EndLending came from the private pool", expandable)
		}
		check(t, a)
		for _, b := range []Block{other, tooBig, outside, out} {
			mustFree(t, a, b)
		}
		if err := a.ReleasePool(id); err != nil {
			t.Fatal(err)
		}
		check(t, a)
	}
}

// A lent block still held when lending ends is counted, by EndLending and
// by the pool (Lent), until it is freed; the pool's release waits for it.
func TestAllocLendKeptBlock(t *testing.T) {
	a, _ := newExpandableAllocator(t, oneGiB, 0)
	id, out := capturedPool(t, a)
	a.BeginLending(0)
	kept := mustAlloc(t, a, 2*oneMiB, 0)
	if n := a.EndLending(); n != 1 || a.Lent(id) != 1 {
		t.Fatalf("a kept lent block: EndLending %d, Lent %d; want 1, 1", n, a.Lent(id))
	}
	mustFree(t, a, out)
	if err := a.ReleasePool(id); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if a.Stats().Segments != 1 {
		t.Errorf("%d segments: the released pool's range should stay while a lent block is held", a.Stats().Segments)
	}
	mustFree(t, a, kept)
	check(t, a)
	if st := a.Stats(); st.Segments != 0 || a.Lent(id) != 0 {
		t.Errorf("after the kept block's free: %d segments, %d lent; want the pool's range gone", st.Segments, a.Lent(id))
	}
}

// A pool that is capturing, or released, lends nothing; a capture begun
// inside a lending region takes its own pool's blocks; lending on a second
// stream at once panics.
func TestAllocLendOnlyIdlePools(t *testing.T) {
	a, _ := newExpandableAllocator(t, oneGiB, 0)
	id, out := capturedPool(t, a)
	a.BeginLending(0)
	inner := a.BeginPrivatePool(0)
	b := mustAlloc(t, a, 2*oneMiB, 0)
	if a.Lent(id) != 0 || segOf(a, b).pool.private == nil || segOf(a, b).pool.private.id != inner {
		t.Error("an Alloc inside a capture begun while lending did not come from the capture's pool")
	}
	a.EndPrivatePool(0)
	mustFree(t, a, b)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("BeginLending on stream 1 while stream 0 lends did not panic")
			}
		}()
		a.BeginLending(1)
	}()
	if n := a.EndLending(); n != 0 {
		t.Errorf("EndLending: %d lent", n)
	}
	mustFree(t, a, out)
	if err := a.ReleasePool(id); err != nil {
		t.Fatal(err)
	}
	a.BeginLending(0)
	if c := mustAlloc(t, a, 2*oneMiB, 0); segOf(a, c).pool.private != nil && segOf(a, c).pool.private.id == id {
		t.Error("a released pool lent a block")
	} else {
		mustFree(t, a, c)
	}
	a.EndLending()
	check(t, a)
}
