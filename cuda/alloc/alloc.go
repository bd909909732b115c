// Caching device-memory allocator.
//
// cuMemAlloc and cuMemFree are slow (hundreds of microseconds) and cuMemFree
// synchronizes the whole device, so a training loop that asked the driver for
// every tensor would spend most of its time waiting. The Allocator therefore
// keeps memory it got from the driver (a "segment") and carves it into blocks
// that it hands out and takes back without driver calls. The design follows
// the ideas of PyTorch's CUDACachingAllocator and TensorFlow's BFC allocator:
//
// Rounding. Every request is rounded up to a multiple of 512 bytes. Sizes
// then come in few classes, so freed blocks fit later requests and the
// alignment of every block is at least 512 (cuMemAlloc gives 256 or more).
//
// Two pools per owner. Requests of up to 1 MiB are "small" and are carved
// from 2 MiB segments; larger requests are "large" and never share segments
// with small ones. Mixing them would let long-lived small tensors pin big
// segments and fragment them. A large request gets a segment of its own,
// rounded up to 2 MiB so that it can be reused for slightly different sizes.
// (PyTorch instead gives requests under 10 MiB a shared 20 MiB segment,
// available here as AllocatorOptions.SharedSegment; for a small network that
// is most of its memory: a LeNet step at batch 64 peaks at 24 MiB in use, and
// 20 MiB segments more than doubled what it reserved.)
//
// Expandable segments. Where the driver offers virtual memory management
// (AllocatorOptions.Expandable, the CUDA backend's default), the general
// cache instead grows one address range per stream by mapping pages at its
// end, and packs blocks of every size into it (alloc_expand.go).
//
// Best fit and splitting. Free blocks sit in a B-tree keyed by (stream,
// size, address), so finding the smallest free block that fits, inserting
// and removing are O(log n), with ties going to the lowest address to keep
// live data packed at the start of segments. (Only the slow paths, running
// out of memory and EmptyCache, walk a pool's list of segments.) A block
// bigger than the request is split and the rest stays free. Small blocks are
// always split (the rest is a multiple of 512, so never under 512 bytes);
// large blocks are split only when the rest is more than 1 MiB, because a
// smaller rest could only serve small requests, which never come from the
// large pool, and would just be fragmentation. On free, a block is merged at
// once with its free neighbours in the same segment, so a segment whose blocks
// are all free is one block again and can be returned to the driver.
//
// Streams. A block is tied to the stream it was allocated on, and a freed
// block is reused only for that stream: kernels on one stream run in order, so
// the next user on that stream cannot run before the previous user finished,
// without any synchronization. If a block was also used on other streams
// (RecordStream), Free records an event on each of them and the block is
// cached only when all those events have completed; pending events are polled
// at the start of Alloc and again before giving up on an out-of-memory
// condition. Events on one stream complete in order, so polling stops at the
// first incomplete event of each stream.
//
// Out of memory. When a new segment is needed and the driver reports out of
// memory, or the segment would take the reserved total over the limit, the
// allocator (1) polls pending events and searches the cache again, (2) returns
// wholly free cached segments of the same kind (small or large) to the driver,
// the smallest single one that is big enough or else largest first, and
// retries, (3) waits for pending events if the driver can (EventSynchronize)
// and searches again, then returns every wholly free cached segment and
// retries, and (4) when the preferred segment is bigger than the request
// needs (the shared mid-size segment, when SharedSegment asks for one)
// retries with the smallest segment that fits. Only then does it fail, with
// an *OutOfMemoryError that says where the memory went. Freeing the cache in
// stages keeps as much of it as possible, since every segment given back
// costs a slow driver call to get again.
//
// Private pools. While a CUDA graph is captured its kernels bake in the
// addresses they use, and replays reuse them later, so that memory must not be
// handed to anyone else. BeginPrivatePool makes Allocs on a stream come from
// segments owned by a fresh pool; freed blocks of the pool go back to it, and
// its segments are neither reused by others nor returned to the driver until
// ReleasePool, after which they join the general cache once all its blocks
// are free. A private pool may also be traced (address space only, its
// requests recorded) or planned (its requests placed by a plan made from
// such a trace): plan.go.
//
// One mutex guards everything, driver calls included: allocation is short and
// driver calls are rare once the cache is warm. Bad frees (nil, double, or a
// block of another allocator) are errors, never ignored: a stale handle
// silently freeing someone else's memory is the worst bug an allocator can
// let through.

package alloc

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// DeviceMemory is what the allocator needs from a driver. The real
// implementation wraps cuMemAlloc/cuMemFree/cuMemGetInfo/cuEvent*; tests use a fake.
type DeviceMemory interface {
	MemAlloc(bytes int) (ptr uintptr, err error) // must return an error wrapping ErrDeviceOutOfMemory when the device is out of memory
	MemFree(ptr uintptr) error
	MemGetInfo() (free, total int, err error)
	EventRecord(s Stream) (Event, error) // records an event on s
	EventQuery(e Event) (done bool, err error)
	EventDestroy(e Event) error
}

// EventSynchronizer may also be implemented by a DeviceMemory (the real
// driver does, with cuEventSynchronize). The allocator then waits for pending
// events before it gives up on an allocation or empties its cache, as PyTorch
// does, instead of failing while memory is merely waiting for the GPU.
type EventSynchronizer interface {
	EventSynchronize(e Event) error // blocks until e has completed
}

// ErrInvalidBlock is wrapped by the errors of Free for a nil block, a block
// already freed, or a block of another allocator. Such a free is always a bug
// in the caller, and ignoring it would corrupt the cache later.
var ErrInvalidBlock = errors.New("cuda: invalid block")

