package driver

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Threading model
//
// A CUDA context is "current" per OS thread, and Go moves goroutines
// between OS threads at will. Two designs keep driver calls on a thread
// where the device's context is current:
//
//  1. one goroutine locked to an OS thread (runtime.LockOSThread) owns the
//     context and runs every call submitted to it over a channel;
//  2. every call pins the calling goroutine to its current thread for the
//     duration of the call (runtime.LockOSThread), makes the context
//     current there (cuCtxSetCurrent), calls, and unpins.
//
// This package uses (2). Measured on a 2-core x86-64 VM without a GPU,
// with trivial C functions standing in for the driver: one purego call
// costs ~0.13-0.16 us; enter+leave (lock, cuCtxSetCurrent, unlock) ~0.35
// us; a whole Function.Launch with two arguments ~0.9 us, 2 small
// allocations; a channel round trip to a locked goroutine ~20 us, because
// the worker thread parks between requests and waking a parked thread is a
// futex wake plus a context switch (0.3-1 us only while the worker spins,
// which burns a core). With (2) a kernel launch costs the driver's own
// cuLaunchKernel time (~2-4 us) plus under 1 us, and calls from several
// goroutines run in parallel, since the driver API is thread-safe.
// BenchmarkGPUEnterLeave and BenchmarkGPULaunch measure it on a GPU.
// cuCtxSetCurrent is cheap (it stores the context in thread-local storage)
// so it is issued on every call rather than cached, which would need to
// know the OS thread's identity.
//
// The "lock" that must never be missing is runtime.LockOSThread between
// cuCtxSetCurrent and the call: without it the goroutine may migrate to a
// thread where another (or no) context is current and the call fails with
// CUDA_ERROR_INVALID_CONTEXT, or silently targets another device.
// TestGPUConcurrentLaunches and TestGPUThreadWithoutContext exercise that.

// ErrNoDevice is wrapped by the errors of Available and Open when the
// driver works but no GPU is visible.
var ErrNoDevice = errors.New("cuda: no CUDA device")

// ErrClosed is returned by methods of a Device after Close.
var ErrClosed = errors.New("cuda: device is closed")

// Device is one GPU, opened through its primary context (the context the
// CUDA runtime API, and so cuBLAS, also use). A Device is safe for
// concurrent use by several goroutines. Its methods make the context
// current on the calling OS thread for the duration of each call.
type Device struct {
	ordinal  int
	dev      int32   // CUdevice
	ctx      uintptr // CUcontext, the device's primary context
	name     string
	major    int
	minor    int
	smCount  int
	l2Bytes  int
	totalMem int
	closed   atomic.Bool
	vmm      bool // virtual memory management supported (and its calls found)

	cache atomic.Pointer[KernelCache] // nil: no on-disk kernel cache
	pages pageTable                   // physical pages mapped by MapPages
}

// DeviceCount returns the number of CUDA devices the driver exposes to this
// process (the driver applies CUDA_VISIBLE_DEVICES). It returns an error
// when the driver library is missing or cuInit fails for a reason other
// than "no device".
func DeviceCount() (int, error) {
	if err := loadDriver(); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == cudaErrNoDevice {
			return 0, nil
		}
		return 0, err
	}
	var n int32
	if err := cuCheck("cuDeviceGetCount", CCall(cuDrv.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Available returns nil when at least one usable CUDA device exists, or an
// error that says why not: the driver library is missing (a
// *LibraryError), cuInit failed (an *Error naming the CUresult), or no
// device is visible (wrapping ErrNoDevice, and naming CUDA_VISIBLE_DEVICES
// when it is set).
func Available() error {
	if err := loadDriver(); err != nil {
		var e *Error
		if errors.As(err, &e) {
			if e.Code == cudaErrNoDevice {
				return noDeviceError(e)
			}
			return fmt.Errorf("%w (%s)", err, cuInitHint(e.Code))
		}
		return err
	}
	n, err := DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return noDeviceError(nil)
	}
	return nil
}

// cuInitHint suggests a fix for a cuInit failure.
func cuInitHint(code int) string {
	switch code {
	case 34: // CUDA_ERROR_STUB_LIBRARY
		return "the libcuda.so that was loaded is the CUDA toolkit's link stub, not the driver: remove .../lib64/stubs from LD_LIBRARY_PATH"
	case 803: // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
		return "the user-space driver library and the loaded kernel module are different versions: reboot or reinstall the NVIDIA driver"
	case 804: // CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
		return "a CUDA forward-compatibility driver is installed but does not support this GPU: remove it from the library path"
	case 46: // CUDA_ERROR_DEVICE_UNAVAILABLE
		return "the GPU is busy or unavailable (exclusive compute mode, or in use by another process)"
	}
	return "is the NVIDIA kernel module loaded and /dev/nvidia* accessible?"
}

func noDeviceError(cause *Error) error {
	detail := ""
	if cause != nil {
		detail = " (" + cause.Name + ")"
	}
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return fmt.Errorf("%w visible%s: CUDA_VISIBLE_DEVICES=%q hides all devices (or lists none that exist)", ErrNoDevice, detail, v)
	}
	return fmt.Errorf("%w%s: the NVIDIA driver is installed but reports no GPU", ErrNoDevice, detail)
}

