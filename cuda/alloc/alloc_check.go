package alloc

import (
	"cmp"
	"fmt"
	"slices"
)

// checkInvariants verifies the whole allocator state and recounts every
// statistic. It is for tests and debugging: it walks every chunk.
func (a *Allocator) checkInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checkAllLocked()
}

// checkSegment verifies one segment and the allocator-wide counters, cheaply
// enough to run after every operation of a long test.
func (a *Allocator) checkSegment(seg *memSegment) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seg.first != nil { // nil: returned to the driver
		if _, err := a.checkSegmentLocked(seg); err != nil {
			return err
		}
	}
	return a.checkCountersLocked(a.stats)
}

func (a *Allocator) pools() []*blockPool {
	ps := []*blockPool{&a.small, &a.large}
	ids := make([]PoolID, 0, len(a.private))
	for id := range a.private {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		pp := a.private[id]
		ps = append(ps, &pp.small, &pp.large)
	}
	return ps
}

// segTally is what checkSegmentLocked counts in one segment.
type segTally struct {
	allocated, requested, active, inactiveSplit int
	activeBlocks, free                          int
	largestFree                                 int
	live                                        int
	lent                                        int
}

func (a *Allocator) checkSegmentLocked(seg *memSegment) (segTally, error) {
	var n segTally
	pool := seg.pool
	if pool == nil {
		return n, fmt.Errorf("segment %#x has no pool", seg.ptr)
	}
	switch {
	case seg.va > 0:
		if a.vm == nil || seg.size <= 0 || seg.size%a.page != 0 || seg.size > seg.va ||
			!slices.Contains(pool.expandable, seg) {
			return n, fmt.Errorf("expandable segment %#x: %d of %d bytes mapped, page %d, pool private %v",
				seg.ptr, seg.size, seg.va, a.page, pool.private != nil)
		}
	case pool.small && seg.size != smallBuffer:
		return n, fmt.Errorf("small segment %#x has size %d", seg.ptr, seg.size)
	case !pool.small && (seg.size <= 0 || seg.size%roundLarge != 0):
		return n, fmt.Errorf("large segment %#x has size %d", seg.ptr, seg.size)
	}
	f := seg.first
	if f == nil || f.ptr != seg.ptr || f.prev != 0 {
		return n, fmt.Errorf("segment %#x: bad first chunk", seg.ptr)
	}
	next := seg.ptr
	sum := 0
	for c := f; c != nil; c = a.slots[c.next] {
		where := func() string { return fmt.Sprintf("segment %#x chunk %#x+%d", seg.ptr, c.ptr, c.size) }
		switch {
		case int(c.slot) >= len(a.slots) || a.slots[c.slot] != c:
			return n, fmt.Errorf("%s: not in its slot", where())
		case c.seg != seg:
			return n, fmt.Errorf("%s: chunk points at another segment", where())
		case c.stream != seg.stream:
			return n, fmt.Errorf("%s: stream %d, segment's %d", where(), c.stream, seg.stream)
		case c.ptr != next:
			return n, fmt.Errorf("%s: expected at %#x (gap or overlap)", where(), next)
		case c.size <= 0 || c.size%minBlockSize != 0:
			return n, fmt.Errorf("%s: size not a positive multiple of %d", where(), minBlockSize)
		case int(c.next) >= len(a.slots):
			return n, fmt.Errorf("%s: next slot %d out of range", where(), c.next)
		case c.next != 0 && a.slots[c.next].prev != c.slot:
			return n, fmt.Errorf("%s: next.prev broken", where())
		case c.next != 0 && c.state == chunkFree && a.slots[c.next].state == chunkFree:
			return n, fmt.Errorf("%s: two adjacent free chunks", where())
		case sum > seg.size:
			return n, fmt.Errorf("%s: chunks run past the segment (or loop)", where())
		}
		next += uintptr(c.size)
		sum += c.size
		if c.lent {
			if c.state == chunkFree || pool.private == nil {
				return n, fmt.Errorf("%s: lent, but not a private pool's block in use or pending", where())
			}
			n.lent++
		}
		switch c.state {
		case chunkFree:
			if c.gen != 0 || c.events != 0 || len(c.uses) != 0 {
				return n, fmt.Errorf("%s: free chunk with generation, events or uses", where())
			}
			if !pool.contains(c) {
				return n, fmt.Errorf("%s: free chunk not in its pool's tree", where())
			}
			n.free++
			n.largestFree = max(n.largestFree, c.size)
			if c.isSplit() {
				n.inactiveSplit += c.size
			}
		case chunkInUse:
			if c.gen>>genShift != uint64(a.id) || c.gen&(1<<genShift-1) == 0 {
				return n, fmt.Errorf("%s: in use with generation %d (last %d)", where(), c.gen, a.gen)
			}
			if c.events != 0 {
				return n, fmt.Errorf("%s: in use with pending events", where())
			}
			r := roundSize(c.requested)
			if c.requested <= 0 || r > c.size {
				return n, fmt.Errorf("%s: requested %d does not fit", where(), c.requested)
			}
			if shouldSplit(pool.small || pool.packed, c.size-r) {
				return n, fmt.Errorf("%s: rest %d should have been split off", where(), c.size-r)
			}
			n.allocated += c.size
			n.requested += c.requested
			n.active += c.size
			n.activeBlocks++
			n.live++
		case chunkPending:
			if c.gen != 0 || c.events <= 0 {
				return n, fmt.Errorf("%s: pending without events", where())
			}
			n.active += c.size
			n.activeBlocks++
			n.live++
		default:
			return n, fmt.Errorf("%s: bad state %d", where(), c.state)
		}
	}
	if sum != seg.size {
		return n, fmt.Errorf("segment %#x: chunks cover %d of %d bytes", seg.ptr, sum, seg.size)
	}
	if l := a.slots[seg.last]; l == nil || l.seg != seg || l.next != 0 || l.ptr+uintptr(l.size) != seg.ptr+uintptr(seg.size) {
		return n, fmt.Errorf("segment %#x: last chunk (slot %d) wrong", seg.ptr, seg.last)
	}
	return n, nil
}