const (
	oneKiB = 1 << 10
	oneMiB = 1 << 20
	oneGiB = 1 << 30

	minBlockSize = 512        // rounding and alignment of every block
	smallSize    = 1 * oneMiB // largest request served by the small pool
	smallBuffer  = 2 * oneMiB // segment size of the small pool
	roundLarge   = 2 * oneMiB // rounding of segments of large pools

	// maxAllocRequest keeps all the rounding below far from overflow and a
	// block's size in 32 bits of 512-byte units; no device comes close to
	// it.
	maxAllocRequest = 1 << 40
)

// roundUpPow2 rounds n up to a multiple of m (a power of two).
func roundUpPow2(n, m int) int { return (n + m - 1) &^ (m - 1) }

// roundSize is the block size for a request of n bytes.
func roundSize(n int) int { return roundUpPow2(n, minBlockSize) }

// minLargeAlloc is where large requests stop sharing segments when
// AllocatorOptions.SharedSegment asks for sharing (PyTorch's 10 MiB).
const minLargeAlloc = 10 * oneMiB

// segmentSize is the preferred driver allocation for a block of rounded
// bytes; shared is AllocatorOptions.SharedSegment.
func segmentSize(rounded, shared int) int {
	switch {
	case rounded <= smallSize:
		return smallBuffer
	case shared > 0 && rounded < minLargeAlloc:
		return shared
	default:
		return roundUpPow2(rounded, roundLarge)
	}
}

// minSegmentSize is the smallest segment that a block of rounded bytes may
// live in, tried as a last resort when the preferred one does not fit.
func minSegmentSize(rounded int) int {
	if rounded <= smallSize {
		return smallBuffer
	}
	return roundUpPow2(rounded, roundLarge)
}

// shouldSplit says whether a free block with rest bytes more than the
// request is split. Rule: small blocks always split (rest is a multiple of
// 512, so never a sliver under 512 bytes); large blocks split only when the
// rest is more than 1 MiB, since a rest of 1 MiB or less could only ever
// serve small requests, which the large pool never sees.
func shouldSplit(small bool, rest int) bool {
	if small {
		return rest >= minBlockSize
	}
	return rest > smallSize
}

// AllocatorOptions configures NewAllocator.
type AllocatorOptions struct {
	Limit int // hard cap on reserved bytes; 0 = no cap beyond the device
	// Expandable makes the general pools map pages at the end of one
	// address range per stream instead of taking a segment per large
	// block, when the DeviceMemory implements VirtualMemory (see
	// alloc_expand.go). SharedSegment is then ignored.
	Expandable bool
	// SharedSegment, when positive, is the size of the segments that large
	// requests under 10 MiB share (PyTorch uses 20 MiB: fewer driver calls
	// for many mid-size tensors). 0, the default, gives every large request
	// its own segment rounded to 2 MiB, which reserves least.
	SharedSegment int
}

// PoolID names a private pool made by BeginPrivatePool.
type PoolID uint64

// Block is an allocation handed out by Alloc, a small value that callers
// copy freely. Every allocation carries a fresh generation number, so a stale
// copy kept after Free can never be mistaken for a later allocation at the
// same address: freeing it again is reported. A Block holds no pointers (it
// finds its chunk by slot number) and handing one out allocates nothing on
// the Go heap. The zero Block is no allocation.
//
// A Block is three words, which Go passes in registers: with five, an
// Alloc/Free pair cost 20 ns more on the development machine.
type Block struct {
	ptr uintptr
	// gen is the chunk's gen while this allocation is live; its top bits
	// are the allocator's id (see genShift), 0 for the zero Block.
	gen uint64
	// meta is the chunk's slot in Allocator.slots (low 32 bits) and the
	// block's size in units of 512 bytes (high 32 bits), a copy that never
	// changes, so that Size needs no lock.
	meta uint64
}

// genShift places an allocator's id in the top bits of its generation
// numbers, so that a Block names its allocator without a field of its own:
// 2^40 allocations per allocator before its generations wrap around (12
// days at a million allocations a second; see hand), 2^24 allocators per
// process.
const genShift = 40

// slot is the index of b's chunk in Allocator.slots.
func (b Block) slot() uint32 { return uint32(b.meta) }

// owner is the id of the allocator that made b, 0 for the zero Block.
func (b Block) owner() uint32 { return uint32(b.gen >> genShift) }

// IsZero reports whether b is the zero Block, which no Alloc returns: a
// field of type Block that holds no block.
func (b Block) IsZero() bool { return b.owner() == 0 }

// Ptr is the device address of the block.
func (b Block) Ptr() uintptr { return b.ptr }

// Size is the number of bytes the block holds: the request rounded up to 512
// bytes, or somewhat more for a large block whose rest (1 MiB or less) was
// not worth splitting off.
func (b Block) Size() int { return int(b.meta>>32) * minBlockSize }

// Requested is the size that was asked for in the Alloc that returned b,
// or 0 when b is not a live block of a.
func (a *Allocator) Requested(b Block) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b.owner() != a.id {
		return 0
	}
	if c := a.live(b); c != nil {
		return c.requested
	}
	return 0
}

type chunkState uint8

const (
	chunkFree    chunkState = iota // in its pool's tree, reusable
	chunkInUse                     // handed out
	chunkPending                   // freed, waiting for events on other streams
)