// Open opens the device with the given ordinal (0 .. DeviceCount()-1),
// retaining its primary context. Call Close when done.
func Open(ordinal int) (*Device, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device ordinal %d out of range: %d device(s) visible", ordinal, n)
	}
	d := &Device{ordinal: ordinal}
	if err := cuCheck("cuDeviceGet", CCall(cuDrv.cuDeviceGet, uintptr(unsafe.Pointer(&d.dev)), uintptr(ordinal))); err != nil {
		return nil, err
	}
	dev := uintptr(d.dev)
	name := make([]byte, 256)
	if err := cuCheck("cuDeviceGetName", CCall(cuDrv.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), dev)); err != nil {
		return nil, err
	}
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	d.name = string(name)
	attr := func(a int) (int, error) {
		var v int32
		err := cuCheck("cuDeviceGetAttribute", CCall(cuDrv.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), dev))
		return int(v), err
	}
	if d.major, err = attr(cuDevAttrComputeCapabilityMajr); err != nil {
		return nil, err
	}
	if d.minor, err = attr(cuDevAttrComputeCapabilityMinr); err != nil {
		return nil, err
	}
	if d.smCount, err = attr(cuDevAttrMultiprocessorCount); err != nil {
		return nil, err
	}
	if d.l2Bytes, err = attr(cuDevAttrL2CacheSize); err != nil {
		return nil, err
	}
	if v, err := attr(cuDevAttrVirtualMemoryMgmt); err == nil && v != 0 && cuDrv.cuMemMap != 0 &&
		cuDrv.cuMemAddressReserve != 0 && cuDrv.cuMemCreate != 0 && cuDrv.cuMemSetAccess != 0 &&
		cuDrv.cuMemUnmap != 0 && cuDrv.cuMemRelease != 0 && cuDrv.cuMemAddressFree != 0 &&
		cuDrv.cuMemGetAllocationGranularity != 0 {
		d.vmm = true
	}
	var total uintptr
	if err := cuCheck("cuDeviceTotalMem_v2", CCall(cuDrv.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), dev)); err != nil {
		return nil, err
	}
	d.totalMem = int(total)
	if err := cuCheck("cuDevicePrimaryCtxRetain", CCall(cuDrv.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), dev)); err != nil {
		return nil, err
	}
	d.cache.Store(DefaultKernelCache())
	return d, nil
}

// Close releases the primary context. When no other Device (or other user
// of the runtime API in this process) retains it, the context is destroyed
// with all its memory, streams, events, modules and cuBLAS state: free or
// destroy them first. Close is idempotent; it must not race with other
// calls on d.
func (d *Device) Close() error {
	if d == nil || !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	return cuCheck("cuDevicePrimaryCtxRelease_v2", CCall(cuDrv.cuDevicePrimaryCtxRelease, uintptr(d.dev)))
}

