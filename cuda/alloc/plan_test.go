package alloc

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// step is one request (size > 0, the block named id) or the free of block
// id (size 0) of a sequence run through a pool.
type step struct{ id, size int }

// fragmenting: after A, B, C and E, A and C are freed, leaving two 4 MiB
// holes apart, and D (8 MiB) fits neither: best fit grows to 26 MiB for 18
// in use at most.
var fragmenting = []step{
	{0, 4 * oneMiB}, {1, 8 * oneMiB}, {2, 4 * oneMiB}, {4, 2 * oneMiB}, {0, 0}, {2, 0}, {3, 8 * oneMiB},
}

// run plays seq in a pool begun by begin on stream 0 and returns the live
// blocks at its end, by id.
func run(t *testing.T, a *Allocator, seq []step) map[int]Block {
	t.Helper()
	live := map[int]Block{}
	for _, s := range seq {
		if s.size == 0 {
			mustFree(t, a, live[s.id])
			delete(live, s.id)
			continue
		}
		live[s.id] = mustAlloc(t, a, s.size, 0)
	}
	return live
}

// freeAll frees the blocks run left and releases the pool.
func freeAll(t *testing.T, a *Allocator, id PoolID, live map[int]Block) {
	t.Helper()
	for _, b := range live {
		mustFree(t, a, b)
	}
	if err := a.ReleasePool(id); err != nil {
		t.Fatal(err)
	}
	check(t, a)
}

// A traced pool maps nothing and reserves nothing; the plan from its trace
// puts the fragmenting sequence in the 18 MiB it has in use at most, where
// best fit took 26, and a planned pool follows it without a miss.
func TestPlanPlacesTracedSequence(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 0)

	online := a.BeginPrivatePool(0)
	live := run(t, a, fragmenting)
	a.EndPrivatePool(0)
	if r := a.Stats().Reserved.Current; r != 26*oneMiB {
		t.Fatalf("best fit reserved %d MiB, want 26 (the case this test is about)", r>>20)
	}
	freeAll(t, a, online, live)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}

	traced, err := a.BeginTracePool(0)
	if err != nil {
		t.Fatal(err)
	}
	live = run(t, a, fragmenting)
	a.EndPrivatePool(0)
	if st := a.Stats(); st.Reserved.Current != 0 || st.Reserved.Peak != 26*oneMiB || d.mappedPages() != 0 {
		t.Errorf("traced pool: reserved %d (peak %d MiB), %d pages mapped; want nothing added", st.Reserved.Current, st.Reserved.Peak>>20, d.mappedPages())
	}
	plan, err := a.Plan(traced)
	if err != nil {
		t.Fatal(err)
	}
	freeAll(t, a, traced, live)
	if plan.Requests() != 5 || plan.Live() != 18*oneMiB || plan.Span() != 18*oneMiB {
		t.Fatalf("plan: %d requests, live %d, span %d; want 5, 18 MiB, 18 MiB", plan.Requests(), plan.Live(), plan.Span())
	}
	d.mu.Lock()
	ranges := len(d.ranges)
	d.mu.Unlock()
	if ranges != 0 {
		t.Errorf("the released traced pool left %d address ranges", ranges)
	}

	a.ResetPeakStats()
	planned := a.BeginPlannedPool(0, plan)
	live = run(t, a, fragmenting)
	a.EndPrivatePool(0)
	if st := a.Stats(); st.Reserved.Peak != 18*oneMiB {
		t.Errorf("planned pool reserved %d MiB at its peak, want 18", st.Reserved.Peak>>20)
	}
	if m := a.PlanMisses(planned); m != 0 {
		t.Errorf("%d requests missed the plan, want 0", m)
	}
	freeAll(t, a, planned, live)
}