// memChunk is the allocator's record of a piece of a segment. Chunks are never
// shown to callers (a Block names one by slot), which lets them be recycled.
//
// Chunks refer to each other by slot number rather than by pointer, and the
// free tree holds slot numbers too: the hot path then stores no pointers, so
// it never pays for the garbage collector's write barrier, which otherwise
// dominates the cost of an Alloc/Free pair whenever a collection is running.
type memChunk struct {
	ptr    uintptr
	size   int
	stream Stream
	seg    *memSegment
	// prev and next are the slots of the neighbours by address within
	// seg, 0 for none.
	prev, next uint32

	state     chunkState
	slot      uint32 // index in Allocator.slots, for life; never 0
	gen       uint64 // generation of the live Block while in use, else 0
	requested int
	uses      []Stream // other streams the chunk was used on (RecordStream)
	events    int      // events still pending before the chunk is free
	lent      bool     // a private pool's free chunk handed out while lending, until free again (lend.go)
	seq       int32    // the request's number in a traced pool's sequence, -1 otherwise (plan.go)
}

// isSplit reports whether the chunk is only part of its segment.
func (c *memChunk) isSplit() bool { return c.prev|c.next != 0 }

// memSegment is one driver allocation.
type memSegment struct {
	ptr    uintptr
	size   int
	stream Stream
	pool   *blockPool
	first  *memChunk // the chunk at ptr; it is never merged away
	last   uint32    // slot of the chunk that ends the segment
	// va is the address range reserved for an expandable segment, of
	// which the first size bytes are mapped; 0 for a driver allocation.
	va int
	// prev and next link the segments of pool.
	prev, next *memSegment
}

// blockPool holds the segments of one kind (small or large) of one owner
// (the general cache or a private pool) and a tree of their free chunks.
type blockPool struct {
	tree  freeTree
	small bool
	// packed pools split blocks down to 512 bytes whatever their size:
	// private pools, and expandable ones, whose free rests at the end
	// merge with the next pages mapped.
	packed  bool
	private *privatePool // nil for the general cache
	segs    *memSegment
	nsegs   int
	// expandable holds the pool's expandable segments, one per stream,
	// when the allocator maps pages instead of allocating segments.
	expandable []*memSegment
}

type privatePool struct {
	id           PoolID
	small, large blockPool
	capturing    int  // BeginPrivatePool calls not yet ended
	live         int  // chunks in use or pending
	lent         int  // of which handed out while lending, in use or pending (lend.go)
	released     bool // ReleasePool called; merge into the cache when live == 0
	unmerged     bool // released and empty, but the driver failed to unmap its range: EmptyCache retries

	// A traced pool (BeginTracePool) has address space and no memory
	// behind it (virtual) and records its requests while capturing; a
	// planned one (BeginPlannedPool) places its requests by plan, the
	// next-th one next. See plan.go.
	virtual bool
	kept    map[uintptr]bool // pages mapped under the blocks a rehearsal kept (Materialize)
	trace   *poolTrace
	plan    *MemoryPlan
	next    int
	misses  int // requests that did not match the plan
}

type queuedFree struct {
	ev Event
	c  *memChunk
}

type freeQueue struct {
	stream Stream
	items  []queuedFree
}

// Allocator is a caching allocator for one device. All methods are safe for
// concurrent use.
type Allocator struct {
	mu     sync.Mutex
	id     uint32 // unique among allocators, to recognize foreign Blocks
	dm     DeviceMemory
	syncer EventSynchronizer // dm, if it can wait for events; else nil

	sharedSegment int           // AllocatorOptions.SharedSegment
	vm            VirtualMemory // the driver's, with AllocatorOptions.Expandable; else nil
	page          int           // vm's page size
	vaSize        int           // address range reserved per expandable segment
	limit         int
	// ceiling is the most that reserved may be: the limit, or what was
	// reserved when SetLimit lowered the limit below it, shrinking as
	// segments are returned. Only checkInvariants reads it.
	ceiling int

	small, large blockPool

	private  map[PoolID]*privatePool
	capture  map[Stream][]*privatePool // stack of active pools per stream
	nextPool PoolID
	lending  lending // BeginLending's state (lend.go)

	queues        map[Stream]*freeQueue
	queueList     []*freeQueue // queues in creation order, for deterministic polling
	pendingEvents int

	slots []*memChunk // every chunk ever made, by slot number; slots[0] is nil
	spare []uint32    // slots of recycled chunks
	gen   uint64      // last allocation generation handed out

	// virtualBytes is the address space that traced pools have grown
	// into, with no memory behind it: not reserved (plan.go).
	virtualBytes int

	stats MemoryStats
}

var allocatorIDs atomic.Uint32

// NewAllocator makes an allocator that gets its memory from dm.
func NewAllocator(dm DeviceMemory, opt AllocatorOptions) *Allocator {
	if dm == nil {
		panic("cuda: NewAllocator with nil DeviceMemory")
	}
	a := &Allocator{
		id:      allocatorIDs.Add(1),
		dm:      dm,
		private: make(map[PoolID]*privatePool),
		capture: make(map[Stream][]*privatePool),
		queues:  make(map[Stream]*freeQueue),
		slots:   []*memChunk{nil},
	}
	if a.id >= 1<<(64-genShift) {
		panic("cuda: too many allocators")
	}
	a.gen = uint64(a.id) << genShift
	a.sharedSegment = opt.SharedSegment
	if vm, ok := dm.(VirtualMemory); ok && opt.Expandable {
		a.vm, a.page = vm, vm.PageSize()
		a.sharedSegment = 0
		a.large.packed = true
	}
	a.syncer, _ = dm.(EventSynchronizer)
	a.small.small = true
	a.setLimit(opt.Limit)
	return a
}