// contains says whether c is in p's tree, by a search on c's key.
func (p *blockPool) contains(c *memChunk) bool {
	k := keyOf(c)
	for x := p.tree.root; x != nil; {
		i := x.search(k)
		if i < x.n && x.items[i].key == k {
			return x.items[i].slot == c.slot
		}
		x = x.kids[i]
	}
	return false
}

// checkTree verifies the B-tree of p: key order, node fill, equal leaf
// depth, cleared unused slots, and that every item is a free chunk of p
// under its current key. It returns the number of items.
func (a *Allocator) checkTree(p *blockPool) (int, error) {
	t := &p.tree
	if t.root == nil {
		if t.n != 0 {
			return 0, fmt.Errorf("empty tree counts %d items", t.n)
		}
		return 0, nil
	}
	count, leafDepth := 0, -1
	var prev *btKey
	var walk func(x *btNode, depth int, isRoot bool) error
	walk = func(x *btNode, depth int, isRoot bool) error {
		if x.n > btMaxItems || (!isRoot && x.n < btMinDegree-1) || (isRoot && x.n == 0 && !x.leaf()) {
			return fmt.Errorf("b-tree node with %d items", x.n)
		}
		for j := x.n; j < btMaxItems; j++ {
			if x.items[j] != (btItem{}) {
				return fmt.Errorf("b-tree node keeps a stale item")
			}
		}
		lastKid := x.n
		if x.leaf() {
			lastKid = -1
			if leafDepth < 0 {
				leafDepth = depth
			} else if leafDepth != depth {
				return fmt.Errorf("b-tree leaves at depths %d and %d", leafDepth, depth)
			}
		}
		for j := lastKid + 1; j <= btMaxItems; j++ {
			if x.kids[j] != nil {
				return fmt.Errorf("b-tree node keeps a stale child")
			}
		}
		for j := 0; j <= x.n; j++ {
			if lastKid >= 0 {
				if x.kids[j] == nil {
					return fmt.Errorf("b-tree internal node lacks child %d", j)
				}
				if err := walk(x.kids[j], depth+1, false); err != nil {
					return err
				}
			}
			if j == x.n {
				break
			}
			it := &x.items[j]
			if prev != nil && !prev.less(it.key) {
				return fmt.Errorf("b-tree order broken at %#x", it.key.ptr)
			}
			prev = &it.key
			count++
			if int(it.slot) >= len(a.slots) || a.slots[it.slot] == nil {
				return fmt.Errorf("b-tree item %#x names no chunk", it.key.ptr)
			}
			c := a.slots[it.slot]
			if it.key != keyOf(c) {
				return fmt.Errorf("b-tree item %#x does not match its chunk", it.key.ptr)
			}
			if c.state != chunkFree || c.seg == nil || c.seg.pool != p {
				return fmt.Errorf("tree chunk %#x is not a free chunk of this pool", c.ptr)
			}
		}
		return nil
	}
	if err := walk(t.root, 0, true); err != nil {
		return 0, err
	}
	if count != t.n {
		return 0, fmt.Errorf("tree counts %d items, holds %d", t.n, count)
	}
	return count, nil
}

