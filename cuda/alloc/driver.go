package alloc

import "github.com/ember-ml/ember/cuda/driver"

// The allocator speaks of streams and events as the driver does; a
// *driver.Device is a DeviceMemory and, where the device has virtual memory
// management, a VirtualMemory.
type (
	Stream = driver.Stream // a CUDA stream (0: the legacy default stream)
	Event  = driver.Event  // a recorded CUDA event
)

// ErrDeviceOutOfMemory is wrapped by every out-of-memory error, whether the
// driver ran out or the allocator's limit was reached
// (driver.ErrDeviceOutOfMemory).
var ErrDeviceOutOfMemory = driver.ErrDeviceOutOfMemory

var (
	_ DeviceMemory      = (*driver.Device)(nil)
	_ EventSynchronizer = (*driver.Device)(nil)
	_ VirtualMemory     = (*driver.Device)(nil)
)