// Alloc returns a block of at least bytes bytes for use on stream s.
func (a *Allocator) Alloc(bytes int, s Stream) (Block, error) {
	if bytes <= 0 {
		return Block{}, fmt.Errorf("cuda: Alloc of %d bytes: size must be positive", bytes)
	}
	if bytes > maxAllocRequest {
		return Block{}, fmt.Errorf("cuda: Alloc of %d bytes: size too large", bytes)
	}
	rounded := roundSize(bytes)

	a.mu.Lock()
	if a.lending.depth > 0 {
		if b, ok, err := a.borrow(s, rounded, bytes); ok || err != nil {
			a.mu.Unlock()
			return b, err
		}
	}
	if len(a.capture) != 0 {
		if st := a.capture[s]; len(st) > 0 && st[len(st)-1].plan != nil {
			defer a.mu.Unlock()
			return a.allocPlanned(st[len(st)-1], s, bytes, rounded)
		}
	}
	// The cache-hit path unlocks by hand: a deferred call costs a tenth
	// of it.
	if a.pendingEvents == 0 {
		pool := a.poolFor(s, rounded)
		if c := a.leafFit(pool, s, rounded); c != nil {
			a.stats.CacheHits++
			b := a.hand(pool, c, bytes)
			a.mu.Unlock()
			return b, nil
		}
		if c := a.takeBestFit(pool, s, rounded); c != nil {
			a.stats.CacheHits++
			b := a.take(pool, c, rounded, bytes)
			a.mu.Unlock()
			return b, nil
		}
	}
	defer a.mu.Unlock()
	return a.allocSlow(bytes, rounded, s)
}

// allocSlow is Alloc when blocks wait on events or the cache misses.
func (a *Allocator) allocSlow(bytes, rounded int, s Stream) (Block, error) {
	if a.pendingEvents > 0 {
		if err := a.processEvents(); err != nil {
			return Block{}, err
		}
	}
	pool := a.poolFor(s, rounded)
	if c := a.takeBestFit(pool, s, rounded); c != nil {
		a.stats.CacheHits++
		return a.take(pool, c, rounded, bytes), nil
	}
	c, hit, err := a.grow(pool, s, bytes, rounded)
	if err != nil {
		return Block{}, err
	}
	if hit {
		a.stats.CacheHits++
	} else {
		a.stats.CacheMisses++
	}
	return a.take(pool, c, rounded, bytes), nil
}

// poolFor picks the pool serving a request of rounded bytes on s.
func (a *Allocator) poolFor(s Stream, rounded int) *blockPool {
	small := rounded <= smallSize
	if len(a.capture) != 0 {
		if st := a.capture[s]; len(st) > 0 {
			// A private pool serves one captured sequence whose pattern
			// never changes, so the fragmentation that separate small and
			// large pools guard against cannot build up: one pool whose
			// blocks split down to 512 bytes packs the sequence tightly.
			return &st[len(st)-1].large
		}
	}
	if small && a.vm == nil {
		return &a.small
	}
	// With expandable segments every size shares the large pool: small
	// blocks fill the gaps that large ones leave in the one address range,
	// which measured 28 MiB reserved instead of 32 for the batch-size
	// sweep of sweep_test.go (separate small and large ranges).
	return &a.large
}

// take hands out c (free, not in any tree), splitting off the rest.
func (a *Allocator) take(pool *blockPool, c *memChunk, rounded, requested int) Block {
	if r := a.split(pool, c, rounded); r != nil {
		a.poolInsert(pool, r)
	}
	return a.hand(pool, c, requested)
}

// split cuts c down to rounded bytes when the rest is worth keeping and
// returns the rest, a new free chunk linked after c but in no tree; else
// it returns nil.
func (a *Allocator) split(pool *blockPool, c *memChunk, rounded int) *memChunk {
	rest := c.size - rounded
	if !shouldSplit(pool.small || pool.packed, rest) {
		return nil
	}
	r := a.newChunk()
	r.ptr = c.ptr + uintptr(rounded)
	r.size = rest
	r.stream = c.stream
	if r.seg != c.seg { // usually recycled from this very segment
		r.seg = c.seg
	}
	r.prev = c.slot
	r.next = c.next
	if n := a.slots[c.next]; n != nil {
		n.prev = r.slot
	} else {
		r.seg.last = r.slot
	}
	c.next = r.slot
	c.size = rounded
	return r
}

// hand marks c, out of every tree, as in use and returns its Block.
func (a *Allocator) hand(pool *blockPool, c *memChunk, requested int) Block {
	c.state = chunkInUse
	c.requested = requested
	c.seq = -1
	if pp := pool.private; pp != nil {
		pp.live++
		if pp.trace != nil && pp.capturing > 0 {
			c.seq = pp.trace.alloc(c.size)
		}
	}
	bump(&a.stats.Allocated, c.size)
	bump(&a.stats.Active, c.size)
	bump(&a.stats.Requested, requested)
	a.stats.ActiveBlocks++
	a.gen++
	if a.gen&(1<<genShift-1) == 0 {
		// The generations of this allocator are used up: start again
		// rather than carry into the owner bits. A stale Block kept for
		// 2^40 allocations could then match a new one of the same slot.
		a.gen = uint64(a.id)<<genShift + 1
	}
	c.gen = a.gen
	return Block{ptr: c.ptr, gen: c.gen, meta: uint64(c.slot) | uint64(c.size/minBlockSize)<<32}
}

