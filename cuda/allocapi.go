package cuda

import "github.com/ember-ml/ember/cuda/alloc"

// The caching allocator lives in package cuda/alloc; these aliases keep its
// names in package cuda, where the backend and its users meet them.
type (
	Allocator         = alloc.Allocator         // the caching device-memory allocator
	AllocatorOptions  = alloc.AllocatorOptions  // how an Allocator caches
	Block             = alloc.Block             // a block handed out by an Allocator
	DeviceMemory      = alloc.DeviceMemory      // what an Allocator needs of a driver
	EventSynchronizer = alloc.EventSynchronizer // a DeviceMemory that can wait for an event
	MemoryStats       = alloc.MemoryStats       // an Allocator's counters
	OutOfMemoryError  = alloc.OutOfMemoryError  // an allocation the device or the limit refused
	PoolID            = alloc.PoolID            // a private pool (a captured graph's)
	StatPair          = alloc.StatPair          // a current and a peak value
	VirtualMemory     = alloc.VirtualMemory     // a DeviceMemory that maps pages
)

// ErrInvalidBlock is wrapped by the errors of Allocator.Free for a block that
// is not live (alloc.ErrInvalidBlock).
var ErrInvalidBlock = alloc.ErrInvalidBlock

// NewAllocator makes a caching allocator over dm (alloc.NewAllocator).
func NewAllocator(dm DeviceMemory, opt AllocatorOptions) *Allocator {
	return alloc.NewAllocator(dm, opt)
}
