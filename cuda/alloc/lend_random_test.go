package alloc

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// A lent block freed after RecordStream is only pending: work queued on the
// other stream may still read it, and a replay would write over it. It
// stays lent (Lent, EndLending) until its events are seen complete.
func TestAllocLendPendingFreeStaysLent(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		var a *Allocator
		var d *fakeDevice
		if expandable {
			a, d = newExpandableAllocator(t, oneGiB, 0)
		} else {
			d = newFakeDevice(oneGiB)
			a = NewAllocator(d, AllocatorOptions{})
		}
		id, out := capturedPool(t, a)
		a.BeginLending(0)
		b := mustAlloc(t, a, 20*oneMiB, 0)
		if a.Lent(id) != 1 {
			t.Fatalf("expandable %v: the 20 MiB block was not lent", expandable)
		}
		a.RecordStream(b, 1) // stream 1 reads it too
		mustFree(t, a, b)
		pending := false
		a.mu.Lock()
		for _, c := range a.slots {
			if c != nil && c.state == chunkPending && c.ptr == b.Ptr() {
				pending = c.seg.pool.private != nil && c.seg.pool.private.id == id
			}
		}
		a.mu.Unlock()
		if !pending {
			t.Fatalf("expandable %v: the freed lent block is not pending in the pool", expandable)
		}
		kept := a.EndLending()
		if kept == 0 || a.Lent(id) == 0 {
			t.Errorf("expandable %v: lent block freed but still pending on stream 1's event: EndLending %d, Lent %d; "+
				"a replay would now be allowed to overwrite it", expandable, kept, a.Lent(id))
		}
		d.completeAll()
		mustFree(t, a, mustAlloc(t, a, 512, 2)) // polls the events
		mustFree(t, a, out)
		if err := a.ReleasePool(id); err != nil {
			t.Fatal(err)
		}
		check(t, a)
	}
}

// A released private pool whose range the driver fails to unmap, released
// with its blocks free or at the free of its last one, reports the error,
// keeps the invariants (the pool stays, unmerged), and EmptyCache gives
// the range back once unmapping works again, as an unmap error in the
// general cache leaves it to a later try (TestAllocExpandableUnmapError).
func TestAllocReleasePoolUnmapError(t *testing.T) {
	for _, lateFree := range []bool{false, true} {
		a, d := newExpandableAllocator(t, oneGiB, 0)
		id := a.BeginPrivatePool(0)
		b := mustAlloc(t, a, 4*oneMiB, 0)
		a.EndPrivatePool(0)
		if !lateFree {
			mustFree(t, a, b)
		}
		d.set(func(d *fakeDevice) { d.unmapErr = errFakeDriver })
		var err error
		if lateFree {
			if err = a.ReleasePool(id); err != nil {
				t.Fatal(err)
			}
			err = a.Free(b) // the last block: the pool merges now
		} else {
			err = a.ReleasePool(id)
		}
		if !errors.Is(err, errFakeDriver) {
			t.Fatalf("late free %v: release with a failing unmap: %v", lateFree, err)
		}
		if err := a.checkInvariants(); err != nil {
			t.Errorf("late free %v: after the failed unmap: %v", lateFree, err)
		}
		d.set(func(d *fakeDevice) { d.unmapErr = nil })
		rerr := a.ReleasePool(id)
		if err := a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		if st := a.Stats(); st.Reserved.Current != 0 || d.mappedPages() != 0 {
			t.Errorf("late free %v: unmap works again (ReleasePool again: %v), EmptyCache done: reserved %d, %d pages mapped; the pool's range leaked",
				lateFree, rerr, st.Reserved.Current, d.mappedPages())
		}
	}
}

// TestAllocLendRandom runs random sequences of Alloc, Free (with and
// without RecordStream), event completion, Begin/EndPrivatePool,
// ReleasePool, Begin/EndLending, EmptyCache, SetLimit and driver failures
// on the fake driver, with expandable and ordinary segments, and checks
// every invariant after each step, plus a model of where each block must
// come from and of the lent counts.
func TestAllocLendRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	for cfg := 0; cfg < 8; cfg++ {
		expandable, limited, syncing := cfg&1 != 0, cfg&2 != 0, cfg&4 != 0
		for run := uint64(0); run < 4; run++ {
			s := seed + uint64(cfg)*1000 + run
			lendRandomRun(t, s, expandable, limited, syncing)
			if t.Failed() {
				t.Fatalf("seed %d, expandable %v, limit %v, sync %v", s, expandable, limited, syncing)
			}
		}
	}
}