// errNoSegment is grow's internal signal that a segment could not be had,
// either from the driver or because of the limit.
var errNoSegment = errors.New("no memory")

// grow finds memory for a request that the cache could not serve, going
// through the out-of-memory stages described at the top of the file. It
// returns a free chunk that is in no tree; hit says it came from the cache.
func (a *Allocator) grow(pool *blockPool, s Stream, bytes, rounded int) (c *memChunk, hit bool, err error) {
	want := segmentSize(rounded, a.sharedSegment)

	// A miss in the general large pool proves that none of its free blocks
	// fits: its wholly free segments are smaller than the request (the
	// batch grew, say). Kept, they would ratchet reserved memory up with
	// every size change, so they go back before a new segment is taken.
	// With one segment per large block this costs nothing in a steady
	// workload, whose requests all hit the cache after the first step.
	if a.sharedSegment == 0 && pool == &a.large {
		if _, err := a.releaseCached(pool, 0, false, nil); err != nil {
			return nil, false, err
		}
	}
	c, err = a.memoryFor(pool, s, rounded, want)
	if err != errNoSegment {
		return c, false, err
	}

	// Stage 1: blocks waiting on events may have become free meanwhile.
	if a.pendingEvents > 0 {
		if err := a.processEvents(); err != nil {
			return nil, false, err
		}
		if c := a.takeBestFit(pool, s, rounded); c != nil {
			return c, true, nil
		}
	}

	// Stage 2: give back cached segments of the same kind. An expandable
	// segment needs only the pages its free end lacks, and trimming its
	// own free end would just map it again.
	var own *memSegment
	if a.expands(pool) {
		own = pool.expandableOf(s)
		want = a.growth(own, rounded)
	}
	need := want
	if a.limit > 0 && a.stats.Reserved.Current+want > a.limit {
		need = a.stats.Reserved.Current + want - a.limit
	}
	general := &a.large
	if pool.small {
		general = &a.small
	}
	freed, err := a.releaseCached(general, need, true, own)
	if err != nil {
		return nil, false, err
	}
	if freed > 0 {
		a.stats.Retries++
		if c, err = a.memoryFor(pool, s, rounded, want); err != errNoSegment {
			return c, false, err
		}
	}

	// Stage 3: wait for the GPU to finish with blocks freed on other
	// streams, if the driver can, and search again; then give back
	// everything cached.
	if waited, err := a.syncEvents(); err != nil {
		return nil, false, err
	} else if waited {
		if c := a.takeBestFit(pool, s, rounded); c != nil {
			return c, true, nil
		}
	}
	freed1, err := a.releaseCached(&a.small, 0, true, nil)
	if err != nil {
		return nil, false, err
	}
	freed2, err := a.releaseCached(&a.large, 0, true, nil)
	if err != nil {
		return nil, false, err
	}
	if freed1+freed2 > 0 {
		a.stats.Retries++
		if c, err = a.memoryFor(pool, s, rounded, want); err != errNoSegment {
			return c, false, err
		}
	}

	// Stage 4: a segment just big enough, in case the preferred one was the
	// shared mid-size segment.
	if min := minSegmentSize(rounded); min < want && !a.expands(pool) {
		a.stats.Retries++
		if c, err = a.newSegment(pool, s, min); err != errNoSegment {
			return c, false, err
		}
	}

	a.stats.OOMs++
	return nil, false, a.oomError(bytes, rounded, want)
}

// newSegment gets a segment of size bytes from the driver for pool and
// returns its single chunk, not yet in the tree. It returns errNoSegment when
// the limit or the device is exhausted, and other driver errors wrapped.
func (a *Allocator) newSegment(pool *blockPool, s Stream, size int) (*memChunk, error) {
	if a.limit > 0 && a.stats.Reserved.Current+size > a.limit {
		return nil, errNoSegment
	}
	ptr, err := a.dm.MemAlloc(size)
	if err != nil {
		if errors.Is(err, ErrDeviceOutOfMemory) {
			return nil, errNoSegment
		}
		return nil, fmt.Errorf("cuda: allocating a %d-byte segment: %w", size, err)
	}
	if ptr == 0 {
		return nil, fmt.Errorf("cuda: allocating a %d-byte segment: driver returned a null pointer", size)
	}
	seg := &memSegment{ptr: ptr, size: size, stream: s, pool: pool}
	c := a.newChunk()
	c.ptr = ptr
	c.size = size
	c.stream = s
	c.seg = seg
	seg.first = c
	seg.last = c.slot
	pool.linkSegment(seg)
	bump(&a.stats.Reserved, size)
	a.stats.Segments++
	a.stats.DriverAllocs++
	return c, nil
}

