package alloc

// Planned placement of a captured sequence.
//
// A private pool placing its blocks online (best fit, as they come)
// leaves holes: in a transformer's captured step the pool grew for a
// 96 MiB gradient while 83 MiB lay free below it in three holes, and
// reserved 910 MiB for a peak of 826 in use. A captured step is the same
// sequence of requests and frees every time it is captured, so it can be
// placed knowing when each block is freed, which an online allocator
// cannot. Two pools serve that:
//
//   - A traced pool (BeginTracePool) has address space and no memory
//     behind it: a capture on it records its kernels, which never run (the
//     graph is discarded), and the pool records the sizes of its requests
//     and the order of their allocations and frees. Nothing counts as
//     reserved.
//   - Plan turns that record into a MemoryPlan: the blocks, largest first,
//     each at the lowest offset free for its whole lifetime.
//   - A planned pool (BeginPlannedPool) gives its n-th request the plan's
//     n-th offset when the sizes match and that range is free; any other
//     request (the sequence changed) goes to best fit in the same pool.
//
// The capture that records must be a rehearsal of the real one: whatever
// it allocates and keeps holds no memory, and the work that would have
// filled it never runs.

import (
	"errors"
	"fmt"
	"slices"
)

// poolTrace is a traced pool's record: the size of each request, and the
// allocations (request i) and frees (^i) in order.
type poolTrace struct {
	sizes  []int
	events []int32
}

func (t *poolTrace) alloc(size int) int32 {
	i := int32(len(t.sizes))
	t.sizes = append(t.sizes, size)
	t.events = append(t.events, i)
	return i
}

func (t *poolTrace) free(i int32) { t.events = append(t.events, ^i) }

// MemoryPlan is where a captured sequence's blocks go in a planned pool:
// the offset of each request from the start of the pool's range.
type MemoryPlan struct {
	sizes, offsets []int
	span, live     int
}

// Requests is the number of requests the plan places.
func (p *MemoryPlan) Requests() int { return len(p.sizes) }

// Span is the bytes the plan's blocks take from the start of the range:
// what a planned pool maps when the sequence follows the plan.
func (p *MemoryPlan) Span() int { return p.span }

// Live is the most bytes of the sequence in use at once, the least any
// placement needs.
func (p *MemoryPlan) Live() int { return p.live }

// planTrace places the traced blocks. A block's lifetime runs from its
// allocation to its free (to the end for one never freed); blocks go
// largest first (then earliest), each at the lowest offset where it
// overlaps no block already placed whose lifetime overlaps its own. Large
// blocks first leave the small ones to fill the holes between them; on the
// recorded steps of the zoo's models this reached the peak in use exactly.
func planTrace(t *poolTrace) *MemoryPlan {
	n := len(t.sizes)
	start := make([]int, n)
	end := make([]int, n)
	for i := range end {
		end[i] = len(t.events)
	}
	live, peak := 0, 0
	for at, e := range t.events {
		if e >= 0 {
			start[e] = at
			live += t.sizes[e]
			peak = max(peak, live)
		} else {
			end[^e] = at
			live -= t.sizes[^e]
		}
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		if t.sizes[x] != t.sizes[y] {
			return t.sizes[y] - t.sizes[x]
		}
		return start[x] - start[y]
	})
	p := &MemoryPlan{sizes: slices.Clone(t.sizes), offsets: make([]int, n), live: peak}
	type span struct{ lo, hi int }
	var placed []int // blocks placed so far
	var busy []span
	for _, i := range order {
		busy = busy[:0]
		for _, j := range placed {
			if start[j] < end[i] && start[i] < end[j] {
				busy = append(busy, span{p.offsets[j], p.offsets[j] + p.sizes[j]})
			}
		}
		slices.SortFunc(busy, func(a, b span) int { return a.lo - b.lo })
		off := 0
		for _, b := range busy {
			if b.lo >= off+p.sizes[i] {
				break // the gap below b fits
			}
			off = max(off, b.hi)
		}
		p.offsets[i] = off
		p.span = max(p.span, off+p.sizes[i])
		placed = append(placed, i)
	}
	return p
}

// ErrNoAddressSpace is BeginTracePool's error where the allocator does not
// map pages (no virtual memory management, or AllocatorOptions.Expandable
// off): a pool without memory behind it needs address space of its own.
var ErrNoAddressSpace = errors.New("cuda: a traced pool needs expandable segments")

// MapsPages reports whether the allocator maps pages into address ranges
// of its own (expandable segments), which a traced pool needs.
func (a *Allocator) MapsPages() bool { return a.vm != nil }

// BeginTracePool is BeginPrivatePool for a rehearsal: the pool's blocks
// have addresses and no memory (no work may run on them, and none counts
// as reserved), and while it is active the pool records its requests for
// Plan. Release it with ReleasePool once its blocks are freed; a block
// kept past that keeps the address range until it is freed.
func (a *Allocator) BeginTracePool(s Stream) (PoolID, error) {
	if a.vm == nil {
		return 0, ErrNoAddressSpace
	}
	id := a.BeginPrivatePool(s)
	a.mu.Lock()
	defer a.mu.Unlock()
	pp := a.private[id]
	pp.virtual = true
	pp.trace = &poolTrace{}
	return id, nil
}

