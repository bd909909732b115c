package driver

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// Custom kernels: the Go counterpart of PyCUDA's SourceModule and CuPy's
// RawKernel. Compile CUDA C++ source with NVRTC for the device's own
// architecture, look up extern "C" kernels, and launch them with Go
// arguments. See the package documentation for an example.

// Module is compiled device code loaded into a device's context
// (CUmodule).
type Module struct {
	d    *Device
	h    uintptr
	Kind ImageKind // cubin or PTX
	Arch string    // target, e.g. "sm_90" (or "compute_90" for PTX)
	Log  string    // NVRTC's program log (warnings); empty on a cache hit

	mu    sync.Mutex
	funcs map[string]*Function
}

// Function is a kernel in a Module (CUfunction).
type Function struct {
	m    *Module
	h    uintptr
	Name string
}

// Dim3 is a grid or block shape. Y and Z of 0 are treated as 1.
type Dim3 struct{ X, Y, Z int }

// Grid1D returns the 1-D grid that covers n elements with blocks of block
// threads: ceil(n/block) blocks. The kernel must still bounds-check its
// index (i < n), since the last block may be partial.
func Grid1D(n, block int) Dim3 {
	if block <= 0 {
		block = 1
	}
	return Dim3{X: (n + block - 1) / block, Y: 1, Z: 1}
}

// SetKernelCache sets the on-disk cache Compile uses on this device; nil
// disables caching. Devices start with DefaultKernelCache().
func (d *Device) SetKernelCache(c *KernelCache) { d.cache.Store(c) }

// KernelCache returns the cache Compile uses (nil when disabled).
func (d *Device) KernelCache() *KernelCache { return d.cache.Load() }

// Compile compiles CUDA C++ source with NVRTC and loads it into the device.
//
// Unless opts already name one (--gpu-architecture / -arch), the target is
// the device's own architecture, --gpu-architecture=sm_XY, and the result
// is a cubin (nvrtcGetCUBIN); when NVRTC lacks cubin output or does not know
// this GPU, PTX for the newest architecture it knows is produced and the
// driver JIT-compiles it. Kernels to be looked up by name must be declared
// extern "C" (C++ names are mangled).
//
// The compiled image is cached on disk (see KernelCache): compiling the
// same source and options again, with the same NVRTC and GPU architecture,
// runs no compiler. A compile error is an *Error (NVRTC_ERROR_COMPILATION)
// whose Message holds the NVRTC program log.
func (d *Device) Compile(src string, opts ...string) (*Module, error) {
	if d == nil || d.closed.Load() {
		return nil, ErrClosed
	}
	if err := loadNVRTC(); err != nil {
		return nil, err
	}
	opts = slices.Clone(opts)
	arch := archOption(opts)
	cubin := false
	if arch == "" {
		var err error
		arch, cubin, err = chooseArch(d.major, d.minor, nvrtcArchs, nvrtcFn.nvrtcGetCUBIN != 0)
		if err != nil {
			return nil, err
		}
		opts = append(opts, "--gpu-architecture="+arch)
	} else {
		cubin = strings.HasPrefix(arch, "sm_") && nvrtcFn.nvrtcGetCUBIN != 0
	}
	cache := d.cache.Load()
	key := cacheKey(src, opts, nvrtcVersStr, arch)
	if cache != nil {
		if img, kind, ok := cache.Get(key); ok {
			m, err := d.loadModule(img, kind, arch)
			if err == nil {
				kstats.hits.Add(1)
				return m, nil
			}
			// The driver rejected a stored image (e.g. written by a broken
			// process, or a driver update): recompile and overwrite it.
			kstats.bad.Add(1)
			cache.Remove(key)
		} else {
			kstats.misses.Add(1)
		}
	}
	res, err := nvrtcCompile(src, "ember_kernel.cu", opts, cubin)
	if err != nil {
		return nil, err
	}
	m, err := d.loadModule(res.image, res.kind, arch)
	if err != nil {
		return nil, err
	}
	m.Log = res.log
	if cache != nil {
		if err := cache.Put(key, res.kind, res.image); err != nil {
			kstats.writeErr.Add(1)
		}
	}
	return m, nil
}

// LoadModule loads a cubin, fatbin or PTX image compiled elsewhere
// (cuModuleLoadData). PTX gets the NUL terminator the driver needs if it
// lacks one.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	// cubins are ELF files and fatbins start with 0xBA55ED50 (little
	// endian); anything else is taken to be PTX text.
	kind := ImagePTX
	if len(image) >= 4 && (string(image[:4]) == "\x7fELF" || string(image[:4]) == "\x50\xed\x55\xba") {
		kind = ImageCUBIN
	}
	return d.loadModule(image, kind, "")
}