// releaseCached returns cached memory of pool to the driver and says how
// many bytes it gave back: wholly free segments and, with trim, the free
// pages at the end of expandable segments other than except. With need <= 0 it returns all of
// it. Otherwise it returns the smallest single piece of at least need
// bytes, or failing that the largest ones until need is met, so as to keep
// as much of the cache as possible. It runs only on the out-of-memory path,
// on large-pool misses and in EmptyCache, so the walk over the pool's
// segments is not on the hot path.
func (a *Allocator) releaseCached(pool *blockPool, need int, trim bool, except *memSegment) (int, error) {
	type piece struct {
		seg   *memSegment
		bytes int
	}
	var cands []piece
	for seg := pool.segs; seg != nil; seg = seg.next {
		if seg.va > 0 {
			if n := a.trimmable(seg); trim && n > 0 && seg != except {
				cands = append(cands, piece{seg, n})
			}
		} else if f := seg.first; f.state == chunkFree && f.next == 0 {
			cands = append(cands, piece{seg, seg.size})
		}
	}
	if len(cands) == 0 {
		return 0, nil
	}
	if need > 0 {
		best := -1
		for i, p := range cands {
			if p.bytes >= need && (best < 0 || p.bytes < cands[best].bytes) {
				best = i
			}
		}
		if best >= 0 {
			cands[0] = cands[best]
			cands = cands[:1]
		} else {
			slices.SortFunc(cands, func(x, y piece) int {
				return cmp.Or(cmp.Compare(y.bytes, x.bytes), cmp.Compare(x.seg.ptr, y.seg.ptr))
			})
		}
	}
	freed := 0
	for _, p := range cands {
		var err error
		if p.seg.va > 0 {
			err = a.trimSegment(p.seg)
		} else {
			err = a.releaseSegment(p.seg.first)
		}
		if err != nil {
			return freed, err
		}
		freed += p.bytes
		if need > 0 && freed >= need {
			break
		}
	}
	return freed, nil
}

// releaseSegment returns the segment of c, which must be its only chunk and
// free, to the driver. On a driver error the segment stays cached.
func (a *Allocator) releaseSegment(c *memChunk) error {
	seg := c.seg
	if seg.va > 0 {
		return a.trimSegment(seg)
	}
	pool := seg.pool
	a.poolRemove(pool, c)
	if err := a.dm.MemFree(seg.ptr); err != nil {
		a.poolInsert(pool, c)
		return fmt.Errorf("cuda: returning the %d-byte segment at %#x to the driver: %w", seg.size, seg.ptr, err)
	}
	pool.unlinkSegment(seg)
	a.stats.Segments--
	a.unreserve(seg.size)
	seg.first = nil
	a.recycle(c)
	return nil
}

// unreserve counts bytes given back to the driver.
func (a *Allocator) unreserve(bytes int) {
	bump(&a.stats.Reserved, -bytes)
	a.stats.DriverFrees++
	if a.ceiling > a.limit {
		a.ceiling = max(a.limit, a.stats.Reserved.Current)
	}
}

// Free gives b back. The memory is reused for b's stream at once, or for
// streams recorded with RecordStream only after the work queued on them so
// far has completed.
func (a *Allocator) Free(b Block) error {
	if b.owner() != a.id {
		if b.owner() == 0 {
			return fmt.Errorf("%w: Free of the zero Block", ErrInvalidBlock)
		}
		return fmt.Errorf("%w: Free of block %#x (%d bytes), which is not from this allocator", ErrInvalidBlock, b.ptr, b.Size())
	}
	a.mu.Lock()
	c := a.live(b)
	if c == nil {
		a.mu.Unlock()
		return fmt.Errorf("%w: double free of block %#x (%d bytes)", ErrInvalidBlock, b.ptr, b.Size())
	}
	if len(c.uses) > 0 {
		err := a.freeAfterEvents(b, c)
		a.mu.Unlock()
		return err
	}
	a.release(c)
	err := a.freeChunk(c)
	a.mu.Unlock()
	return err
}

// live returns the chunk of b if b is a live allocation of a, else nil.
func (a *Allocator) live(b Block) *memChunk {
	if int(b.slot()) >= len(a.slots) {
		return nil
	}
	c := a.slots[b.slot()]
	if c.gen != b.gen || c.state != chunkInUse {
		return nil
	}
	return c
}

// release does the accounting of a Free: the caller no longer holds c.
func (a *Allocator) release(c *memChunk) {
	c.gen = 0
	a.stats.Allocated.Current -= c.size // a decrease never makes a peak
	a.stats.Requested.Current -= c.requested
	c.requested = 0
}

// freeAfterEvents records an event on every other stream that used c and
// parks c until they complete.
func (a *Allocator) freeAfterEvents(b Block, c *memChunk) error {
	var buf [4]Event
	evs := buf[:0]
	for _, s := range c.uses {
		ev, err := a.dm.EventRecord(s)
		if err != nil {
			// Leave the block allocated, so that the caller can
			// retry; nothing has been queued yet.
			err = fmt.Errorf("cuda: freeing block %#x: recording an event on stream %#x: %w", b.ptr, s, err)
			for _, e := range evs {
				if derr := a.dm.EventDestroy(e); derr != nil {
					err = errors.Join(err, fmt.Errorf("cuda: destroying an event: %w", derr))
				}
			}
			return err
		}
		evs = append(evs, ev)
	}
	a.release(c)
	for i, s := range c.uses {
		q := a.queues[s]
		if q == nil {
			q = &freeQueue{stream: s}
			a.queues[s] = q
			a.queueList = append(a.queueList, q)
		}
		q.items = append(q.items, queuedFree{ev: evs[i], c: c})
	}
	c.events = len(evs)
	c.state = chunkPending
	a.pendingEvents += len(evs)
	return nil
}

// processEvents frees the chunks whose events have all completed.
func (a *Allocator) processEvents() error {
	for _, q := range a.queueList {
		for len(q.items) > 0 {
			pe := q.items[0]
			done, err := a.dm.EventQuery(pe.ev)
			if err != nil {
				return fmt.Errorf("cuda: querying an event on stream %#x: %w", q.stream, err)
			}
			if !done {
				break // later events on this stream cannot be done either
			}
			q.items[0] = queuedFree{}
			q.items = q.items[1:]
			if len(q.items) == 0 {
				q.items = nil
			}
			a.pendingEvents--
			derr := a.dm.EventDestroy(pe.ev)
			if pe.c.events--; pe.c.events == 0 {
				if err := a.freeChunk(pe.c); err != nil {
					return err
				}
			}
			if derr != nil {
				return fmt.Errorf("cuda: destroying an event on stream %#x: %w", q.stream, derr)
			}
		}
	}
	return nil
}