// enter pins the calling goroutine to its OS thread and makes d's context
// current there. Every successful enter must be followed by leave.
func (d *Device) enter() error {
	if d == nil || d.closed.Load() {
		if d == nil {
			return ErrNilDevice
		}
		return ErrClosed
	}
	runtime.LockOSThread()
	if r := CCall(cuDrv.cuCtxSetCurrent, d.ctx); uint32(r) != cudaSuccess {
		runtime.UnlockOSThread()
		return newDriverError("cuCtxSetCurrent", uint32(r))
	}
	if testHookEnter != nil {
		testHookEnter()
	}
	return nil
}

// testHookEnter, when set by a test, runs between cuCtxSetCurrent and the
// driver call; TestGPUConcurrentLaunches sets it to runtime.Gosched so that
// a goroutine not pinned to its thread would very likely resume elsewhere.
var testHookEnter func()

func (d *Device) leave() { runtime.UnlockOSThread() }

// Enter is enter for the bindings of other NVIDIA libraries (package cuda's
// cuDNN and NCCL), whose calls must run on the device's context: it pins the
// calling goroutine to its OS thread and makes d's context current there.
// Every successful Enter must be followed by Leave; prefer Do.
func (d *Device) Enter() error { return d.enter() }

// Leave ends what Enter began: it unpins the goroutine from its thread.
func (d *Device) Leave() { d.leave() }

// Do runs fn on the calling goroutine's OS thread with the device's context
// current and the goroutine locked to that thread until fn returns. Use it
// to issue raw driver calls that have no wrapper here. fn must not start
// goroutines that expect the context.
func (d *Device) Do(fn func() error) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	return fn()
}

// Ordinal is the device number passed to Open.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the device's product name, e.g. "NVIDIA H200".
func (d *Device) Name() string { return d.name }

// ComputeCapability returns the SM version, e.g. (9, 0) for Hopper.
func (d *Device) ComputeCapability() (major, minor int) { return d.major, d.minor }

// MultiprocessorCount is the number of SMs.
func (d *Device) MultiprocessorCount() int { return d.smCount }

// TotalMemory is the device memory size in bytes.
func (d *Device) TotalMemory() int { return d.totalMem }

// L2CacheBytes is the size of the device's L2 cache.
func (d *Device) L2CacheBytes() int { return d.l2Bytes }

func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d (%s, sm_%d%d, %.1f GiB)", d.ordinal, d.name, d.major, d.minor, float64(d.totalMem)/(1<<30))
}

// MemGetInfo returns the free and total device memory in bytes
// (cuMemGetInfo_v2).
func (d *Device) MemGetInfo() (free, total int, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	var f, t uintptr
	r := CCall(cuDrv.cuMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t)))
	d.leave()
	if err := cuCheck("cuMemGetInfo_v2", r); err != nil {
		return 0, 0, err
	}
	return int(f), int(t), nil
}

// MemAlloc allocates bytes of device memory (cuMemAlloc_v2; 256-byte
// aligned). On CUDA_ERROR_OUT_OF_MEMORY the error satisfies
// errors.Is(err, ErrDeviceOutOfMemory).
func (d *Device) MemAlloc(bytes int) (uintptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: MemAlloc(%d): size must be positive", bytes)
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	var p uintptr
	r := CCall(cuDrv.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes))
	d.leave()
	if err := cuCheck("cuMemAlloc_v2", r); err != nil {
		return 0, err
	}
	return p, nil
}

// MemFree frees memory from MemAlloc (cuMemFree_v2). Freeing 0 is a no-op.
// cuMemFree synchronizes the device if work may still use the memory.
func (d *Device) MemFree(ptr uintptr) error {
	if ptr == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuMemFree, ptr)
	d.leave()
	return cuCheck("cuMemFree_v2", r)
}

// --- streams ---

