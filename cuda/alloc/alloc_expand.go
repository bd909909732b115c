package alloc

// Expandable segments.
//
// With one driver allocation per segment, every large block sits in a
// segment rounded up to the driver's 2 MiB granularity, and a workload whose
// sizes keep changing (a batch size that varies from step to step) leaves
// segments that fit nothing new. Devices with virtual memory management let
// the allocator do better: it reserves one long address range per pool and
// stream, maps physical pages at its end as the pool grows, and unmaps free
// pages at its end when memory is given back. Blocks of every size then pack
// into one range, split down to 512 bytes, and a free rest at the end merges
// with the next pages mapped, so reserved memory follows the peak in use to
// within one page plus fragmentation. PyTorch offers the same idea as
// "expandable_segments". A private pool (graph capture) takes its own
// range: a captured step's blocks of every size pack into it as an eager
// step's do into the general one (with a segment per size that did not
// fit, airbench's captured step reserved 2726 MiB against 2094 eager).
// Its pages stay mapped while the pool lives, since the graph replays on
// the addresses of its free blocks too, and are unmapped when the pool is
// released.

import (
	"errors"
	"fmt"
)

// VirtualMemory may also be implemented by a DeviceMemory (the real driver
// does, on devices with virtual memory management). AllocatorOptions.
// Expandable uses it.
type VirtualMemory interface {
	// PageSize is the granularity of mappings, a power of two (2 MiB on
	// current GPUs).
	PageSize() int
	// ReserveAddress reserves bytes of address space, with no memory
	// behind it.
	ReserveAddress(bytes int) (uintptr, error)
	// FreeAddress releases a range from ReserveAddress, all of it unmapped.
	FreeAddress(ptr uintptr, bytes int) error
	// MapPages backs [ptr, ptr+bytes), page-aligned and unmapped, with new
	// device memory, all of it or none; out of memory wraps
	// ErrDeviceOutOfMemory.
	MapPages(ptr uintptr, bytes int) error
	// UnmapPages releases the memory behind [ptr, ptr+bytes), mapped by
	// MapPages, once the device has finished the work queued so far. On an
	// error the allocator keeps the range as mapped; the real driver's
	// UnmapPages goes page by page, so a driver failure in the middle of a
	// range (not seen in practice) would leave its first pages unmapped.
	UnmapPages(ptr uintptr, bytes int) error
}

// expands says whether pool grows an expandable segment instead of taking
// new segments.
func (a *Allocator) expands(*blockPool) bool { return a.vm != nil }

// memoryFor gets new memory for a request of rounded bytes in pool: want
// bytes in a new segment, or pages mapped at the end of the pool's
// expandable segment for s. It returns a free chunk that is in no tree.
func (a *Allocator) memoryFor(pool *blockPool, s Stream, rounded, want int) (*memChunk, error) {
	if a.expands(pool) {
		return a.expand(pool, s, rounded)
	}
	return a.newSegment(pool, s, want)
}