func (a *Allocator) checkAllLocked() error {
	var total segTally
	reserved, virtual, segments, driverHeld := 0, 0, 0, 0
	var all []*memSegment
	for _, pool := range a.pools() {
		inTree, err := a.checkTree(pool)
		if err != nil {
			return err
		}
		nsegs, free, live, lent := 0, 0, 0, 0
		for seg := pool.segs; seg != nil; seg = seg.next {
			if seg.pool != pool {
				return fmt.Errorf("segment %#x is in the list of another pool", seg.ptr)
			}
			if seg.next != nil && seg.next.prev != seg {
				return fmt.Errorf("segment list broken at %#x", seg.ptr)
			}
			n, err := a.checkSegmentLocked(seg)
			if err != nil {
				return err
			}
			nsegs++
			free += n.free
			live += n.live
			lent += n.lent
			switch {
			case pool.private != nil && pool.private.virtual:
				virtual += seg.size // address space, and pages under kept blocks
				for p := range pool.private.kept {
					if p >= seg.ptr && p < seg.ptr+uintptr(seg.size) {
						reserved += a.page
						driverHeld++
					}
				}
			case seg.va > 0:
				reserved += seg.size
				driverHeld += seg.size / a.page // pages
			default:
				reserved += seg.size
				driverHeld++
			}
			total.allocated += n.allocated
			total.requested += n.requested
			total.active += n.active
			total.inactiveSplit += n.inactiveSplit
			total.activeBlocks += n.activeBlocks
			total.largestFree = max(total.largestFree, n.largestFree)
			all = append(all, seg)
		}
		streams := map[Stream]bool{}
		for _, seg := range pool.expandable {
			if seg.pool != pool || seg.va == 0 || seg.first == nil || streams[seg.stream] {
				return fmt.Errorf("pool's expandable segment %#x: not one live expandable segment per stream", seg.ptr)
			}
			streams[seg.stream] = true
		}
		if nsegs != pool.nsegs || free != inTree {
			return fmt.Errorf("pool counts %d segments / %d free, found %d / %d", pool.nsegs, inTree, nsegs, free)
		}
		if pp := pool.private; pp != nil && pool == &pp.large {
			live += a.liveCount(&pp.small)
			if live != pp.live {
				return fmt.Errorf("private pool %d counts %d live blocks, found %d", pp.id, pp.live, live)
			}
			if lent != pp.lent { // private pools lend from their large pool only
				return fmt.Errorf("private pool %d counts %d lent blocks, found %d", pp.id, pp.lent, lent)
			}
		}
		segments += nsegs
	}

	slices.SortFunc(all, func(x, y *memSegment) int { return cmp.Compare(x.ptr, y.ptr) })
	for i := 1; i < len(all); i++ {
		if all[i-1].ptr+uintptr(all[i-1].size) > all[i].ptr {
			return fmt.Errorf("segments %#x and %#x overlap", all[i-1].ptr, all[i].ptr)
		}
	}

	// Events: every pending chunk is waited on by exactly c.events events.
	waits := map[*memChunk]int{}
	nev := 0
	for _, q := range a.queueList {
		if a.queues[q.stream] != q {
			return fmt.Errorf("event queue of stream %d not registered", q.stream)
		}
		for _, pe := range q.items {
			if pe.c.state != chunkPending {
				return fmt.Errorf("event waits on chunk %#x that is not pending", pe.c.ptr)
			}
			waits[pe.c]++
			nev++
		}
	}
	if nev != a.pendingEvents {
		return fmt.Errorf("pendingEvents %d, queued %d", a.pendingEvents, nev)
	}
	for c, k := range waits {
		if c.events != k {
			return fmt.Errorf("chunk %#x counts %d events, queued %d", c.ptr, c.events, k)
		}
	}

	capturing := map[*privatePool]int{}
	for _, st := range a.capture {
		if len(st) == 0 {
			return fmt.Errorf("empty capture stack kept")
		}
		for _, pp := range st {
			capturing[pp]++
		}
	}
	for id, pp := range a.private {
		if pp.id != id || capturing[pp] != pp.capturing {
			return fmt.Errorf("private pool %d: capture count %d, found %d", id, pp.capturing, capturing[pp])
		}
		if pp.released && pp.live == 0 && !pp.unmerged {
			return fmt.Errorf("private pool %d released and empty but not merged", id)
		}
		if pp.unmerged && (!pp.released || pp.live != 0) {
			return fmt.Errorf("private pool %d marked unmerged, released %v with %d live blocks", id, pp.released, pp.live)
		}
	}

	st := a.stats
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"allocated", st.Allocated.Current, total.allocated},
		{"requested", st.Requested.Current, total.requested},
		{"active", st.Active.Current, total.active},
		{"inactive split", st.InactiveSplit.Current, total.inactiveSplit},
		{"reserved", st.Reserved.Current, reserved},
		{"address space of traced pools", a.virtualBytes, virtual},
		{"segments", st.Segments, segments},
		{"active blocks", st.ActiveBlocks, total.activeBlocks},
		{"largest free block", a.largestFree(), total.largestFree},
		{"driver allocs - frees", st.DriverAllocs - st.DriverFrees, driverHeld},
	} {
		if c.got != c.want {
			return fmt.Errorf("stat %s is %d, recount %d", c.name, c.got, c.want)
		}
	}
	return a.checkCountersLocked(st)
}