// NewStream creates a stream with CU_STREAM_NON_BLOCKING: it does not
// synchronize with the legacy default stream (Stream 0), so work on it can
// overlap work other code queues on stream 0.
func (d *Device) NewStream() (Stream, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	var s uintptr
	r := CCall(cuDrv.cuStreamCreate, uintptr(unsafe.Pointer(&s)), cuStreamNonBlocking)
	d.leave()
	if err := cuCheck("cuStreamCreate", r); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// Synchronize blocks until all work queued on s has finished
// (cuStreamSynchronize). Stream 0 is the legacy default stream, which does
// NOT wait for non-blocking streams; use SynchronizeDevice for everything.
func (d *Device) Synchronize(s Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuStreamSynchronize, uintptr(s))
	d.leave()
	return cuCheck("cuStreamSynchronize", r)
}

// SynchronizeDevice blocks until all work on the device's context has
// finished (cuCtxSynchronize).
func (d *Device) SynchronizeDevice() error {
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuCtxSynchronize)
	d.leave()
	return cuCheck("cuCtxSynchronize", r)
}

// DestroyStream destroys s (cuStreamDestroy_v2). Work already queued on s
// still completes. Destroying stream 0 is a no-op.
func (d *Device) DestroyStream(s Stream) error {
	if s == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuStreamDestroy, uintptr(s))
	d.leave()
	return cuCheck("cuStreamDestroy_v2", r)
}

// --- events ---

// NewEvent creates an event; with timing false it is created with
// CU_EVENT_DISABLE_TIMING (cheaper; for synchronization only). Record it
// with RecordEvent.
func (d *Device) NewEvent(timing bool) (Event, error) {
	flags := uintptr(cuEventDisableTimng)
	if timing {
		flags = cuEventDefault
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	var e uintptr
	r := CCall(cuDrv.cuEventCreate, uintptr(unsafe.Pointer(&e)), flags)
	d.leave()
	if err := cuCheck("cuEventCreate", r); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// RecordEvent records e on stream s (cuEventRecord): e completes when all
// work queued on s before it has completed.
func (d *Device) RecordEvent(e Event, s Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuEventRecord, uintptr(e), uintptr(s))
	d.leave()
	return cuCheck("cuEventRecord", r)
}

// StreamWaitEvent makes the work queued on s after this call wait until e
// has completed (cuStreamWaitEvent), without blocking the host. Inside a
// graph capture it joins s to the capture of the stream e was recorded on.
func (d *Device) StreamWaitEvent(s Stream, e Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuStreamWaitEvent, uintptr(s), uintptr(e), 0)
	d.leave()
	return cuCheck("cuStreamWaitEvent", r)
}

// EventRecord creates a (non-timing) event and records it on s. It is the
// allocator's way of learning when a stream has passed a point.
func (d *Device) EventRecord(s Stream) (Event, error) {
	e, err := d.NewEvent(false)
	if err != nil {
		return 0, err
	}
	if err := d.RecordEvent(e, s); err != nil {
		_ = d.EventDestroy(e)
		return 0, err
	}
	return e, nil
}

// EventQuery reports whether e has completed (cuEventQuery).
// CUDA_ERROR_NOT_READY is (false, nil).
func (d *Device) EventQuery(e Event) (bool, error) {
	if err := d.enter(); err != nil {
		return false, err
	}
	r := CCall(cuDrv.cuEventQuery, uintptr(e))
	d.leave()
	switch uint32(r) {
	case cudaSuccess:
		return true, nil
	case cudaErrNotReady:
		return false, nil
	}
	return false, newDriverError("cuEventQuery", uint32(r))
}

// EventSynchronize blocks until e has completed (cuEventSynchronize).
func (d *Device) EventSynchronize(e Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuEventSynchronize, uintptr(e))
	d.leave()
	return cuCheck("cuEventSynchronize", r)
}

// EventElapsed returns the GPU time between two completed timing events
// (cuEventElapsedTime; resolution about 0.5 us). Both must have been created
// with NewEvent(true) and recorded; it waits for end first.
func (d *Device) EventElapsed(start, end Event) (time.Duration, error) {
	if err := d.EventSynchronize(end); err != nil {
		return 0, err
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	var ms float32
	r := CCall(cuDrv.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end))
	d.leave()
	if err := cuCheck("cuEventElapsedTime", r); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// EventDestroy destroys e (cuEventDestroy_v2). If e has not completed yet,
// the driver releases it once it completes.
func (d *Device) EventDestroy(e Event) error {
	if e == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuEventDestroy, uintptr(e))
	d.leave()
	return cuCheck("cuEventDestroy_v2", r)
}