func (d *Device) loadModule(image []byte, kind ImageKind, arch string) (*Module, error) {
	if len(image) == 0 {
		return nil, errors.New("cuda: empty module image")
	}
	if kind == ImagePTX && image[len(image)-1] != 0 {
		image = append(slices.Clip(image), 0)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	var h uintptr
	r := CCall(cuDrv.cuModuleLoadData, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&image[0])))
	d.leave()
	if err := cuCheck("cuModuleLoadData", r); err != nil {
		var e *Error
		if errors.As(err, &e) && kind == ImagePTX && (e.Name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" || e.Name == "CUDA_ERROR_INVALID_PTX") {
			e.Message += fmt.Sprintf(" (PTX from NVRTC %s; the driver supports CUDA %d.%d: install an NVRTC no newer than the driver, or update the driver)",
				nvrtcVersStr, driverVersion/1000, driverVersion%1000/10)
		}
		return nil, err
	}
	return &Module{d: d, h: h, Kind: kind, Arch: arch}, nil
}

// Function returns the kernel named name (cuModuleGetFunction). The name is
// the Symbol name: declare kernels extern "C" to look them up by their
// source name.
func (m *Module) Function(name string) (*Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == 0 {
		return nil, errors.New("cuda: module is unloaded")
	}
	if f, ok := m.funcs[name]; ok {
		return f, nil
	}
	cname := cString(name)
	if err := m.d.enter(); err != nil {
		return nil, err
	}
	var h uintptr
	r := CCall(cuDrv.cuModuleGetFunction, uintptr(unsafe.Pointer(&h)), m.h, uintptr(unsafe.Pointer(&cname[0])))
	m.d.leave()
	if err := cuCheck("cuModuleGetFunction", r); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Name == "CUDA_ERROR_NOT_FOUND" {
			e.Message += fmt.Sprintf(" (no kernel %q; is it declared extern \"C\"?)", name)
		}
		return nil, err
	}
	f := &Function{m: m, h: h, Name: name}
	if m.funcs == nil {
		m.funcs = map[string]*Function{}
	}
	m.funcs[name] = f
	return f, nil
}

// ErrNoEnumeration is FunctionNames' error on drivers older than CUDA 12.4.
var ErrNoEnumeration = errors.New("cuda: the driver cannot list a module's kernels (CUDA 12.4 or later can)")

// FunctionNames lists the kernels the module holds, by the names Function
// takes (cuModuleEnumerateFunctions, CUDA 12.4 and later; ErrNoEnumeration
// on older drivers).
func (m *Module) FunctionNames() ([]string, error) {
	if cuDrv.cuModuleGetFunctionCount == 0 || cuDrv.cuModuleEnumerateFunctions == 0 || cuDrv.cuFuncGetName == 0 {
		return nil, ErrNoEnumeration
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == 0 {
		return nil, errors.New("cuda: module is unloaded")
	}
	if err := m.d.enter(); err != nil {
		return nil, err
	}
	defer m.d.leave()
	var n uint32
	if err := cuCheck("cuModuleGetFunctionCount", CCall(cuDrv.cuModuleGetFunctionCount, uintptr(unsafe.Pointer(&n)), m.h)); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	hs := make([]uintptr, n)
	if err := cuCheck("cuModuleEnumerateFunctions", CCall(cuDrv.cuModuleEnumerateFunctions, uintptr(unsafe.Pointer(&hs[0])), uintptr(n), m.h)); err != nil {
		return nil, err
	}
	names := make([]string, 0, n)
	for _, h := range hs {
		var p uintptr
		if err := cuCheck("cuFuncGetName", CCall(cuDrv.cuFuncGetName, uintptr(unsafe.Pointer(&p)), h)); err != nil {
			return nil, err
		}
		names = append(names, GoString(p))
	}
	return names, nil
}

// Unload unloads the module (cuModuleUnload); its Functions become invalid.
// Idempotent.
func (m *Module) Unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == 0 {
		return nil
	}
	if err := m.d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuModuleUnload, m.h)
	m.d.leave()
	m.h = 0
	m.funcs = nil
	return cuCheck("cuModuleUnload", r)
}

// SetMaxDynamicSharedMemory allows launches of f with more than 48 KiB of
// dynamic shared memory (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
func (f *Function) SetMaxDynamicSharedMemory(bytes int) error {
	if err := f.m.d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuFuncSetAttribute, f.h, cuFuncAttrMaxDynamicSharedSizeBytes, uintptr(bytes))
	f.m.d.leave()
	return cuCheck("cuFuncSetAttribute", r)
}

