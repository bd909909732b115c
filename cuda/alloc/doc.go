// Package alloc is ember's caching device-memory allocator: one per
// device, in the manner of PyTorch's CUDACachingAllocator and TensorFlow's
// BFC allocator.
//
// NewAllocator takes the driver as a small interface (DeviceMemory; a
// *driver.Device implements it, and VirtualMemory where the device maps
// pages), so the allocator's logic is tested on a CPU against a fake driver,
// including out of memory, random stress, concurrent use and fuzzing:
//
//	a := alloc.NewAllocator(dev, alloc.AllocatorOptions{Expandable: dev.VirtualMemorySupported()})
//	blk, err := a.Alloc(1<<20, stream) // 1 MiB for work on stream
//	...
//	err = a.Free(blk)                  // cached for the next Alloc on stream
//
// Where to read: alloc.go (the design, at its top, and Alloc/Free),
// alloc_tree.go (the B-tree of free blocks that makes best fit O(log n)),
// alloc_expand.go (expandable segments: one address range per stream grown
// page by page, for the general cache and for each private pool), plan.go
// (a captured sequence placed by a plan made from a rehearsal of it),
// lend.go (a captured graph's idle blocks lent to the work between its
// replays),
// alloc_stats.go (MemoryStats, MemorySummary and the
// out-of-memory error) and alloc_check.go (the invariants the tests check
// after every step).
//
// Package cuda's Backend allocates every tensor through an Allocator, and
// package cuda names the types of this package as aliases (cuda.Allocator,
// cuda.MemoryStats, cuda.OutOfMemoryError, ...).
package alloc
