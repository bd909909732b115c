package alloc

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// logUniformSize draws a size whose logarithm is uniform between 1 B and
// max, so that tiny, small and large requests all occur often.
func logUniformSize(rng *rand.Rand, max int) int {
	return int(math.Exp(rng.Float64() * math.Log(float64(max))))
}

type liveBlock struct {
	b Block
	s Stream
}

// TestAllocStress runs a long random sequence of allocations and frees on two
// streams under a limit and checks the allocator after every operation: the
// segment touched in full plus the global counters, and everything every
// fullEvery operations.
func TestAllocStress(t *testing.T) {
	t.Run("shared 20 MiB segments", func(t *testing.T) { allocStress(t, 20*oneMiB, false) })
	t.Run("own segments (default)", func(t *testing.T) { allocStress(t, 0, false) })
	t.Run("expandable segments", func(t *testing.T) { allocStress(t, 0, true) })
}

func allocStress(t *testing.T, shared int, expandable bool) {
	ops := 500_000
	if testing.Short() || allocRaceEnabled {
		ops = 100_000
	}
	const (
		limit     = 768 * oneMiB
		maxLive   = 160
		fullEvery = 50
	)
	rng := rand.New(rand.NewPCG(20240611, 1))
	d := newFakeDevice(4 * oneGiB)
	a := NewAllocator(d, AllocatorOptions{Limit: limit, SharedSegment: shared, Expandable: expandable})
	var live []liveBlock
	var nOOM, nAlloc, nFree, nRecord int

	for op := 0; op < ops; op++ {
		var seg *memSegment
		r := rng.IntN(1000)
		switch {
		case r < 5:
			d.complete(Stream(1 + rng.IntN(2)))
		case r < 6:
			if err := a.EmptyCache(); err != nil {
				t.Fatalf("op %d: EmptyCache: %v", op, err)
			}
		case len(live) == 0 || (len(live) < maxLive && r < 500):
			n := logUniformSize(rng, 64*oneMiB)
			s := Stream(1 + rng.IntN(2))
			b, err := a.Alloc(n, s)
			if err != nil {
				var oom *OutOfMemoryError
				if !errors.As(err, &oom) {
					t.Fatalf("op %d: Alloc(%d): %v", op, n, err)
				}
				if oom.Reserved > limit || oom.ReservedUnallocated != oom.Reserved-oom.Allocated ||
					oom.Requested != n || oom.Rounded != roundSize(n) || oom.Limit != limit {
					t.Fatalf("op %d: inconsistent %+v", op, oom)
				}
				// Failing is legitimate only if the limit really stops
				// the smallest segment that could hold the request.
				if oom.Reserved+minSegmentSize(oom.Rounded) <= limit && oom.DeviceFree >= minSegmentSize(oom.Rounded) {
					t.Fatalf("op %d: OOM although %d bytes fit: %v", op, oom.Rounded, oom)
				}
				nOOM++
				break
			}
			if a.Requested(b) != n || b.Size() < roundSize(n) || b.Ptr()%minBlockSize != 0 {
				t.Fatalf("op %d: bad block %#x %d/%d for %d", op, b.Ptr(), b.Size(), a.Requested(b), n)
			}
			if err := checkBlock(a, b); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
			live = append(live, liveBlock{b, s})
			seg = segOf(a, b)
			nAlloc++
		default:
			i := rng.IntN(len(live))
			lb := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			if rng.IntN(10) == 0 {
				a.RecordStream(lb.b, 3-lb.s) // the other stream
				nRecord++
			}
			seg = segOf(a, lb.b)
			if err := a.Free(lb.b); err != nil {
				t.Fatalf("op %d: Free: %v", op, err)
			}
			nFree++
		}
		if seg != nil {
			if err := a.checkSegment(seg); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
		}
		if op%fullEvery == 0 {
			if err := a.checkInvariants(); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
			for _, lb := range live {
				if err := checkBlock(a, lb.b); err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
			}
			if _, _, used := d.counts(); used != a.Stats().Reserved.Current {
				t.Fatalf("op %d: driver holds %d, allocator reserves %d", op, used, a.Stats().Reserved.Current)
			}
		}
	}
	st := a.Stats()
	t.Logf("%d ops: %d allocs, %d frees (%d after RecordStream), %d OOMs; %+v", ops, nAlloc, nFree, nRecord, nOOM, st)
	if st.Reserved.Peak > limit {
		t.Errorf("reserved peak %d over the limit", st.Reserved.Peak)
	}
	if nOOM == 0 || st.Retries == 0 || st.CacheHits == 0 {
		t.Errorf("the sequence did not exercise the OOM path and the cache")
	}

	for _, lb := range live {
		if err := a.Free(lb.b); err != nil {
			t.Fatal(err)
		}
	}
	d.completeAll()
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if err := a.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	st = a.Stats()
	if st.Allocated.Current != 0 || st.Requested.Current != 0 || st.Active.Current != 0 || st.Reserved.Current != 0 {
		t.Errorf("after freeing everything: %+v", st)
	}
	if _, _, used := d.counts(); used != 0 || d.eventsUp != 0 {
		t.Errorf("driver still holds %d bytes and %d events", used, d.eventsUp)
	}
}