// NumRegs is the number of registers each thread of f uses.
func (f *Function) NumRegs() (int, error) { return f.attr(cuFuncAttrNumRegs) }

// MaxThreadsPerBlock is the largest block f can be launched with.
func (f *Function) MaxThreadsPerBlock() (int, error) { return f.attr(cuFuncAttrMaxThreadsPerBlock) }

// ActiveBlocksPerSM is how many blocks of f, of block threads and
// dynamicShared bytes of dynamic shared memory each, an SM holds at once
// (its registers, shared memory and warps permitting).
func (f *Function) ActiveBlocksPerSM(block, dynamicShared int) (int, error) {
	if err := f.m.d.enter(); err != nil {
		return 0, err
	}
	var v int32
	r := CCall(cuDrv.cuOccupancyMaxActiveBlocksPerMultiprocessor, uintptr(unsafe.Pointer(&v)), f.h, uintptr(block), uintptr(dynamicShared))
	f.m.d.leave()
	return int(v), cuCheck("cuOccupancyMaxActiveBlocksPerMultiprocessor", r)
}

func (f *Function) attr(a int) (int, error) {
	if err := f.m.d.enter(); err != nil {
		return 0, err
	}
	var v int32
	r := CCall(cuDrv.cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), f.h)
	f.m.d.leave()
	return int(v), cuCheck("cuFuncGetAttribute", r)
}

// MaxKernelParams bounds the arguments of one launch (64 x 8 bytes is far
// below the 4 KiB kernel parameter limit).
const MaxKernelParams = 64

// argBuf is the kernelParams storage of one launch: vals holds each
// argument's bytes, ptrs[i] = &vals[i] is the void** array cuLaunchKernel
// reads. It lives in the Go heap, which does not move objects; the
// self-pointers are computed once, stored as uintptr (the GC need not trace
// them: the buffer is kept alive by the launching call), and buffers are
// recycled through a sync.Pool so that a launch does not allocate them.
// cuLaunchKernel copies the parameter values before returning (also when
// the launch is captured into a graph), so a buffer is reusable at once.
type argBuf struct {
	vals [MaxKernelParams]uint64
	ptrs [MaxKernelParams]uintptr
}

var argPool = sync.Pool{New: func() any {
	b := new(argBuf)
	for i := range b.ptrs {
		b.ptrs[i] = uintptr(unsafe.Pointer(&b.vals[i]))
	}
	return b
}}

// kernelParams is the void** kernelParams argument of cuLaunchKernel for n
// arguments: the address of the pointer array (nil for no arguments).
func (b *argBuf) kernelParams(n int) unsafe.Pointer {
	if n == 0 {
		return nil
	}
	return unsafe.Pointer(&b.ptrs[0])
}

// packArgs writes the kernel arguments into vals in their C
// representation (little endian; the driver reads as many bytes as the
// kernel's parameter has).
func packArgs(vals []uint64, args []any) error {
	if len(args) > len(vals) {
		return fmt.Errorf("cuda: too many kernel arguments: %d (max %d)", len(args), len(vals))
	}
	for i, a := range args {
		var v uint64
		switch x := a.(type) {
		case uintptr: // device pointer
			v = uint64(x)
		case *Float32Buffer:
			v = uint64(x.Ptr())
		case int32:
			v = uint64(uint32(x))
		case uint32:
			v = uint64(x)
		case int64:
			v = uint64(x)
		case uint64:
			v = x
		case float32:
			v = uint64(math.Float32bits(x))
		case float64:
			v = math.Float64bits(x)
		case int:
			return fmt.Errorf("cuda: kernel argument %d has Go type int, whose C size is ambiguous: pass int32 (C int) or int64 (C long long)", i)
		default:
			return fmt.Errorf("cuda: kernel argument %d has unsupported type %T (use uintptr for device pointers, int32, uint32, int64, uint64, float32, float64)", i, a)
		}
		vals[i] = v
	}
	return nil
}