// syncEvents waits for every pending event, when the driver can, and frees
// the chunks waiting on them. Events on a stream complete in order, so
// waiting for the last one of each stream is enough.
func (a *Allocator) syncEvents() (waited bool, err error) {
	if a.syncer == nil || a.pendingEvents == 0 {
		return false, nil
	}
	for _, q := range a.queueList {
		if n := len(q.items); n > 0 {
			if err := a.syncer.EventSynchronize(q.items[n-1].ev); err != nil {
				return false, fmt.Errorf("cuda: waiting for an event on stream %#x: %w", q.stream, err)
			}
		}
	}
	return true, a.processEvents()
}

// freeChunk puts c, no longer used by anyone, back in its pool, merged with
// free neighbours.
func (a *Allocator) freeChunk(c *memChunk) error {
	pool := c.seg.pool
	if pp := pool.private; pp != nil && pp.trace != nil && pp.capturing > 0 && c.seq >= 0 {
		pp.trace.free(c.seq)
	}
	c.seq = -1
	a.stats.Active.Current -= c.size
	a.stats.ActiveBlocks--
	c.state = chunkFree
	if c.lent {
		// Lent until free: a lent block freed after RecordStream stays
		// lent while its events are pending, since another stream may
		// still read it and a replay would write over it.
		c.lent = false
		pool.private.lent--
	}
	if len(c.uses) != 0 {
		c.uses = c.uses[:0]
	}
	// A chunk merged into a free neighbour takes that neighbour's place in
	// the tree (one search instead of a removal and an insert).
	var old btKey
	inTree := false
	if p := a.slots[c.prev]; p != nil && p.state == chunkFree {
		old, inTree = keyOf(p), true
		bump(&a.stats.InactiveSplit, -p.size) // p has a neighbour: split
		p.size += c.size
		p.next = c.next
		if n := a.slots[c.next]; n != nil {
			n.prev = p.slot
		} else {
			p.seg.last = p.slot
		}
		a.recycle(c)
		c = p
	}
	if n := a.slots[c.next]; n != nil && n.state == chunkFree {
		if inTree {
			a.poolRemove(pool, n)
		} else {
			old, inTree = keyOf(n), true
			bump(&a.stats.InactiveSplit, -n.size)
		}
		c.size += n.size
		c.next = n.next
		if nn := a.slots[n.next]; nn != nil {
			nn.prev = c.slot
		} else {
			c.seg.last = c.slot
		}
		a.recycle(n)
	}
	if inTree {
		pool.tree.replace(old, btItem{keyOf(c), c.slot})
		if c.isSplit() {
			bump(&a.stats.InactiveSplit, c.size)
		}
	} else {
		a.poolInsert(pool, c)
	}
	if pp := pool.private; pp != nil {
		if pp.live--; pp.live == 0 && pp.released {
			return a.mergePool(pp)
		}
		return nil
	}
	// Over the limit only after SetLimit lowered it: give memory back as
	// soon as a segment empties.
	if a.limit > 0 && a.stats.Reserved.Current > a.limit && !c.isSplit() {
		return a.releaseSegment(c)
	}
	return nil
}

// RecordStream notes that b is also used on stream s, so that Free will not
// let b's memory be reused until the work queued on s by then has completed.
// Calling it on a block that is not live is a bug in the caller and panics.
func (a *Allocator) RecordStream(b Block, s Stream) {
	if b.owner() != a.id {
		panic("cuda: RecordStream on a block that is not from this allocator")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.live(b)
	if c == nil {
		panic(fmt.Sprintf("cuda: RecordStream on block %#x after it was freed", b.ptr))
	}
	if s == c.stream {
		return
	}
	for _, u := range c.uses {
		if u == s {
			return
		}
	}
	c.uses = append(c.uses, s)
}

// EmptyCache returns every wholly free cached segment to the driver. Blocks
// freed but waiting for events of other streams are waited for if the driver
// implements EventSynchronize, and otherwise keep their segments. Segments
// of private pools that have not been released stay.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if waited, err := a.syncEvents(); err != nil {
		return err
	} else if !waited && a.pendingEvents > 0 {
		if err := a.processEvents(); err != nil {
			return err
		}
	}
	for _, id := range slices.Sorted(maps.Keys(a.private)) {
		if pp := a.private[id]; pp.unmerged {
			if err := a.mergePool(pp); err != nil {
				return err
			}
		}
	}
	if _, err := a.releaseCached(&a.small, 0, true, nil); err != nil {
		return err
	}
	_, err := a.releaseCached(&a.large, 0, true, nil)
	return err
}

// SetLimit sets the cap on reserved bytes (0 or less: none). Lowering it
// below what is reserved frees no live memory: no new segment is reserved
// until the total is under the limit, and cached segments are returned as
// they empty, when a new segment is needed, or by EmptyCache.
func (a *Allocator) SetLimit(bytes int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setLimit(bytes)
}

func (a *Allocator) setLimit(bytes int) {
	a.limit = max(bytes, 0)
	a.ceiling = a.limit
	if a.limit > 0 {
		a.ceiling = max(a.limit, a.stats.Reserved.Current)
	}
}