// --- copies ---
//
// Stream semantics of the copies:
//
//   - CopyHtoD with s == 0 is synchronous (cuMemcpyHtoD_v2 followed by a
//     synchronization of the legacy stream): when it returns the data is in
//     device memory, visible to work later queued on any stream, and src
//     may be reused or collected. With
//     s != 0 it is asynchronous (cuMemcpyHtoDAsync_v2), ordered on s: src
//     must stay alive and unmodified until s is synchronized (or an event
//     recorded after the copy has completed). For ordinary pageable Go
//     memory the driver in fact stages the data before returning, but that
//     is not promised for pinned memory, so code must not rely on it.
//   - CopyDtoH always returns with the data in dst: it queues the copy on s
//     and then synchronizes s (for s == 0, cuMemcpyDtoH_v2).
//   - CopyDtoD and Memset32 are asynchronous on s.
//
// Stream 0 is the legacy default stream: it waits for blocking streams but
// not for streams from NewStream (non-blocking). Use the same stream for a
// kernel and the copies of its data.

// CopyHtoD copies bytes from host memory src to device memory dst.
func (d *Device) CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int, s Stream) error {
	if bytes <= 0 {
		return checkCopySize("CopyHtoD", bytes)
	}
	if err := d.enter(); err != nil {
		return err
	}
	var r uintptr
	name := "cuMemcpyHtoD_v2"
	if s == 0 {
		// cuMemcpyHtoD returns once pageable src is staged, possibly before
		// the DMA has landed; synchronizing the legacy stream makes the data
		// visible to work queued on any stream afterwards.
		r = CCall(cuDrv.cuMemcpyHtoD, dst, uintptr(src), uintptr(bytes))
		if uint32(r) == cudaSuccess {
			name = "cuStreamSynchronize"
			r = CCall(cuDrv.cuStreamSynchronize, 0)
		}
	} else {
		name = "cuMemcpyHtoDAsync_v2"
		r = CCall(cuDrv.cuMemcpyHtoDAsync, dst, uintptr(src), uintptr(bytes), uintptr(s))
	}
	d.leave()
	return cuCheck(name, r)
}

// CopyDtoH copies bytes from device memory src to host memory dst and
// returns once the data is in dst (after all work queued on s before it).
func (d *Device) CopyDtoH(dst unsafe.Pointer, src uintptr, bytes int, s Stream) error {
	if bytes <= 0 {
		return checkCopySize("CopyDtoH", bytes)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	if s == 0 {
		return cuCheck("cuMemcpyDtoH_v2", CCall(cuDrv.cuMemcpyDtoH, uintptr(dst), src, uintptr(bytes)))
	}
	if err := cuCheck("cuMemcpyDtoHAsync_v2", CCall(cuDrv.cuMemcpyDtoHAsync, uintptr(dst), src, uintptr(bytes), uintptr(s))); err != nil {
		return err
	}
	err := cuCheck("cuStreamSynchronize", CCall(cuDrv.cuStreamSynchronize, uintptr(s)))
	runtime.KeepAlive(dst)
	return err
}

// CopyDtoD copies bytes between device buffers, asynchronously on s.
func (d *Device) CopyDtoD(dst, src uintptr, bytes int, s Stream) error {
	if bytes <= 0 {
		return checkCopySize("CopyDtoD", bytes)
	}
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuMemcpyDtoDAsync, dst, src, uintptr(bytes), uintptr(s))
	d.leave()
	return cuCheck("cuMemcpyDtoDAsync_v2", r)
}

// Memset32 sets count 32-bit words at dst (4-byte aligned) to value,
// asynchronously on s (cuMemsetD32Async). Use math.Float32bits for floats.
func (d *Device) Memset32(dst uintptr, value uint32, count int, s Stream) error {
	if count <= 0 {
		return checkCopySize("Memset32", count)
	}
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuMemsetD32Async, dst, uintptr(value), uintptr(count), uintptr(s))
	d.leave()
	return cuCheck("cuMemsetD32Async", r)
}