// Plan places the sequence that traced pool id recorded.
func (a *Allocator) Plan(id PoolID) (*MemoryPlan, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pp := a.private[id]
	if pp == nil || pp.trace == nil {
		return nil, fmt.Errorf("cuda: Plan(%d): no such traced pool", id)
	}
	return planTrace(pp.trace), nil
}

// BeginPlannedPool is BeginPrivatePool whose requests on s take the places
// p gives them, in order, while their sizes match p's and the place is
// free; any other request goes to best fit in the pool (PlanMisses
// counts them). A plan placed from another capture's trace (Plan) puts
// the same sequence in p.Span() bytes.
func (a *Allocator) BeginPlannedPool(s Stream, p *MemoryPlan) PoolID {
	id := a.BeginPrivatePool(s)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.private[id].plan = p
	return id
}

// PlanMisses is how many requests of planned pool id did not go where its
// plan placed them.
func (a *Allocator) PlanMisses(id PoolID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pp := a.private[id]; pp != nil {
		return pp.misses
	}
	return 0
}

// allocPlanned serves a request of a planned pool: at its planned place
// when it matches the plan and the place is free, else by best fit.
func (a *Allocator) allocPlanned(pp *privatePool, s Stream, bytes, rounded int) (Block, error) {
	i := pp.next
	pp.next++
	if p := pp.plan; i < len(p.sizes) && p.sizes[i] == rounded {
		c, err := a.carve(&pp.large, s, p.offsets[i], rounded)
		if err != nil {
			return Block{}, err
		}
		if c != nil {
			a.stats.CacheHits++
			return a.hand(&pp.large, c, bytes), nil
		}
	}
	pp.misses++
	return a.allocSlow(bytes, rounded, s)
}

// carve takes [off, off+size) of pool's expandable segment for s, mapping
// pages up to its end first, when that range lies in one free chunk; it
// returns the range's chunk, in no tree, or nil when it is not free.
func (a *Allocator) carve(pool *blockPool, s Stream, off, size int) (*memChunk, error) {
	seg := pool.expandableOf(s)
	if have := 0; seg == nil || seg.size < off+size {
		if seg != nil {
			have = seg.size
			if t := a.slots[seg.last]; t.state == chunkFree {
				have = int(t.ptr - seg.ptr) // expand extends the free tail
			}
		}
		t, err := a.expand(pool, s, off+size-have)
		if errors.Is(err, errNoSegment) {
			return nil, nil // best fit then reports it, through the usual stages
		}
		if err != nil {
			return nil, err
		}
		a.poolInsert(pool, t)
		seg = pool.expandableOf(s)
	}
	ptr := seg.ptr + uintptr(off)
	c := seg.first
	for c != nil && c.ptr+uintptr(c.size) <= ptr {
		c = a.slots[c.next]
	}
	if c == nil || c.state != chunkFree || c.ptr+uintptr(c.size) < ptr+uintptr(size) {
		return nil, nil
	}
	a.poolRemove(pool, c)
	if front := int(ptr - c.ptr); front > 0 {
		r := a.split(pool, c, front) // packed: every rest of 512 bytes or more splits
		a.poolInsert(pool, c)
		c = r
	}
	if r := a.split(pool, c, size); r != nil {
		a.poolInsert(pool, r)
	}
	return c, nil
}

// Materialize maps memory under the blocks of traced pool id that are
// still in use (a rehearsal kept them: tensors a step makes on first use
// and keeps) and returns their ranges, [ptr, ptr+bytes) each, for the
// caller to initialise; the rest of the pool stays address space. The
// pages go with the pool once its blocks are freed.
func (a *Allocator) Materialize(id PoolID) (ranges [][2]uintptr, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pp := a.private[id]
	if pp == nil || !pp.virtual {
		return nil, fmt.Errorf("cuda: Materialize(%d): no such traced pool", id)
	}
	if pp.kept == nil {
		pp.kept = map[uintptr]bool{}
	}
	page := uintptr(a.page)
	for _, seg := range pp.large.expandable {
		for c := seg.first; c != nil; c = a.slots[c.next] {
			if c.state == chunkFree {
				continue
			}
			for q := c.ptr &^ (page - 1); q < c.ptr+uintptr(c.size); q += page {
				if pp.kept[q] {
					continue
				}
				if err := a.vm.MapPages(q, a.page); err != nil {
					return ranges, fmt.Errorf("cuda: mapping a page under a kept block at %#x: %w", q, err)
				}
				pp.kept[q] = true
				bump(&a.stats.Reserved, a.page)
				a.stats.DriverAllocs++
			}
			ranges = append(ranges, [2]uintptr{c.ptr, uintptr(c.size)})
		}
	}
	return ranges, nil
}

// unmapKept gives back the pages Materialize mapped in [end, end+n) of
// traced pool pp's range.
func (a *Allocator) unmapKept(pp *privatePool, end uintptr, n int) error {
	for q := range pp.kept {
		if q < end || q >= end+uintptr(n) {
			continue
		}
		if err := a.vm.UnmapPages(q, a.page); err != nil {
			return fmt.Errorf("cuda: unmapping a kept block's page at %#x: %w", q, err)
		}
		delete(pp.kept, q)
		a.unreserve(a.page)
	}
	return nil
}