type lendBlock struct {
	b    Block
	s    Stream
	lent PoolID // the pool it was lent by, 0 if none
}

func lendRandomRun(t *testing.T, seed uint64, expandable, limited, syncing bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	d := newFakeDevice(512 * oneMiB)
	var dm DeviceMemory = d
	if syncing {
		dm = &syncFakeDevice{fakeDevice: d}
	}
	limit := 0
	if limited {
		limit = 160 * oneMiB
	}
	a := NewAllocator(dm, AllocatorOptions{Limit: limit, Expandable: expandable})
	if expandable && a.vm == nil {
		t.Fatal("no virtual memory")
	}
	var live []lendBlock
	// pendingLent counts, per pool, lent blocks freed after RecordStream:
	// they stay lent until the allocator sees their events complete, which
	// it notices lazily, so the model bounds Lent between the live count
	// and the live count plus these.
	pendingLent := map[PoolID]int{}
	var pools []PoolID
	capture := map[Stream][]PoolID{}
	released := map[PoolID]bool{}
	lendDepth, lendStream := 0, Stream(0)
	const ops = 3000
	poolBytes := map[PoolID]int{}
	var nLent, nPool, nOOM, nPrivRanges int
	defer func() {
		t.Logf("seed %d expandable %v limit %v sync %v: %d lent, %d captured, %d OOMs, %d private ranges seen",
			seed, expandable, limited, syncing, nLent, nPool, nOOM, nPrivRanges)
	}()

	poolOf := func(b Block) *privatePool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.live(b).seg.pool.private
	}
	capturing := func(id PoolID) bool {
		for _, st := range capture {
			for _, p := range st {
				if p == id {
					return true
				}
			}
		}
		return false
	}
	for op := 0; op < ops; op++ {
		r := rng.IntN(100)
		switch {
		case r < 40:
			n := logUniformSize(rng, 32*oneMiB)
			if n < 1 {
				n = 1
			}
			s := Stream(rng.IntN(3))
			lentBefore := map[PoolID]int{}
			for _, id := range pools {
				lentBefore[id] = a.Lent(id)
			}
			b, err := a.Alloc(n, s)
			if err != nil {
				var oom *OutOfMemoryError
				if !errors.As(err, &oom) {
					t.Fatalf("op %d: Alloc(%d, %d): %v", op, n, s, err)
				}
				nOOM++
				break
			}
			rb := lendBlock{b: b, s: s}
			pp := poolOf(b)
			switch {
			case len(capture[s]) > 0:
				if top := capture[s][len(capture[s])-1]; pp == nil || pp.id != top {
					t.Fatalf("op %d: Alloc on stream %d during a capture of pool %d came from %v", op, s, top, pp)
				}
				nPool++
				if segOf(a, b).va > 0 {
					nPrivRanges++
				}
			case lendDepth > 0 && s == lendStream && pp != nil:
				if capturing(pp.id) || released[pp.id] {
					t.Fatalf("op %d: pool %d lent while capturing %v or released %v", op, pp.id, capturing(pp.id), released[pp.id])
				}
				// + 1, less pending lent blocks whose events the Alloc saw complete.
				if n := a.Lent(pp.id); n > lentBefore[pp.id]+1 || n < lentBefore[pp.id]+1-pendingLent[pp.id] {
					t.Fatalf("op %d: pool %d lent a block but counts %d, was %d", op, pp.id, n, lentBefore[pp.id])
				}
				rb.lent = pp.id
				nLent++
			case pp != nil:
				t.Fatalf("op %d: Alloc on stream %d, no capture or lending there, came from pool %d", op, s, pp.id)
			}
			live = append(live, rb)
		case r < 70:
			if len(live) == 0 {
				break
			}
			i := rng.IntN(len(live))
			rb := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			if rng.IntN(4) == 0 {
				a.RecordStream(rb.b, Stream((int(rb.s)+1+rng.IntN(2))%3))
				if rb.lent != 0 {
					pendingLent[rb.lent]++
				}
			}
			if err := a.Free(rb.b); err != nil {
				t.Fatalf("op %d: Free: %v", op, err)
			}
		case r < 76:
			if k := rng.IntN(4); k == 3 {
				d.completeAll()
			} else {
				d.complete(Stream(k))
			}
		case r < 82:
			s := Stream(rng.IntN(3))
			if rng.IntN(2) == 0 && len(capture[s]) < 3 {
				id := a.BeginPrivatePool(s)
				pools = append(pools, id)
				capture[s] = append(capture[s], id)
			} else if len(capture[s]) > 0 {
				a.EndPrivatePool(s)
				capture[s] = capture[s][:len(capture[s])-1]
				if len(capture[s]) == 0 {
					delete(capture, s)
				}
			}
		case r < 86:
			if len(pools) == 0 {
				break
			}
			id := pools[rng.IntN(len(pools))]
			err := a.ReleasePool(id)
			if released[id] || capturing(id) {
				if err == nil {
					t.Fatalf("op %d: ReleasePool(%d) released %v capturing %v succeeded", op, id, released[id], capturing(id))
				}
			} else if err != nil {
				t.Fatalf("op %d: ReleasePool(%d): %v", op, id, err)
			} else {
				released[id] = true
			}
		case r < 92:
			if lendDepth > 0 && rng.IntN(2) == 0 {
				held := 0
				for _, rb := range live {
					if rb.lent != 0 {
						held++
					}
				}
				pending := 0
				for _, n := range pendingLent {
					pending += n
				}
				if n := a.EndLending(); n < held || n > held+pending {
					t.Fatalf("op %d: EndLending says %d lent blocks held, the model %d to %d", op, n, held, held+pending)
				}
				lendDepth--
			} else {
				if lendDepth == 0 {
					lendStream = Stream(rng.IntN(2))
				}
				a.BeginLending(lendStream)
				lendDepth++
			}
		case r < 94:
			if err := a.EmptyCache(); err != nil {
				t.Fatalf("op %d: EmptyCache: %v", op, err)
			}
		case r < 96:
			if limited {
				a.SetLimit(64*oneMiB + rng.IntN(160)*oneMiB)
			}
		case r < 98:
			n := rng.IntN(3)
			d.set(func(d *fakeDevice) { d.failAllocs = n })
		default:
			a.ResetPeakStats()
		}
		if err := a.checkInvariants(); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
		held := map[PoolID]int{}
		for _, rb := range live {
			if rb.lent != 0 {
				held[rb.lent]++
			}
		}
		for _, id := range pools {
			if got := a.Lent(id); got < held[id] || got > held[id]+pendingLent[id] {
				t.Fatalf("op %d: pool %d: Lent %d, model %d to %d", op, id, got, held[id], held[id]+pendingLent[id])
			}
		}
		// A live pool's memory never shrinks (its graph replays on the
		// addresses of its free blocks too), and once its capture ended it
		// never grows (lending only takes its free blocks).
		a.mu.Lock()
		for _, id := range pools {
			pp := a.private[id]
			if pp == nil {
				delete(poolBytes, id)
				continue
			}
			n := 0
			for _, p := range []*blockPool{&pp.small, &pp.large} {
				for seg := p.segs; seg != nil; seg = seg.next {
					n += seg.size
				}
			}
			if was, ok := poolBytes[id]; ok && (n < was || (n != was && pp.capturing == 0)) {
				a.mu.Unlock()
				t.Fatalf("op %d: pool %d (capturing %d) holds %d bytes, held %d", op, id, pp.capturing, n, was)
			}
			poolBytes[id] = n
		}
		a.mu.Unlock()
		if _, _, used := d.counts(); used != a.Stats().Reserved.Current {
			t.Fatalf("op %d: driver holds %d, allocator reserves %d", op, used, a.Stats().Reserved.Current)
		}
	}

	// Unwind: everything must come back.
	for ; lendDepth > 0; lendDepth-- {
		a.EndLending()
	}
	for s, st := range capture {
		for range st {
			a.EndPrivatePool(s)
		}
	}
	for _, id := range pools {
		if !released[id] {
			if err := a.ReleasePool(id); err != nil {
				t.Fatalf("final ReleasePool(%d): %v", id, err)
			}
		}
	}
	for _, rb := range live {
		if err := a.Free(rb.b); err != nil {
			t.Fatalf("final Free: %v", err)
		}
	}
	d.completeAll()
	d.set(func(d *fakeDevice) { d.failAllocs = 0 })
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	st := a.Stats()
	if st.Allocated.Current != 0 || st.Active.Current != 0 || st.Reserved.Current != 0 || st.Segments != 0 || len(a.private) != 0 {
		t.Fatalf("after unwinding: %+v, %d private pools", st, len(a.private))
	}
	d.mu.Lock()
	ranges := len(d.ranges)
	d.mu.Unlock()
	if _, _, used := d.counts(); used != 0 || d.eventsUp != 0 || ranges != 0 || st.DriverAllocs != st.DriverFrees {
		t.Fatalf("driver still holds %d bytes, %d events, %d address ranges; driver allocs %d frees %d",
			used, d.eventsUp, ranges, st.DriverAllocs, st.DriverFrees)
	}
}