func checkCopySize(op string, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: %s: negative size %d", op, n)
	}
	return nil // zero bytes: nothing to do
}

// --- CUDA graphs ---

// Graph is a captured CUDA graph (CUgraph).
type Graph struct {
	d *Device
	h uintptr
}

// GraphExec is an instantiated, launchable graph (CUgraphExec).
type GraphExec struct {
	d *Device
	h uintptr
}

// BeginCapture starts capturing the work queued on s into a graph instead
// of running it (cuStreamBeginCapture_v2). s must be a stream from
// NewStream: the legacy default stream cannot be captured.
//
// The capture uses CU_STREAM_CAPTURE_MODE_RELAXED. The stricter modes tie
// the capture to the OS thread that began it (cuStreamEndCapture must then
// come from the same thread, and that thread may not make "unsafe" calls
// such as cuMemAlloc), but goroutines change threads, and in THREAD_LOCAL /
// GLOBAL mode an unrelated goroutine running on the capturing thread (or,
// for GLOBAL, on any thread), e.g. the caching allocator growing its pool,
// would invalidate the capture or fail. Relaxed mode leaves correctness to
// the caller: during a capture do not synchronize s, query events recorded
// on it, or copy to/from pageable memory on it; memory allocated during the
// capture is really allocated (not captured), which is what a caching
// allocator wants.
func (d *Device) BeginCapture(s Stream) error {
	if s == 0 {
		return errors.New("cuda: BeginCapture: the legacy default stream (0) cannot be captured; use a stream from NewStream")
	}
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuStreamBeginCapture, uintptr(s), cuStreamCaptureModeRelaxed)
	d.leave()
	return cuCheck("cuStreamBeginCapture_v2", r)
}

// EndCapture ends the capture on s and returns the captured graph
// (cuStreamEndCapture). If an illegal operation invalidated the capture,
// the error is CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
func (d *Device) EndCapture(s Stream) (*Graph, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	var g uintptr
	r := CCall(cuDrv.cuStreamEndCapture, uintptr(s), uintptr(unsafe.Pointer(&g)))
	d.leave()
	if err := cuCheck("cuStreamEndCapture", r); err != nil {
		return nil, err
	}
	if g == 0 {
		return nil, errors.New("cuda: cuStreamEndCapture returned no graph (capture invalidated)")
	}
	return &Graph{d: d, h: g}, nil
}

// Instantiate creates an executable graph (cuGraphInstantiateWithFlags,
// flags 0). The Graph may be destroyed afterwards; the GraphExec is
// independent of it.
func (g *Graph) Instantiate() (*GraphExec, error) {
	if err := g.d.enter(); err != nil {
		return nil, err
	}
	var ge uintptr
	r := CCall(cuDrv.cuGraphInstantiateWithFlags, uintptr(unsafe.Pointer(&ge)), g.h, 0)
	g.d.leave()
	if err := cuCheck("cuGraphInstantiateWithFlags", r); err != nil {
		return nil, err
	}
	return &GraphExec{d: g.d, h: ge}, nil
}

// Destroy destroys the graph (cuGraphDestroy). Idempotent.
func (g *Graph) Destroy() error {
	if g == nil || g.h == 0 {
		return nil
	}
	if err := g.d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuGraphDestroy, g.h)
	g.d.leave()
	g.h = 0
	return cuCheck("cuGraphDestroy", r)
}

// Launch queues one replay of the graph on s (cuGraphLaunch). Replays of the
// same GraphExec are ordered with respect to each other.
func (ge *GraphExec) Launch(s Stream) error {
	if err := ge.d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuGraphLaunch, ge.h, uintptr(s))
	ge.d.leave()
	return cuCheck("cuGraphLaunch", r)
}

// Destroy destroys the executable graph (cuGraphExecDestroy). Idempotent.
func (ge *GraphExec) Destroy() error {
	if ge == nil || ge.h == 0 {
		return nil
	}
	if err := ge.d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuGraphExecDestroy, ge.h)
	ge.d.leave()
	ge.h = 0
	return cuCheck("cuGraphExecDestroy", r)
}