// expand maps enough pages at the end of pool's expandable segment for s
// (reserving its address range first if there is none) for a chunk of
// rounded bytes, extending the free chunk at the end if there is one.
func (a *Allocator) expand(pool *blockPool, s Stream, rounded int) (*memChunk, error) {
	seg := pool.expandableOf(s)
	var tail *memChunk
	if seg != nil {
		if t := a.slots[seg.last]; t.state == chunkFree {
			tail = t
		}
	}
	grow := a.growth(seg, rounded)
	virtual := pool.private != nil && pool.private.virtual
	if !virtual && a.limit > 0 && a.stats.Reserved.Current+grow > a.limit {
		return nil, errNoSegment
	}
	fresh := seg == nil
	if fresh {
		if a.vaSize == 0 {
			_, total, err := a.dm.MemGetInfo()
			if err != nil {
				return nil, fmt.Errorf("cuda: sizing an expandable segment: %w", err)
			}
			a.vaSize = roundUpPow2(max(total, a.page), a.page)
		}
		if grow > a.vaSize {
			return nil, errNoSegment
		}
		ptr, err := a.vm.ReserveAddress(a.vaSize)
		if err != nil {
			return nil, fmt.Errorf("cuda: reserving %d bytes of address space: %w", a.vaSize, err)
		}
		seg = &memSegment{ptr: ptr, stream: s, pool: pool, va: a.vaSize}
	} else if seg.size+grow > seg.va {
		return nil, errNoSegment
	}
	if virtual {
		a.virtualBytes += grow // address space only: nothing is mapped
	} else if err := a.vm.MapPages(seg.ptr+uintptr(seg.size), grow); err != nil {
		if fresh {
			if ferr := a.vm.FreeAddress(seg.ptr, seg.va); ferr != nil {
				// Not an out-of-memory condition to recover from.
				return nil, fmt.Errorf("cuda: mapping %d bytes at %#x: %w; releasing the address range: %w",
					grow, seg.ptr, err, ferr)
			}
		}
		if errors.Is(err, ErrDeviceOutOfMemory) {
			return nil, errNoSegment
		}
		return nil, fmt.Errorf("cuda: mapping %d bytes at %#x: %w", grow, seg.ptr+uintptr(seg.size), err)
	}
	if !virtual {
		bump(&a.stats.Reserved, grow)
		a.stats.DriverAllocs += grow / a.page // one physical allocation per page
	}
	var c *memChunk
	if tail != nil {
		a.poolRemove(pool, tail)
		tail.size += grow
		c = tail
	} else {
		c = a.newChunk()
		c.ptr = seg.ptr + uintptr(seg.size)
		c.size = grow
		c.stream = s
		c.seg = seg
		if fresh {
			seg.first = c
			pool.linkSegment(seg)
			pool.expandable = append(pool.expandable, seg)
			a.stats.Segments++
		} else {
			last := a.slots[seg.last]
			last.next = c.slot
			c.prev = last.slot
		}
		seg.last = c.slot
	}
	seg.size += grow
	return c, nil
}

// expandableOf is p's expandable segment for stream s, or nil.
func (p *blockPool) expandableOf(s Stream) *memSegment {
	for _, e := range p.expandable {
		if e.stream == s {
			return e
		}
	}
	return nil
}

// growth is how many bytes seg (nil: none yet) must map for a chunk of
// rounded bytes at its end: whole pages beyond its free end.
func (a *Allocator) growth(seg *memSegment, rounded int) int {
	have := 0
	if seg != nil {
		if t := a.slots[seg.last]; t.state == chunkFree {
			have = t.size
		}
	}
	return roundUpPow2(rounded-have, a.page)
}

// trimmable is how many bytes of whole free pages end seg, an expandable
// segment.
func (a *Allocator) trimmable(seg *memSegment) int {
	t := a.slots[seg.last]
	if t.state != chunkFree {
		return 0
	}
	return seg.size - roundUpPow2(int(t.ptr-seg.ptr), a.page)
}

// trimSegment unmaps the whole free pages at the end of seg, an expandable
// segment, and forgets the segment when nothing is left mapped.
func (a *Allocator) trimSegment(seg *memSegment) error {
	n := a.trimmable(seg)
	if n == 0 {
		return nil
	}
	pool := seg.pool
	t := a.slots[seg.last]
	end := seg.ptr + uintptr(seg.size-n)
	a.poolRemove(pool, t)
	if pp := pool.private; pp != nil && pp.virtual {
		a.virtualBytes -= n // address space, with pages mapped only under kept blocks (plan.go)
		if err := a.unmapKept(pp, end, n); err != nil {
			a.virtualBytes += n
			a.poolInsert(pool, t)
			return err
		}
	} else {
		if err := a.vm.UnmapPages(end, n); err != nil {
			a.poolInsert(pool, t)
			return fmt.Errorf("cuda: unmapping %d bytes at %#x: %w", n, end, err)
		}
		a.unreserve(n)
		a.stats.DriverFrees += n/a.page - 1
	}
	seg.size -= n
	switch {
	case t.ptr != end: // part of the chunk stays mapped
		t.size -= n
		a.poolInsert(pool, t)
	case t != seg.first:
		p := a.slots[t.prev]
		p.next = 0
		seg.last = p.slot
		a.recycle(t)
	default: // nothing left
		for i, e := range pool.expandable {
			if e == seg {
				pool.expandable = append(pool.expandable[:i], pool.expandable[i+1:]...)
				break
			}
		}
		pool.unlinkSegment(seg)
		a.stats.Segments--
		seg.first = nil
		a.recycle(t)
		if err := a.vm.FreeAddress(seg.ptr, seg.va); err != nil {
			return fmt.Errorf("cuda: releasing %d bytes of address space at %#x: %w", seg.va, seg.ptr, err)
		}
	}
	return nil
}