// BeginPrivatePool makes the following Allocs on s come from a new private
// pool, until EndPrivatePool(s). Calls nest: the innermost pool is used.
func (a *Allocator) BeginPrivatePool(s Stream) PoolID {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextPool++
	pp := &privatePool{id: a.nextPool}
	pp.small.small = true
	pp.small.private = pp
	pp.large.private = pp
	pp.small.packed = true
	pp.large.packed = true
	pp.capturing = 1
	a.private[pp.id] = pp
	a.capture[s] = append(a.capture[s], pp)
	return pp.id
}

// EndPrivatePool ends the innermost BeginPrivatePool on s. The pool keeps its
// memory until ReleasePool. Calling it without a matching Begin panics.
func (a *Allocator) EndPrivatePool(s Stream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.capture[s]
	if len(st) == 0 {
		panic(fmt.Sprintf("cuda: EndPrivatePool on stream %#x without BeginPrivatePool", s))
	}
	pp := st[len(st)-1]
	st[len(st)-1] = nil
	if st = st[:len(st)-1]; len(st) == 0 {
		delete(a.capture, s)
	} else {
		a.capture[s] = st
	}
	pp.capturing--
}

// ReleasePool gives the pool's segments to the general cache, at once if all
// its blocks are free, otherwise when the last one is freed.
func (a *Allocator) ReleasePool(id PoolID) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	pp := a.private[id]
	if pp == nil || pp.released {
		return fmt.Errorf("cuda: ReleasePool(%d): no such pool, or already released", id)
	}
	if pp.capturing > 0 {
		return fmt.Errorf("cuda: ReleasePool(%d): pool still active; call EndPrivatePool first", id)
	}
	pp.released = true
	if pp.live == 0 {
		return a.mergePool(pp)
	}
	return nil
}

// mergePool moves the segments of a released pool, all wholly free, into the
// general cache; the pool's expandable ranges, which the general pools'
// own ranges cannot take in, are unmapped and given back first. Should the
// driver fail to unmap one, the pool stays (unmerged, with what is left)
// and EmptyCache tries again.
func (a *Allocator) mergePool(pp *privatePool) error {
	for _, p := range []*blockPool{&pp.small, &pp.large} {
		for len(p.expandable) > 0 {
			seg := p.expandable[0]
			if err := a.trimSegment(seg); err != nil {
				pp.unmerged = true
				return err
			}
			if seg.first != nil { // a chunk left mapped: not wholly free
				pp.unmerged = true
				return fmt.Errorf("cuda: released pool %d: its range at %#x still holds %d bytes", pp.id, seg.ptr, seg.size)
			}
		}
	}
	delete(a.private, pp.id)
	for _, pair := range [2][2]*blockPool{{&pp.small, &a.small}, {&pp.large, &a.large}} {
		from := pair[0]
		for from.segs != nil {
			seg := from.segs
			c := seg.first
			a.poolRemove(from, c)
			from.unlinkSegment(seg)
			// A private pool mixes sizes in one pool; back in the general
			// cache, segments of the small pool's size serve small requests.
			to := pair[1]
			if seg.size <= smallBuffer && a.vm == nil {
				to = &a.small // (expandable: every size shares the large pool)
			}
			seg.pool = to
			to.linkSegment(seg)
			a.poolInsert(to, c)
		}
	}
	// Segments cannot stay when the limit was lowered below reserved.
	if a.limit > 0 && a.stats.Reserved.Current > a.limit {
		if _, err := a.releaseCached(&a.small, a.stats.Reserved.Current-a.limit, true, nil); err != nil {
			return err
		}
		if a.stats.Reserved.Current > a.limit {
			if _, err := a.releaseCached(&a.large, a.stats.Reserved.Current-a.limit, true, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *blockPool) linkSegment(seg *memSegment) {
	seg.prev = nil
	seg.next = p.segs
	if p.segs != nil {
		p.segs.prev = seg
	}
	p.segs = seg
	p.nsegs++
}

func (p *blockPool) unlinkSegment(seg *memSegment) {
	if seg.prev != nil {
		seg.prev.next = seg.next
	} else {
		p.segs = seg.next
	}
	if seg.next != nil {
		seg.next.prev = seg.prev
	}
	seg.prev, seg.next = nil, nil
	p.nsegs--
}

// newChunk returns a chunk with no links, recycled when possible so that
// splitting does not allocate. The caller sets its place and size.
func (a *Allocator) newChunk() *memChunk {
	if n := len(a.spare); n > 0 {
		c := a.slots[a.spare[n-1]]
		a.spare = a.spare[:n-1]
		c.prev, c.next = 0, 0
		c.events = 0
		c.requested = 0
		return c
	}
	if len(a.slots) > math.MaxUint32 {
		panic("cuda: allocator out of chunk slots")
	}
	c := &memChunk{slot: uint32(len(a.slots))}
	a.slots = append(a.slots, c)
	return c
}

// recycle keeps a chunk that was merged away or whose segment went back to
// the driver. Stale Blocks may still name its slot; Free rejects them because
// the chunk's generation is no longer theirs.
//
// It keeps c.seg: the chunk will most likely be reused in the same segment,
// and not storing the pointer again saves a write barrier.
func (a *Allocator) recycle(c *memChunk) {
	c.gen = 0
	c.state = chunkFree
	if len(c.uses) != 0 {
		c.uses = c.uses[:0]
	}
	a.spare = append(a.spare, c.slot)
}

// add changes a statistic and keeps its peak.
func bump(p *StatPair, d int) {
	p.Current += d
	if p.Current > p.Peak {
		p.Peak = p.Current
	}
}
