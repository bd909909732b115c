package driver

import "errors"

// Stream identifies a CUDA stream (0 = the legacy default stream).
type Stream uintptr

// Event identifies a recorded CUDA event.
type Event uintptr

// ErrDeviceOutOfMemory is wrapped by every out-of-memory error, whether the
// driver ran out or an allocator's limit was reached: a
// CUDA_ERROR_OUT_OF_MEMORY *Error satisfies errors.Is(err,
// ErrDeviceOutOfMemory).
var ErrDeviceOutOfMemory = errors.New("cuda: device out of memory")