func (a *Allocator) liveCount(p *blockPool) int {
	live := 0
	for seg := p.segs; seg != nil; seg = seg.next {
		for c := seg.first; c != nil; c = a.slots[c.next] {
			if c.state != chunkFree {
				live++
			}
		}
	}
	return live
}

// checkCountersLocked checks the relations between statistics that must
// hold at all times.
func (a *Allocator) checkCountersLocked(st MemoryStats) error {
	if !(0 <= st.Requested.Current && st.Requested.Current <= st.Allocated.Current &&
		st.Allocated.Current <= st.Active.Current && st.Active.Current <= st.Reserved.Current+a.virtualBytes) {
		return fmt.Errorf("want 0 <= requested %d <= allocated %d <= active %d <= reserved %d (+ %d traced)",
			st.Requested.Current, st.Allocated.Current, st.Active.Current, st.Reserved.Current, a.virtualBytes)
	}
	if st.InactiveSplit.Current < 0 || st.InactiveSplit.Current > st.Reserved.Current+a.virtualBytes-st.Active.Current {
		return fmt.Errorf("inactive split %d out of range", st.InactiveSplit.Current)
	}
	for _, p := range a.statPairs() {
		if p.Peak < p.Current {
			return fmt.Errorf("peak %d below current %d", p.Peak, p.Current)
		}
	}
	if a.limit > 0 && st.Reserved.Current > a.ceiling {
		return fmt.Errorf("reserved %d over the limit %d (ceiling %d)", st.Reserved.Current, a.limit, a.ceiling)
	}
	if a.ceiling < a.limit {
		return fmt.Errorf("ceiling %d below limit %d", a.ceiling, a.limit)
	}
	return nil
}