// Launch launches f on stream s with a grid of grid blocks of block
// threads, sharedMem bytes of dynamic shared memory, and the kernel
// arguments args, in the order of the kernel's parameters. Each argument
// must have the C type of its parameter:
//
//	Go uintptr (or *Float32Buffer)  ->  T* (a device pointer)
//	int32 / uint32                  ->  int / unsigned int
//	int64 / uint64                  ->  long long / unsigned long long (size_t)
//	float32 / float64               ->  float / double
//
// Go int is rejected because its C counterpart is ambiguous. Structs are
// not supported. The launch is asynchronous: errors in the kernel itself
// surface at the next synchronizing call. A grid with no blocks launches
// nothing and returns nil.
func (f *Function) Launch(grid, block Dim3, sharedMem int, s Stream, args ...any) error {
	g, err := launchDims("grid", grid)
	if err != nil || g[0]*g[1]*g[2] == 0 {
		return err
	}
	b, err := launchDims("block", block)
	if err != nil {
		return err
	}
	if b[0]*b[1]*b[2] == 0 {
		return fmt.Errorf("cuda: Launch %s: empty block %+v", f.Name, block)
	}
	if sharedMem < 0 || int64(sharedMem) > math.MaxUint32 {
		return fmt.Errorf("cuda: Launch %s: shared memory size %d out of range", f.Name, sharedMem)
	}
	buf := argPool.Get().(*argBuf)
	if err := packArgs(buf.vals[:], args); err != nil {
		argPool.Put(buf)
		return fmt.Errorf("cuda: Launch %s: %w", f.Name, err)
	}
	params := buf.kernelParams(len(args))
	if err := f.m.d.enter(); err != nil {
		argPool.Put(buf)
		return err
	}
	r := CCall(cuDrv.cuLaunchKernel, f.h,
		uintptr(g[0]), uintptr(g[1]), uintptr(g[2]),
		uintptr(b[0]), uintptr(b[1]), uintptr(b[2]),
		uintptr(sharedMem), uintptr(s), uintptr(params), 0)
	f.m.d.leave()
	runtime.KeepAlive(buf) // params points into buf
	argPool.Put(buf)
	if uint32(r) != cudaSuccess {
		e := newDriverError("cuLaunchKernel", uint32(r))
		e.Message += fmt.Sprintf(" (kernel %s, grid %v, block %v, shared %d)", f.Name, g, b, sharedMem)
		return e
	}
	return nil
}

func launchDims(what string, d Dim3) ([3]int, error) {
	v := [3]int{d.X, d.Y, d.Z}
	if v[1] == 0 {
		v[1] = 1
	}
	if v[2] == 0 {
		v[2] = 1
	}
	for _, x := range v {
		if x < 0 || int64(x) > math.MaxUint32 {
			return v, fmt.Errorf("cuda: invalid %s dimensions %+v", what, d)
		}
	}
	return v, nil
}

// Float32Buffer is a simple device array of float32 for user code and
// examples, allocated with cuMemAlloc directly (the framework's tensors use
// the caching allocator instead). Its copies are synchronous and, for
// safety, first wait for all work on the device (cuCtxSynchronize): simple,
// not fast. Use Device.CopyHtoD/CopyDtoH for stream-ordered copies.
type Float32Buffer struct {
	d   *Device
	ptr uintptr
	n   int
}

// AllocFloat32 allocates n float32 (uninitialized).
func (d *Device) AllocFloat32(n int) (*Float32Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: AllocFloat32(%d): length must be positive", n)
	}
	p, err := d.MemAlloc(4 * n)
	if err != nil {
		return nil, err
	}
	return &Float32Buffer{d: d, ptr: p, n: n}, nil
}

// Len is the number of elements.
func (b *Float32Buffer) Len() int { return b.n }

// Ptr is the device address, to pass as a kernel argument.
func (b *Float32Buffer) Ptr() uintptr {
	if b == nil {
		return 0
	}
	return b.ptr
}

// CopyFromHost copies src into the start of the buffer (len(src) <= Len()).
func (b *Float32Buffer) CopyFromHost(src []float32) error {
	if err := b.check(len(src)); err != nil || len(src) == 0 {
		return err
	}
	if err := b.d.SynchronizeDevice(); err != nil {
		return err
	}
	return b.d.CopyHtoD(b.ptr, unsafe.Pointer(&src[0]), 4*len(src), 0)
}

// CopyToHost copies the first len(dst) elements into dst (len(dst) <= Len()).
func (b *Float32Buffer) CopyToHost(dst []float32) error {
	if err := b.check(len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	if err := b.d.SynchronizeDevice(); err != nil {
		return err
	}
	return b.d.CopyDtoH(unsafe.Pointer(&dst[0]), b.ptr, 4*len(dst), 0)
}

func (b *Float32Buffer) check(n int) error {
	if b == nil || b.ptr == 0 {
		return errors.New("cuda: use of a freed Float32Buffer")
	}
	if n > b.n {
		return fmt.Errorf("cuda: Float32Buffer of %d elements: host slice has %d", b.n, n)
	}
	return nil
}

// Free releases the device memory. Idempotent.
func (b *Float32Buffer) Free() error {
	if b == nil || b.ptr == 0 {
		return nil
	}
	err := b.d.MemFree(b.ptr)
	b.ptr = 0
	return err
}