// A sequence that departs from the plan (a request of another size, one
// more at the end) still gets valid blocks, by best fit; a block placed so
// may take a later request's place, which then misses too.
func TestPlanMissFallsBackToBestFit(t *testing.T) {
	a, _ := newExpandableAllocator(t, oneGiB, 0)
	traced, err := a.BeginTracePool(0)
	if err != nil {
		t.Fatal(err)
	}
	live := run(t, a, fragmenting)
	a.EndPrivatePool(0)
	plan, err := a.Plan(traced)
	if err != nil {
		t.Fatal(err)
	}
	freeAll(t, a, traced, live)

	other := append([]step{}, fragmenting...)
	other[2] = step{2, 6 * oneMiB}
	other = append(other, step{5, 3 * oneMiB})
	planned := a.BeginPlannedPool(0, plan)
	live = run(t, a, other)
	a.EndPrivatePool(0)
	if m := a.PlanMisses(planned); m < 2 || m > 3 {
		t.Errorf("%d misses, want the resized request, the extra one and at most one displaced", m)
	}
	freeAll(t, a, planned, live)
}

// planTrace on random sequences: no two blocks whose lifetimes overlap
// share a byte, and the span is at least the peak in use.
func TestPlanTraceRandomSequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 200 {
		tr := &poolTrace{}
		var live []int32
		for range 1 + rng.IntN(120) {
			if len(live) > 0 && rng.IntN(3) == 0 {
				k := rng.IntN(len(live))
				tr.free(live[k])
				live = append(live[:k], live[k+1:]...)
				continue
			}
			live = append(live, tr.alloc(minBlockSize*(1+rng.IntN(64))))
		}
		p := planTrace(tr)
		start := make([]int, len(tr.sizes))
		end := make([]int, len(tr.sizes))
		for i := range end {
			end[i] = len(tr.events)
		}
		for at, e := range tr.events {
			if e >= 0 {
				start[e] = at
			} else {
				end[^e] = at
			}
		}
		for i := range tr.sizes {
			if p.offsets[i]%minBlockSize != 0 || p.offsets[i]+tr.sizes[i] > p.span {
				t.Fatalf("trial %d: block %d at %d (+%d) outside the span %d or unaligned", trial, i, p.offsets[i], tr.sizes[i], p.span)
			}
			for j := range i {
				if start[i] < end[j] && start[j] < end[i] &&
					p.offsets[i] < p.offsets[j]+tr.sizes[j] && p.offsets[j] < p.offsets[i]+tr.sizes[i] {
					t.Fatalf("trial %d: blocks %d and %d are live together and overlap", trial, i, j)
				}
			}
		}
		if p.span < p.live {
			t.Fatalf("trial %d: span %d below the peak in use %d", trial, p.span, p.live)
		}
	}
}

// Without address space of its own a pool cannot go without memory.
func TestTracePoolNeedsExpandableSegments(t *testing.T) {
	a := NewAllocator(newFakeDevice(oneGiB), AllocatorOptions{})
	if _, err := a.BeginTracePool(0); !errors.Is(err, ErrNoAddressSpace) {
		t.Errorf("BeginTracePool without expandable segments: %v, want ErrNoAddressSpace", err)
	}
}

// Materialize maps pages under the blocks a traced pool still holds (and
// no others), counts them as reserved, and gives them back with the pool.
func TestMaterializeKeptBlocks(t *testing.T) {
	a, d := newExpandableAllocator(t, oneGiB, 0)
	id, err := a.BeginTracePool(0)
	if err != nil {
		t.Fatal(err)
	}
	gone := mustAlloc(t, a, 5*oneMiB, 0)
	kept := mustAlloc(t, a, 3*oneMiB, 0)
	mustFree(t, a, gone)
	a.EndPrivatePool(0)
	ranges, err := a.Materialize(id)
	if err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if len(ranges) != 1 || ranges[0][0] != kept.Ptr() || int(ranges[0][1]) != kept.Size() {
		t.Fatalf("Materialize: %v, want the kept block's range alone", ranges)
	}
	// The kept block starts 5 MiB in: its 3 MiB cross pages 2 and 3.
	if d.mappedPages() != 2 || a.Stats().Reserved.Current != 4*oneMiB {
		t.Errorf("%d pages mapped, %d bytes reserved; want the 2 pages under the kept block", d.mappedPages(), a.Stats().Reserved.Current)
	}
	if err := a.ReleasePool(id); err != nil {
		t.Fatal(err)
	}
	mustFree(t, a, kept) // the pool goes with it
	check(t, a)
	if d.mappedPages() != 0 || a.Stats().Reserved.Current != 0 {
		t.Errorf("after the pool: %d pages mapped, %d bytes reserved; want none", d.mappedPages(), a.Stats().Reserved.Current)
	}
}
