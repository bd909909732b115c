package cuda

// The CUDA implementation of tensor.Backend.
//
// What is where:
//   - backend.go (this file): Backend, NewBackend, memory (Alloc/Free through
//     the caching allocator), copies, and the elementwise, reduction, loss and
//     optimiser operations;
//   - conv.go: Conv2d, Conv2dBackward, MaxPool2d and its backward;
//   - conv_cudnn.go, cudnn.go: convolutions through cuDNN, when present;
//   - kernels.go: the embedded CUDA sources (kernels/*.cu) and the table of
//     kernel names;
//   - kernels/*.cu: the kernels, each file with a note on what it holds.
//
// Design. A Backend owns one Device, one non-blocking stream, one cuBLAS
// handle bound to that stream, one caching Allocator and one Module with
// every kernel (compiled once, by NVRTC, when the Backend is made, and cached
// on disk). Every operation is enqueued on the one stream and returns without
// waiting: operations are ordered by the stream, so memory freed by one
// operation (workspaces, tensors released by a Scope) can be handed by the
// allocator to the next operation at once, with no synchronization. Only
// Download and Synchronize wait for the GPU.
//
// All device work goes through a small executor interface (gpuExec here);
// tests without a GPU substitute a recorder that checks every launch against
// the kernels' C signatures and counts them (backend_test.go).
//
// Semantics follow tensor/cpu.go exactly (first maximum wins, NaN propagates,
// the torch.optim.SGD rule, ...). Reductions are deterministic (no atomics;
// fixed reduction trees in double precision), so the same inputs give the
// same bits on every run; see kernels/reduce.cu.
//
// Errors. A failed launch, copy or cuBLAS call panics with
// &tensor.Error{Op: "cuda: <op>", Err: err}, which tensor.Guard recovers. An
// error in a kernel itself (the GPU faulted) surfaces asynchronously, at the
// next Download or Synchronize. Alloc returns the allocator's error (an
// *OutOfMemoryError when memory runs out) instead of panicking. Misuse that
// is a programming error (a buffer of the wrong type or too short, a buffer
// of another backend) panics with a string, as the CPU backend does.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ember-ml/ember/tensor"
)

// The CUDA backend has its own kernels for every operation of
// tensor.CompleteBackend: Complete hands it back unwrapped.
var _ tensor.CompleteBackend = (*Backend)(nil)

// BackendOptions configures NewBackend.
type BackendOptions struct {
	// MemoryLimit caps the device memory the allocator reserves, in bytes;
	// 0 means no cap beyond the device's memory.
	MemoryLimit int
	// TF32 lets cuBLAS round GEMM inputs to TF32 on tensor cores (faster,
	// relative error about 1e-3). Off by default: full FP32.
	TF32 bool

	// Kernel choices, for comparisons and for bisecting a problem; the
	// zero value is the fastest configuration. OptionsFromEnv maps the
	// EMBER_* variables onto them.

	// NoConvRT leaves out the register-tiled convolution kernels
	// (conv_rt.go): im2col + cuBLAS and the older fused kernels instead.
	NoConvRT bool
	// NoLinearTiled sends linear layers of up to 256 rows through cuBLAS
	// and separate bias, ReLU and mask passes (linear.go).
	NoLinearTiled bool
	// LinearLt sends linear layers of more than 256 rows through cuBLASLt,
	// the bias, ReLU and bias gradient in its products' epilogues
	// (linear_lt.go), instead of cuBLAS and separate passes. Off by
	// default until the GPU benchmark has measured it
	// (TestGPULinearPathsBench, docs/performance.md).
	LinearLt bool
	// LinearLtEverywhere sends every linear layer cuBLASLt takes to it,
	// the small ones too (for comparisons).
	LinearLtEverywhere bool
	// NoLinearLtWide keeps wide layers of at most 256 rows (in·out of at
	// least 2^19: an MLP's 784→1024 and 1024→1024) on the tiled kernels.
	// By default they go to cuBLASLt, with their backward pass through
	// cuBLAS, which measured faster there (linear_lt.go).
	NoLinearLtWide bool
	// NoTuneProducts keeps the algorithm cuBLASLt's heuristics rank first
	// for each product shape instead of timing the first few on the
	// shape's first call (linear_lt_tune.go).
	NoTuneProducts bool
	// NoNarrow runs a last layer of at most 32 outputs and its cross
	// entropy as separate kernels (narrow.go).
	NoNarrow bool
	// NoCuDNN runs convolutions through im2col + cuBLAS even where cuDNN
	// is installed (conv_cudnn.go).
	NoCuDNN bool
	// ConvSearchAll times every algorithm cuDNN has at a convolution
	// geometry's first call (FindEx, as PyTorch's cudnn.benchmark does)
	// instead of the first few that cuDNN's heuristics rank (conv_cudnn.go).
	ConvSearchAll bool
	// NoBatchNormOnePass normalises every training batch norm in three
	// launches (statistics, their finish, y), also where a channel fits
	// in a block's shared memory (norm.go).
	NoBatchNormOnePass bool
	// NoGraphMemoryPlan makes CapturePlanned a plain Capture: the graph's
	// blocks are placed as they come instead of by a plan made from a
	// rehearsal of the capture (graph.go).
	NoGraphMemoryPlan bool
	// NoSideStream keeps every operation on one stream: a captured step
	// then has no parallel branches (side.go).
	NoSideStream bool
	// NoExpandableSegments makes one driver allocation per memory segment
	// instead of mapping pages into one address range (package cuda/alloc).
	NoExpandableSegments bool
	// BLASWorkspaceMiB is the cuBLAS workspace taken from the allocator:
	// 0 means the default (32 MiB), a negative value none.
	BLASWorkspaceMiB int
	// BLASOwnWorkspace leaves cuBLAS to allocate its own workspace, out of
	// sight of the allocator's statistics.
	BLASOwnWorkspace bool

	// KernelCache is where compiled kernels are kept between runs: "" the
	// default (os.UserCacheDir()/ember/kernels), "off" nowhere, anything
	// else a directory (driver.KernelCacheFor).
	KernelCache string
	// KernelBundle is where precompiled kernels come from (kernels_bundle.go):
	// "" the bundle embedded in the binary, "off" none (every unit is
	// compiled, or read from KernelCache), anything else a bundle file
	// written by cmd/kernelbundle.
	KernelBundle string
	// KernelLog, when not nil, gets one line per kernel unit as it becomes
	// ready (compiled or read from the cache) with the seconds it took,
	// and one per cuDNN algorithm search: what a cold start spends where
	// (kernels_load.go, conv_cudnn.go).
	KernelLog io.Writer
}

// OptionsFromEnv returns opt with the kernel choices that the environment
// sets: EMBER_CUDNN_SEARCH=all sets ConvSearchAll, EMBER_CONV_RT=0, EMBER_CUDNN=0, EMBER_LINEAR_TILED=0, EMBER_LINEAR_NARROW=0,
// EMBER_SIDE_STREAM=0, EMBER_GRAPH_PLAN=0, EMBER_EXPANDABLE_SEGMENTS=0, EMBER_BN_ONEPASS=0, EMBER_LT_TUNE=0 turn the matching
// feature off, EMBER_LINEAR_LT=1 sets LinearLt, =all LinearLtEverywhere
// and =0 NoLinearLtWide,
// EMBER_CUBLAS_WORKSPACE is a size in MiB ("0": none) or "cublas",
// EMBER_KERNEL_CACHE (a directory, or "off") sets KernelCache and
// EMBER_KERNEL_BUNDLE (a file, or "off") KernelBundle where opt leaves
// them empty, and EMBER_KERNEL_LOG=1 sends KernelLog to standard
// error. The library itself reads no
// variable: commands and tests call this.
func OptionsFromEnv(opt BackendOptions) (BackendOptions, error) {
	off := func(name string) bool { return os.Getenv(name) == "0" }
	opt.NoConvRT = opt.NoConvRT || off("EMBER_CONV_RT")
	opt.NoCuDNN = opt.NoCuDNN || off("EMBER_CUDNN")
	switch v := os.Getenv("EMBER_CUDNN_SEARCH"); v {
	case "":
	case "all":
		opt.ConvSearchAll = true
	default:
		return opt, fmt.Errorf("cuda: EMBER_CUDNN_SEARCH=%q: want all (or unset)", v)
	}
	opt.NoLinearTiled = opt.NoLinearTiled || off("EMBER_LINEAR_TILED")
	switch v := os.Getenv("EMBER_LINEAR_LT"); v {
	case "":
	case "0":
		opt.NoLinearLtWide = true
	case "1":
		opt.LinearLt = true
	case "all":
		opt.LinearLtEverywhere = true
	default:
		return opt, fmt.Errorf("cuda: EMBER_LINEAR_LT=%q: want 0, 1 or all", v)
	}
	opt.NoNarrow = opt.NoNarrow || off("EMBER_LINEAR_NARROW")
	opt.NoSideStream = opt.NoSideStream || off("EMBER_SIDE_STREAM")
	opt.NoGraphMemoryPlan = opt.NoGraphMemoryPlan || off("EMBER_GRAPH_PLAN")
	opt.NoTuneProducts = opt.NoTuneProducts || off("EMBER_LT_TUNE")
	opt.NoBatchNormOnePass = opt.NoBatchNormOnePass || off("EMBER_BN_ONEPASS")
	opt.NoExpandableSegments = opt.NoExpandableSegments || off("EMBER_EXPANDABLE_SEGMENTS")
	if opt.KernelCache == "" {
		opt.KernelCache = os.Getenv("EMBER_KERNEL_CACHE")
	}
	if opt.KernelBundle == "" {
		opt.KernelBundle = os.Getenv("EMBER_KERNEL_BUNDLE")
	}
	if opt.KernelLog == nil && os.Getenv("EMBER_KERNEL_LOG") == "1" {
		opt.KernelLog = os.Stderr
	}
	switch v := os.Getenv("EMBER_CUBLAS_WORKSPACE"); v {
	case "":
	case "cublas":
		opt.BLASOwnWorkspace = true
	default:
		mib, err := strconv.Atoi(v)
		if err != nil || mib < 0 {
			return opt, fmt.Errorf("cuda: EMBER_CUBLAS_WORKSPACE=%q: want a size in MiB, or cublas", v)
		}
		opt.BLASWorkspaceMiB = mib
		if mib == 0 {
			opt.BLASWorkspaceMiB = -1
		}
	}
	return opt, nil
}

// Backend runs tensor operations on one GPU. It is safe for concurrent use;
// all work goes to one stream, in the order the calls are made.
type Backend struct {
	dev    *Device
	stream Stream
	blas   *BLAS
	alloc  *Allocator
	kl     *kernelLoader        // compiles the kernel units on demand (kernels_load.go); nil in tests that load every kernel
	bundle *KernelBundle        // precompiled units (kernels_bundle.go); nil: none
	fnMu   sync.RWMutex         // guards fns
	fns    map[string]*Function // the kernels of the units compiled so far, by extern "C" name
	waves  sync.Map             // waveKey → int: wave's answers
	x      executor             // where device work goes: the GPU, or a recorder in tests
	name   string

	mu       sync.Mutex
	deferred error // errors of Free, reported by Synchronize

	blasWorkspace Block // cuBLAS's workspace, from the allocator
	closed        atomic.Bool

	opt           BackendOptions
	noConvRT      bool         // no register-tiled convolution kernels (conv_rt.go)
	noLinearTiled bool         // no tiled linear kernels (linear.go)
	lt            *Lt          // cuBLASLt; nil without it (linear_lt.go)
	ltErr         error        // why lt is nil
	ltEverywhere  bool         // every linear layer cuBLASLt takes goes to it
	ltWide        bool         // wide layers of at most 256 rows go to it
	ltCalls       atomic.Int64 // products queued through cuBLASLt (tests, benchmarks)
	ltTune        ltTuner      // the shapes whose algorithm was chosen (linear_lt_tune.go)
	noNarrow      bool         // no narrow-layer kernels (narrow.go)
	noClusters    bool         // split sums of linear.cu without clusters even on sm_90 (tests)
	tileCounters  Block        // counters: split sums (linear.cu), linear_xent's blocks (narrow.cu), conv_dx_rt's image queue, reductions' joins
	streamAll     bool         // every reduction's input read as streamed, whatever its size (tests)
	side          *sideLane    // nil with EMBER_SIDE_STREAM=0
	dnn           *dnnConvs    // cuDNN's convolutions; nil without cuDNN (conv_cudnn.go)
	dnnErr        error        // why dnn is nil
	dnnEverywhere bool         // every geometry cuDNN takes goes to it (tests, benchmarks)
	capturing     atomic.Bool
	rehearsing    atomic.Bool  // a capture is rehearsed (graph.go)
	convGuesses   atomic.Int64 // convolutions captured on cuDNN's heuristic pick, unsearched (conv_cudnn.go)
	gen           generated    // generated elementwise kernels (ewk.go)

	bnOne bnOnePassState // one-pass batch norm's shared memory (norm.go)
}

// Launch geometry. blockSize threads per block for 1-D kernels; grids are
// capped at maxGrid blocks (the kernels loop), which keeps every 1-D index
// far from overflow and the GPU full (4096 blocks of 256 threads is more than
// an H200's 132 SMs hold at once).
const (
	blockSize = 256
	maxGrid   = 4096
)

// NewBackend opens GPU ordinal and prepares it for tensors: a stream, a
// cuBLAS handle, the compiled kernels and a caching allocator.
func NewBackend(ordinal int, opt BackendOptions) (*Backend, error) {
	if opt.MemoryLimit < 0 {
		return nil, fmt.Errorf("cuda: NewBackend: negative memory limit %d", opt.MemoryLimit)
	}
	dev, err := Open(ordinal)
	if err != nil {
		return nil, err
	}
	if opt.KernelCache != "" {
		dev.SetKernelCache(KernelCacheFor(opt.KernelCache))
	}
	b := &Backend{dev: dev, name: fmt.Sprintf("cuda:%d", ordinal), opt: opt, noConvRT: opt.NoConvRT,
		noLinearTiled: opt.NoLinearTiled, noNarrow: opt.NoNarrow}
	ok := false
	defer func() {
		if !ok {
			b.Close()
		}
	}()
	if b.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	if b.blas, err = dev.NewBLAS(b.stream); err != nil {
		return nil, err
	}
	if err = b.blas.SetTF32(opt.TF32); err != nil {
		return nil, err
	}
	b.openCuDNN()
	if !opt.NoSideStream {
		if err = b.openSideLane(); err != nil {
			return nil, err
		}
	}
	b.x = &gpuExec{dev: dev, blas: b.blas, stream: b.stream, side: b.side, rehearsing: &b.rehearsing}
	if err = b.openBundle(); err != nil {
		return nil, err
	}
	if b.kl, err = newKernelLoader(b); err != nil {
		return nil, err
	}
	for _, i := range prefetchUnits {
		b.kl.begin(i)
	}
	if err = b.kl.wait(eagerUnits...); err != nil {
		return nil, err
	}
	b.alloc = NewAllocator(dev, AllocatorOptions{Limit: opt.MemoryLimit, Expandable: dev.VirtualMemorySupported() && !opt.NoExpandableSegments})
	if b.side != nil {
		b.side.alloc = b.alloc
	}
	if err = b.setBLASWorkspace(); err != nil {
		return nil, err
	}
	b.openLt()
	if err = b.allocTileCounters(); err != nil {
		return nil, err
	}
	if err = b.probeClusters(); err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

// Name is "cuda:N".
func (b *Backend) Name() string { return b.name }

// Device is the GPU.
func (b *Backend) Device() *Device { return b.dev }

// Allocator is the caching allocator all tensor memory comes from.
func (b *Backend) Allocator() *Allocator { return b.alloc }

// MemoryStats returns the allocator's statistics.
func (b *Backend) MemoryStats() MemoryStats { return b.alloc.Stats() }

// Stream is the stream every operation is queued on.
func (b *Backend) Stream() Stream { return b.stream }

// Close waits for queued work and releases the stream, the cuBLAS handle,
// the kernels, the allocator's cached memory and the device. Tensors still
// alive must not be used afterwards. Close is idempotent.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	if b.stream != 0 {
		errs = append(errs, b.dev.Synchronize(b.stream))
	}
	if b.lt != nil {
		errs = append(errs, b.lt.Close())
	}
	if b.blas != nil {
		errs = append(errs, b.blas.Close())
	}
	errs = append(errs, b.dnn.close())
	errs = append(errs, b.closeSideLane()...)
	for _, blk := range []Block{b.blasWorkspace, b.tileCounters} {
		if !blk.IsZero() {
			errs = append(errs, b.alloc.Free(blk))
		}
	}
	errs = append(errs, b.gen.unload()...)
	if b.kl != nil {
		b.kl.settle() // a compile in flight loads its module: wait, then unload it
		for _, m := range b.kl.modules() {
			errs = append(errs, m.Unload())
		}
	}
	if b.alloc != nil {
		errs = append(errs, b.alloc.EmptyCache())
	}
	if b.stream != 0 {
		errs = append(errs, b.dev.DestroyStream(b.stream))
	}
	errs = append(errs, b.dev.Close())
	return errors.Join(errs...)
}

// Synchronize waits for all queued work and returns the first device error,
// together with any error of an earlier Free.
func (b *Backend) Synchronize() error {
	err := b.x.synchronize()
	b.mu.Lock()
	d := b.deferred
	b.deferred = nil
	b.mu.Unlock()
	return errors.Join(err, d)
}

func (b *Backend) deferError(err error) {
	b.mu.Lock()
	if b.deferred == nil {
		b.deferred = err
	}
	b.mu.Unlock()
}

// ---- memory ----

// blockMemory is a tensor.Memory: one block of the caching allocator.
type blockMemory struct {
	blk   Block // the zero Block for zero bytes
	bytes int
	owner *Backend
	freed atomic.Bool
}

func (m *blockMemory) Bytes() int { return m.bytes }

// Alloc returns n uninitialised elements of type dt. It fails with the
// allocator's error (an *OutOfMemoryError, wrapping ErrDeviceOutOfMemory)
// when the memory cannot be found.
func (b *Backend) Alloc(n int, dt tensor.DType) (tensor.Buffer, error) {
	switch dt {
	case tensor.Float32, tensor.Int32, tensor.Uint8, tensor.BFloat16:
	default:
		return tensor.Buffer{}, fmt.Errorf("cuda: Alloc: unknown dtype %v", dt)
	}
	if n < 0 || n > math.MaxInt/8 {
		return tensor.Buffer{}, fmt.Errorf("cuda: Alloc of %d elements", n)
	}
	m := &blockMemory{bytes: n * dt.Size(), owner: b}
	if m.bytes > 0 {
		blk, err := b.alloc.Alloc(m.bytes, b.stream)
		if err != nil {
			return tensor.Buffer{}, err
		}
		m.blk = blk
	}
	return tensor.Buffer{Mem: m, Len: n, DType: dt}, nil
}

// Free gives the memory back to the allocator's cache at once: work already
// queued that uses it runs before any later user, all being on one stream.
// Free may be called from any goroutine (Go's cleanups run on their own); it
// never panics, and a double free is reported by the next Synchronize.
func (b *Backend) Free(buf tensor.Buffer) {
	m, ok := buf.Mem.(*blockMemory)
	if !ok || m == nil {
		if buf.Mem != nil {
			b.deferError(fmt.Errorf("cuda: Free of memory %T not from a CUDA backend", buf.Mem))
		}
		return
	}
	if !m.freed.CompareAndSwap(false, true) {
		b.deferError(fmt.Errorf("cuda: double free of a %d-byte buffer", m.bytes))
		return
	}
	if m.bytes > 0 && !(m.owner == b && b.side.hold(m.blk, m.bytes)) {
		if err := m.owner.alloc.Free(m.blk); err != nil {
			b.deferError(err)
		}
	}
}

// ptr returns the device address of buf's first element, checking that buf
// belongs to b, has type dt and lies inside its memory.
func (b *Backend) ptr(op string, buf tensor.Buffer, dt tensor.DType) uintptr {
	m, ok := buf.Mem.(*blockMemory)
	if !ok || m == nil {
		panic(fmt.Sprintf("cuda: %s: buffer not allocated by a CUDA backend (memory %T)", op, buf.Mem))
	}
	if m.owner != b {
		panic(fmt.Sprintf("cuda: %s: buffer belongs to %s, not %s", op, m.owner.name, b.name))
	}
	if buf.DType != dt {
		panic(fmt.Sprintf("cuda: %s: want a %v buffer, have %v", op, dt, buf.DType))
	}
	if m.freed.Load() {
		panic(fmt.Sprintf("cuda: %s: use of a freed buffer", op))
	}
	if buf.Off < 0 || buf.Len < 0 || (buf.Off+buf.Len)*dt.Size() > m.bytes {
		panic(fmt.Sprintf("cuda: %s: buffer window [%d, %d) outside its %d-byte memory", op, buf.Off, buf.Off+buf.Len, m.bytes))
	}
	return m.blk.Ptr() + uintptr(buf.Off*dt.Size())
}

func (b *Backend) f32(op string, buf tensor.Buffer) uintptr { return b.ptr(op, buf, tensor.Float32) }
func (b *Backend) i32(op string, buf tensor.Buffer) uintptr { return b.ptr(op, buf, tensor.Int32) }

// need panics when buf holds fewer than n elements.
func need(op, what string, buf tensor.Buffer, n int) {
	if buf.Len < n {
		panic(fmt.Sprintf("cuda: %s: %s has %d elements, need %d", op, what, buf.Len, n))
	}
}

// f32Opt is f32 of an optional buffer of at least n elements: 0 when it is
// empty (not wanted).
func (b *Backend) f32Opt(op, what string, buf tensor.Buffer, n int) uintptr {
	if buf.Empty() {
		return 0
	}
	need(op, what, buf, n)
	return b.f32(op, buf)
}

// workspace allocates temporary device memory for one operation; release
// it as soon as the operation's work is queued.
func (b *Backend) workspace(op string, bytes int) Block {
	blk, err := b.alloc.Alloc(bytes, b.stream)
	if err != nil {
		panic(&tensor.Error{Op: "cuda: " + op, Err: err})
	}
	return blk
}

func (b *Backend) release(blk Block) {
	if !blk.IsZero() && !b.side.hold(blk, blk.Size()) {
		if err := b.alloc.Free(blk); err != nil {
			b.deferError(err)
		}
	}
}

// ---- launching ----

// devCheck panics with a *tensor.Error when a device call failed.
func devCheck(op string, err error) {
	if err != nil {
		panic(&tensor.Error{Op: "cuda: " + op, Err: err})
	}
}

// executor is where the backend's device work goes: the GPU (gpuExec), or
// in tests without a GPU a recorder that checks every launch against the
// kernels' signatures.
type executor interface {
	launch(f *Function, grid, block Dim3, args []any) error
	sgemm(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, b uintptr, ldb int, beta float32, c uintptr, ldc int) error
	memset32(dst uintptr, v uint32, count int) error
	copyDtoD(dst, src uintptr, bytes int) error
	copyHtoD(dst uintptr, src unsafe.Pointer, bytes int) error
	copyDtoH(dst unsafe.Pointer, src uintptr, bytes int) error
	synchronize() error
	// parallel queues side with an executor that may run concurrently
	// with this one (another stream, while a graph is captured) and main on
	// this one; work queued after it returns waits for both. side may only
	// launch kernels and queue cuBLASLt products planned with NoWorkspace.
	parallel(side func(x executor), main func()) error
	// detach queues side like parallel but returns without joining it, so
	// that the operations after it can overlap it (see sideLane); uses is
	// the memory side reads and writes. Where parallel would run side at
	// once, so does detach.
	detach(uses []span, side func(x executor)) error
	// beside runs main, whose operations touch only the memory in uses,
	// without joining a detached side task unless the two conflict. main
	// may detach a task itself; beside does not check main's later
	// operations against it, so that task must touch nothing main writes
	// after queuing it (biasGradCols' finish: LinearGrads writes db no more).
	beside(uses []span, main func()) error
	// settle joins the detached side tasks, if any, into this stream.
	settle() error
}

// gpuExec queues everything on one stream of one device.
type gpuExec struct {
	dev    *Device
	blas   *BLAS // nil on the side lane's executor
	stream Stream
	side   *sideLane
	lt     *Lt // cuBLASLt, nil without it; without a workspace on the side lane's executor of parallel
	ltWS   Block
	// rehearsing is set while a capture is rehearsed on memory that is
	// not there (graph.go): the driver refuses memset and copy nodes on
	// such addresses, and the rehearsal's graph never runs, so they are
	// left out of it.
	rehearsing *atomic.Bool
}

// rehearsal says whether the work queued now is a rehearsal's.
func (g *gpuExec) rehearsal() bool { return g.rehearsing != nil && g.rehearsing.Load() }

// Every operation on the main stream first joins a detached side task
// (settle), unless it runs inside beside: only beside checks what the two
// touch.

func (g *gpuExec) launch(f *Function, grid, block Dim3, args []any) error {
	if err := g.settle(); err != nil {
		return err
	}
	return f.Launch(grid, block, 0, g.stream, args...)
}

func (g *gpuExec) sgemm(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, b uintptr, ldb int, beta float32, c uintptr, ldc int) error {
	if g.blas == nil {
		return errors.New("cuda: a GEMM queued on the side stream, which has no cuBLAS handle")
	}
	if err := g.settle(); err != nil {
		return err
	}
	return g.blas.Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

func (g *gpuExec) memset32(dst uintptr, v uint32, count int) error {
	if err := g.settle(); err != nil || g.rehearsal() {
		return err
	}
	return g.dev.Memset32(dst, v, count, g.stream)
}

func (g *gpuExec) copyDtoD(dst, src uintptr, bytes int) error {
	if err := g.settle(); err != nil || g.rehearsal() {
		return err
	}
	return g.dev.CopyDtoD(dst, src, bytes, g.stream)
}

func (g *gpuExec) copyHtoD(dst uintptr, src unsafe.Pointer, bytes int) error {
	if err := g.settle(); err != nil {
		return err
	}
	return g.dev.CopyHtoD(dst, src, bytes, g.stream)
}

func (g *gpuExec) copyDtoH(dst unsafe.Pointer, src uintptr, bytes int) error {
	if err := g.settle(); err != nil {
		return err
	}
	return g.dev.CopyDtoH(dst, src, bytes, g.stream)
}

func (g *gpuExec) synchronize() error {
	return errors.Join(g.settle(), g.dev.Synchronize(g.stream))
}

// gridFor is the 1-D grid for n elements: one thread each, at most maxGrid
// blocks (the kernels' grid-stride loops do the rest).
func gridFor(n int) Dim3 {
	return Dim3{X: min(max((n+blockSize-1)/blockSize, 1), maxGrid), Y: 1, Z: 1}
}

// kernel returns the kernel of that extern "C" name, compiling its unit on
// first use (kernels_load.go). Operators look their
// kernels up by name, among those the compiled modules hold (lookupKernels:
// the sources' extern "C" declarations); a name no source defines is a
// programming error, which TestKernelNamesDefined catches without a GPU.
func (b *Backend) kernel(name string) *Function {
	f := b.loaded(name)
	if f == nil {
		panic(fmt.Sprintf("cuda: no kernel named %s in the backend's sources", name))
	}
	return f
}

// wave is how many blocks of kernel name, of block threads without dynamic
// shared memory, the GPU holds at once: its SMs times the blocks an SM
// holds (cached per kernel and block). A grid of a wave runs in one round
// where a larger one leaves a partial last round.
func (b *Backend) wave(name string, block int) int {
	key := waveKey{name, block}
	if v, ok := b.waves.Load(key); ok {
		return v.(int)
	}
	per, err := b.kernel(name).ActiveBlocksPerSM(block, 0)
	devCheck(name, err)
	n := max(1, per) * b.dev.MultiprocessorCount()
	b.waves.Store(key, n)
	return n
}

type waveKey struct {
	name  string
	block int
}

// hasKernel reports whether the modules hold that kernel: those that need
// sm_90 (thread block clusters) are compiled out for older devices.
func (b *Backend) hasKernel(name string) bool { return b.loaded(name) != nil }

// loaded returns the kernel of that name, compiling its unit first if this
// is the first use of one of its kernels; nil for a name the unit does not
// hold.
func (b *Backend) loaded(name string) *Function {
	b.fnMu.RLock()
	f := b.fns[name]
	b.fnMu.RUnlock()
	if f == nil && b.kl != nil {
		b.kl.loadFor(name, name)
		b.fnMu.RLock()
		f = b.fns[name]
		b.fnMu.RUnlock()
	}
	return f
}

// launch runs a 1-D grid-stride kernel over n elements; nothing when n is 0.
func (b *Backend) launch(op string, f *Function, n int, args ...any) {
	if n <= 0 {
		return
	}
	devCheck(op, b.x.launch(f, gridFor(n), Dim3{X: blockSize, Y: 1, Z: 1}, args))
}

// streamUnroll is common.cu's EMBER_STREAM_U: the float4 groups a thread
// of ember_stream takes. streamMaxGrid caps launch4's grid (the kernels'
// grid-stride loops do the rest).
const (
	streamUnroll  = 2
	streamMaxGrid = 1 << 24
)

// launch4 runs a kernel built on ember_stream over n elements: when vec
// (every pointer 16-byte aligned, so that the kernel takes float4 groups)
// a grid of one pass, EMBER_STREAM_U groups a thread (4096 blocks looping
// over the groups left 7% of the copy rate unused), else gridFor's.
func (b *Backend) launch4(op string, f *Function, n int, vec bool, args ...any) {
	if n <= 0 {
		return
	}
	grid := gridFor(n)
	if vec {
		per := 4 * streamUnroll * blockSize
		grid.X = min(max((n+per-1)/per, 1), streamMaxGrid)
	}
	devCheck(op, b.x.launch(f, grid, Dim3{X: blockSize, Y: 1, Z: 1}, args))
}

// aligned16 reports whether every device address is 16-byte aligned.
func aligned16(ptrs ...uintptr) bool {
	for _, p := range ptrs {
		if p%16 != 0 {
			return false
		}
	}
	return true
}

// launchGrid runs a kernel with an explicit grid and block size.
func (b *Backend) launchGrid(op string, f *Function, grid, block int, args ...any) {
	devCheck(op, b.x.launch(f, Dim3{X: grid, Y: 1, Z: 1}, Dim3{X: block, Y: 1, Z: 1}, args))
}

func flag(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// i32arg converts a dimension for a kernel's int parameter.
func i32arg(op string, v int) int32 {
	if v < math.MinInt32 || v > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: %s: dimension %d does not fit a 32-bit int", op, v))
	}
	return int32(v)
}

// ---- copies ----

// Upload copies a host slice into dst. The copy is queued on the stream; the
// driver stages pageable (ordinary Go) memory before returning, so src may
// be reused as soon as Upload returns.
func (b *Backend) Upload(dst tensor.Buffer, src any) {
	var p unsafe.Pointer
	var n int
	var dt tensor.DType
	switch s := src.(type) {
	case []float32:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), tensor.Float32
	case []int32:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), tensor.Int32
	case []uint8:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), tensor.Uint8
	case []uint16:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), tensor.BFloat16
	default:
		panic(fmt.Sprintf("cuda: cannot upload %T", src))
	}
	d := b.ptr("upload", dst, dt)
	if n != dst.Len {
		panic(fmt.Sprintf("cuda: upload of %d elements into %d", n, dst.Len))
	}
	if n == 0 {
		return
	}
	if b.capturing.Load() {
		// A graph replays a copy from the host address it recorded, long
		// after this slice is gone: the step would read stale memory.
		panic(&tensor.Error{Op: "cuda: upload", Err: ErrUploadInCapture})
	}
	devCheck("upload", b.x.copyHtoD(d, p, n*dt.Size()))
	runtime.KeepAlive(src)
}

// ErrUploadInCapture is the error of a host-to-device copy queued while a
// graph is captured (Capture then fails, and callers run the step
// eagerly): upload a step's inputs into the tensors it reads before
// capturing it and between replays instead.
var ErrUploadInCapture = errors.New("cuda: a host-to-device copy inside a captured graph would replay from stale host memory; upload before the capture and between replays")

// Download waits for the work queued so far and copies src into a host
// slice. A device error of earlier work surfaces here, as a panic with a
// *tensor.Error.
func (b *Backend) Download(dst any, src tensor.Buffer) {
	var p unsafe.Pointer
	var n int
	var dt tensor.DType
	switch d := dst.(type) {
	case []float32:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), tensor.Float32
	case []int32:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), tensor.Int32
	case []uint8:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), tensor.Uint8
	case []uint16:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), tensor.BFloat16
	default:
		panic(fmt.Sprintf("cuda: cannot download into %T", dst))
	}
	s := b.ptr("download", src, dt)
	if n != src.Len {
		panic(fmt.Sprintf("cuda: download of %d elements into %d", src.Len, n))
	}
	if n == 0 {
		return
	}
	devCheck("download", b.x.copyDtoH(p, s, n*dt.Size()))
	runtime.KeepAlive(dst)
}

// Fill sets a float32 or int32 buffer to v (int32(v) for int32), with
// cuMemsetD32Async.
func (b *Backend) Fill(dst tensor.Buffer, v float32) {
	var bits uint32
	switch dst.DType {
	case tensor.Float32:
		bits = math.Float32bits(v)
	case tensor.Int32:
		bits = uint32(int32(v))
	default:
		panic(fmt.Sprintf("cuda: fill: want a float32 or int32 buffer, have %v", dst.DType))
	}
	p := b.ptr("fill", dst, dst.DType)
	if dst.Len == 0 {
		return
	}
	devCheck("fill", b.x.memset32(p, bits, dst.Len))
}

// Copy copies src to dst (same type and length), device to device.
func (b *Backend) Copy(dst, src tensor.Buffer) {
	if src.DType != dst.DType || src.Len != dst.Len {
		panic(fmt.Sprintf("cuda: copy of %d %v into %d %v", src.Len, src.DType, dst.Len, dst.DType))
	}
	d, s := b.ptr("copy", dst, dst.DType), b.ptr("copy", src, src.DType)
	if dst.Len == 0 || d == s {
		return
	}
	bytes := dst.Len * dst.DType.Size()
	if bytes >= copyKernelMin && bytes%16 == 0 && aligned16(d, s) {
		if f := b.loaded("ember_copy16"); f != nil {
			b.launch4("copy", f, bytes/4, true, d, s, int64(bytes/16))
			return
		}
	}
	devCheck("copy", b.x.copyDtoD(d, s, bytes))
}

// copyKernelMin is the size from which Copy runs ember_copy16 rather than
// cuMemcpyDtoDAsync: on the H200 the kernel copied 1 GiB in 509 us, the
// driver's copy in 535-604 us in the same processes (PyTorch's copy_ 509).
// Below it either is a launch.
const copyKernelMin = 1 << 16

// maxStridedRank is the most dimensions copy_strided takes (after merging).
const maxStridedRank = 6

// mergeDims drops dimensions of size 1 and merges each dimension with the
// next inner one when together they are contiguous (stride_outer ==
// stride_inner * size_inner), which leaves the addressed elements and their
// order unchanged. A view of any rank that is dense in places shrinks to few
// dimensions. It returns at least one dimension.
func mergeDims(shape, strides []int) (s, t []int) {
	for k := range shape {
		if shape[k] == 1 {
			continue
		}
		if n := len(s); n > 0 && t[n-1] == strides[k]*shape[k] {
			s[n-1] *= shape[k]
			t[n-1] = strides[k]
			continue
		}
		s = append(s, shape[k])
		t = append(t, strides[k])
	}
	if len(s) == 0 {
		s, t = []int{1}, []int{0}
	}
	return s, t
}

// CopyStrided gathers the view (shape, strides, starting at src.Off) into
// dense dst. Views of up to 6 dimensions after merging are supported.
func (b *Backend) CopyStrided(dst, src tensor.Buffer, shape, strides []int) {
	const op = "copy_strided"
	if len(shape) != len(strides) {
		panic(fmt.Sprintf("cuda: %s: shape %v and strides %v differ in rank", op, shape, strides))
	}
	if src.DType != dst.DType {
		panic(fmt.Sprintf("cuda: %s: %v source into %v destination", op, src.DType, dst.DType))
	}
	if dst.DType == tensor.BFloat16 { // the kernels move 4-byte or 1-byte elements
		panic(fmt.Sprintf("cuda: %s: strided bfloat16 views are not supported; cast a contiguous tensor", op))
	}
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("cuda: %s: negative dimension in shape %v", op, shape))
		}
		n *= d
	}
	if n != dst.Len {
		panic(fmt.Sprintf("cuda: %s: shape %v has %d elements, destination %d", op, shape, n, dst.Len))
	}
	pd, ps := b.ptr(op, dst, dst.DType), b.ptr(op, src, src.DType)
	if n == 0 {
		return
	}
	lo, hi := 0, 0
	for k, d := range shape {
		if e := (d - 1) * strides[k]; e < 0 {
			lo += e
		} else {
			hi += e
		}
	}
	if lo < 0 || hi >= src.Len {
		panic(fmt.Sprintf("cuda: %s: view shape %v strides %v reaches [%d, %d] outside the source's %d elements", op, shape, strides, lo, hi, src.Len))
	}
	s, t := mergeDims(shape, strides)
	if len(s) > maxStridedRank {
		panic(fmt.Sprintf("cuda: %s: views of rank %d are not supported (shape %v strides %v is %d-D after merging contiguous dimensions; the kernel takes at most %d)",
			op, len(shape), shape, strides, len(s), maxStridedRank))
	}
	var s6, t6 [maxStridedRank]int64
	pad := maxStridedRank - len(s)
	for k := range s6 {
		s6[k] = 1
		if k >= pad {
			s6[k], t6[k] = int64(s[k-pad]), int64(t[k-pad])
		}
	}
	f := b.kernel("ember_copy_strided_u32")
	if dst.DType == tensor.Uint8 {
		f = b.kernel("ember_copy_strided_u8")
	}
	b.launch(op, f, n, pd, ps, int64(n),
		s6[0], s6[1], s6[2], s6[3], s6[4], s6[5],
		t6[0], t6[1], t6[2], t6[3], t6[4], t6[5])
}

// ---- elementwise ----

// Add sets dst = a + b.
func (b *Backend) Add(dst, x, y tensor.Buffer) {
	const op = "add"
	n := dst.Len
	need(op, "a", x, n)
	need(op, "b", y, n)
	pd, px, py := b.f32(op, dst), b.f32(op, x), b.f32(op, y)
	b.launch4(op, b.kernel("ember_add"), n, aligned16(pd, px, py), pd, px, py, int64(n))
}

// Mul sets dst = a * b.
func (b *Backend) Mul(dst, x, y tensor.Buffer) {
	const op = "mul"
	n := dst.Len
	need(op, "a", x, n)
	need(op, "b", y, n)
	pd, px, py := b.f32(op, dst), b.f32(op, x), b.f32(op, y)
	b.launch4(op, b.kernel("ember_mul"), n, aligned16(pd, px, py), pd, px, py, int64(n))
}

// Axpy sets dst += alpha * x.
func (b *Backend) Axpy(dst tensor.Buffer, alpha float32, x tensor.Buffer) {
	const op = "axpy"
	n := dst.Len
	need(op, "x", x, n)
	pd, px := b.f32(op, dst), b.f32(op, x)
	b.launch4(op, b.kernel("ember_axpy"), n, aligned16(pd, px), pd, alpha, px, int64(n))
}

// ScaleBy sets dst = x * s[0] (+ dst).
func (b *Backend) ScaleBy(dst, x, s tensor.Buffer, accumulate bool) {
	const op = "scale_by"
	n := dst.Len
	need(op, "x", x, n)
	need(op, "s", s, 1)
	pd, px := b.f32(op, dst), b.f32(op, x)
	b.launch4(op, b.kernel("ember_scale_by"), n, aligned16(pd, px), pd, px, b.f32(op, s), int64(n), flag(accumulate))
}

// Sum sets dst[0] = sum(x), in double precision, deterministically: each
// block sums its share, and the last block to finish adds the blocks'
// partial sums in order (a single block writes dst directly).
func (b *Backend) Sum(dst, x tensor.Buffer) {
	const op = "sum"
	need(op, "dst", dst, 1)
	pd, px := b.f32(op, dst), b.f32(op, x)
	n := x.Len
	if n == 0 {
		devCheck(op, b.x.memset32(pd, 0, 1))
		return
	}
	b.sum(op, pd, px, n)
}

// sumBlocks is the number of blocks of a sum of n elements: a function of n
// alone, so that the result does not depend on the device, and at most
// 1024, one wave of 256-thread blocks on the GPUs this is tuned on (132 SMs
// of 8 such blocks), since every block's arrival at the join costs it an L2
// round trip (ember_last_arrival).
func sumBlocks(n int) int { return min(max((n+blockSize*16-1)/(blockSize*16), 1), 1024) }

// sum queues ember_sum of x's n elements into dst[0]: one launch, whose
// last block to finish adds the per-block partial sums.
func (b *Backend) sum(op string, pd, px uintptr, n int) {
	nb := sumBlocks(n)
	var part uintptr
	if nb > 1 {
		ws := b.workspace(op, nb*8)
		defer b.release(ws)
		part = ws.Ptr()
	}
	b.launchGrid(op, b.kernel("ember_sum"), nb, blockSize, pd, part, b.tileCounters.Ptr()+4*sumDone, px, int64(n), flag(b.streamed(4*n)))
}

// streamed says whether a reduction reads an input of that many bytes
// through ember_ld_once (the once flag of ember_ld_read, or the entry point
// without _l2): inputs of more than half the L2 cache, which a plain load
// would only push through it; smaller ones are left in L2 for their next
// reader.
func (b *Backend) streamed(bytes int) bool {
	if b.dev == nil || b.streamAll { // the tests' recording backend, or a test's choice
		return true
	}
	return 2*bytes > b.dev.L2CacheBytes()
}

// Broadcast sets dst[i] = s[0] (+ dst).
func (b *Backend) Broadcast(dst, s tensor.Buffer, accumulate bool) {
	const op = "broadcast"
	need(op, "s", s, 1)
	pd := b.f32(op, dst)
	b.launch4(op, b.kernel("ember_broadcast"), dst.Len, aligned16(pd), pd, b.f32(op, s), int64(dst.Len), flag(accumulate))
}

// ReLU sets y = max(x, 0).
func (b *Backend) ReLU(y, x tensor.Buffer) {
	const op = "relu"
	n := x.Len
	need(op, "y", y, n)
	py, px := b.f32(op, y), b.f32(op, x)
	b.launch4(op, b.kernel("ember_relu"), n, aligned16(py, px), py, px, int64(n))
}

// ReLUBackward sets dx = dy where y > 0, else 0 (+ dx).
func (b *Backend) ReLUBackward(dx, dy, y tensor.Buffer, accumulate bool) {
	const op = "relu_backward"
	n := dx.Len
	need(op, "dy", dy, n)
	need(op, "y", y, n)
	pdx, pdy, py := b.f32(op, dx), b.f32(op, dy), b.f32(op, y)
	b.launch4(op, b.kernel("ember_relu_backward"), n, aligned16(pdx, pdy, py), pdx, pdy, py, int64(n), flag(accumulate))
}

// ---- linear algebra ----

// MatMul sets c = alpha*op(a)*op(b) + beta*c with cuBLAS (row-major).
func (b *Backend) MatMul(c, x, y tensor.Buffer, m, n, k int, transA, transB bool, alpha, beta float32) {
	const op = "matmul"
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("cuda: %s: negative size m=%d n=%d k=%d", op, m, n, k))
	}
	need(op, "c", c, m*n)
	need(op, "a", x, m*k)
	need(op, "b", y, k*n)
	pc, pa, pb := b.f32(op, c), b.f32(op, x), b.f32(op, y)
	if k == 0 {
		// No products: c = beta*c, over the whole of c as on the CPU.
		b.launch(op, b.kernel("ember_scale"), c.Len, pc, beta, int64(c.Len))
		return
	}
	b.matmul(op, pc, pa, pb, 0, m, n, k, transA, transB, alpha, beta)
}

// matmul queues c = alpha·A·B + beta·c (+ bias[j] on every row when pbias is
// not 0) for k > 0: small products in one launch of our own, the rest with
// cuBLAS (and AddBias's kernel for the bias).
func (b *Backend) matmul(op string, pc, pa, pb, pbias uintptr, m, n, k int, transA, transB bool, alpha, beta float32) {
	if m == 0 || n == 0 {
		return
	}
	if smallProduct(m, n, k) {
		if k <= 128 && pbias == 0 { // 32 outputs per block of 32x8 threads
			grid := Dim3{X: min((m*n+31)/32, maxGrid), Y: 1, Z: 1}
			devCheck(op, b.x.launch(b.kernel("ember_gemm_small_t"), grid, Dim3{X: 32, Y: 8, Z: 1}, []any{pc, pa, pb, i32arg(op, m), i32arg(op, n), i32arg(op, k),
				flag(transA), flag(transB), alpha, beta}))
			return
		}
		blocks := min((m*n+blockSize/32-1)/(blockSize/32), maxGrid) // a warp per output
		b.launchGrid(op, b.kernel("ember_gemm_small"), blocks, blockSize, pc, pa, pb, i32arg(op, m), i32arg(op, n), i32arg(op, k),
			flag(transA), flag(transB), alpha, beta, pbias)
		return
	}
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	b.gemm(op, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, n)
	if pbias != 0 {
		b.launch(op, b.kernel("ember_add_bias"), m*n, pc, pbias, int64(m*n), int64(n), int64(1))
	}
}

// smallProduct says whether MatMul gives an m x n x k product to its own
// kernels instead of cuBLAS.
func smallProduct(m, n, k int) bool { return m*n <= smallGEMMOutputs && m*n*k <= smallGEMM }

// smallGEMM and smallGEMMOutputs bound the products that MatMul gives
// ember_gemm_small instead of cuBLAS: below them, cuBLAS's launches (a
// split-K kernel and its reduction) cost more than the arithmetic, and a
// warp per output keeps few lanes idle.
const (
	smallGEMM        = 1 << 20
	smallGEMMOutputs = 1 << 16
)

// AddBias adds bias[c] to y viewed as [outer, channels, inner].
func (b *Backend) AddBias(y, bias tensor.Buffer, outer, channels, inner int) {
	const op = "add_bias"
	total := outer * channels * inner
	need(op, "y", y, total)
	need(op, "bias", bias, channels)
	b.launch(op, b.kernel("ember_add_bias"), total, b.f32(op, y), b.f32(op, bias), int64(total), int64(channels), int64(inner))
}

// BiasGrad sets db[c] = sum of dy over outer and inner (+ db).
func (b *Backend) BiasGrad(db, dy tensor.Buffer, outer, channels, inner int, accumulate bool) {
	const op = "bias_grad"
	need(op, "dy", dy, outer*channels*inner)
	need(op, "db", db, channels)
	b.biasGrad(op, b.f32(op, db), b.f32(op, dy), 0, 0, outer, channels, inner, accumulate)
}

// biasGrad launches the per-channel reduction db[c] (+)= sum of dy [outer,
// channels, inner] over outer and inner (kernels/reduce.cu), and, when pdyt
// is not 0, writes the transpose dyt [channels, outer, inner] on the way
// (Conv2dBackward). inner == 1 without dyt: ember_bias_grad_cols, 32
// channels per block; else ember_bias_grad_rows, a block per (channel, about
// 1024 elements). When a channel spans several blocks they write partial
// sums to a workspace and ember_bias_grad_finish adds them in order. LeNet:
// fc1 and fc2 (64 rows) one launch each; conv1 (64 parts of 576) and conv2
// (4 parts of 1024) two each, the first also being the transpose of dy.
// Without dyt or a mask and with rows of at least chanInnerMin, the sums
// are ember_reduce_channels' (one pass over dy split by elements, sums in
// double). The partition depends on the shape alone, so results are
// reproducible. pmask, when not 0, masks dy by the sign of a fused ReLU's output (rows
// form only).
func (b *Backend) biasGrad(op string, pdb, pdy, pdyt, pmask uintptr, outer, channels, inner int, accumulate bool) {
	if channels <= 0 {
		return
	}
	if outer <= 0 || inner <= 0 {
		// Sums of nothing: db = 0 (+ db).
		if !accumulate {
			devCheck(op, b.x.memset32(pdb, 0, channels))
		}
		return
	}
	if inner == 1 && pdyt == 0 && pmask == 0 {
		b.biasGradCols(op, pdb, 0, pdy, 0, outer, channels, accumulate)
		return
	}
	if pdyt == 0 && pmask == 0 && outer > 1 && inner >= chanInnerMin {
		// Only the sums: the per-channel reduction, which splits a
		// channel by elements rather than rows (kernels/reduce_axis.cu).
		b.reduceChannels(op, tensor.ReduceSum, pdb, pdy, outer, channels, inner, accumulate)
		return
	}
	ws := b.biasRowsWorkspace(op, outer, channels, inner)
	defer b.release(ws)
	b.biasGradRowsOn(b.x, op, pdb, ws.Ptr(), pdyt, pdy, pmask, outer, channels, inner, accumulate)
}

// biasRowsWorkspace is the partial sums biasGradRowsOn needs for dy [outer,
// channels, inner] (a zero Block when one block per channel does).
func (b *Backend) biasRowsWorkspace(op string, outer, channels, inner int) Block {
	rpb := biasRowsPerBlock(inner)
	if parts := (outer + rpb - 1) / rpb; parts > 1 {
		return b.workspace(op, 4*parts*channels)
	}
	return Block{}
}

// biasGradRowsOn queues biasGrad's rows form on ex (outer, channels and
// inner positive): ember_bias_grad_rows, and ember_bias_grad_finish over
// the partial sums in part (from biasRowsWorkspace) when there are several
// blocks per channel.
func (b *Backend) biasGradRowsOn(ex executor, op string, pdb, part, pdyt, pdy, pmask uintptr, outer, channels, inner int, accumulate bool) {
	rpb := biasRowsPerBlock(inner)
	parts := (outer + rpb - 1) / rpb
	grid := Dim3{X: parts, Y: min(channels, maxGridY), Z: 1}
	devCheck(op, ex.launch(b.kernel("ember_bias_grad_rows"), grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{pdb, part, pdyt, pdy, pmask,
		int64(outer), int64(channels), int64(inner), i32arg(op, rpb), flag(accumulate)}))
	if parts > 1 {
		b.biasGradFinish(ex, op, pdb, part, channels, parts, accumulate)
	}
}

// biasGradCols queues db (+)= the column sums of dy [outer, channels] with
// ember_bias_grad_cols (and its finishing launch beyond 128 rows). With py
// not 0 the sums are of dy masked where py is not positive (a ReLU's
// backward), and pg, when not 0, receives the masked dy. pdb may be 0 (no
// sums wanted): then one pass over all rows writes pg.
func (b *Backend) biasGradCols(op string, pdb, pg, pdy, py uintptr, outer, channels int, accumulate bool) {
	rpb := biasColsRowsPerBlock(outer)
	parts := (outer + rpb - 1) / rpb
	if pdb == 0 {
		parts, rpb = 1, outer
	}
	var part uintptr
	if parts > 1 {
		ws := b.workspace(op, 4*parts*channels)
		defer b.release(ws)
		part = ws.Ptr()
	}
	b.biasGradColsOn(b.x, op, pdb, part, pg, pdy, py, outer, channels, rpb, parts, accumulate)
	if parts > 1 {
		// Nothing below needs db before the optimiser does: in a graph the
		// finish runs on the side stream, off the critical path.
		devCheck(op, b.x.detach([]span{{part, 4 * parts * channels, false}, {pdb, 4 * channels, true}}, func(ex executor) {
			b.biasGradFinish(ex, op, pdb, part, channels, parts, accumulate)
		}))
	}
}

// biasGradColsOn queues ember_bias_grad_cols on ex: parts blocks of rpb
// rows a column, into part when parts > 1 (biasGradCols).
func (b *Backend) biasGradColsOn(ex executor, op string, pdb, part, pg, pdy, py uintptr, outer, channels, rpb, parts int, accumulate bool) {
	grid := Dim3{X: (channels + 31) / 32, Y: i32dim(op, parts), Z: 1}
	devCheck(op, ex.launch(b.kernel("ember_bias_grad_cols"), grid, Dim3{X: 32, Y: 8, Z: 1}, []any{pdb, part, pg, pdy, py,
		int64(outer), int64(channels), i32arg(op, rpb), flag(accumulate)}))
}

// biasGradFinish queues on ex db (+)= the sums of the parts partial sums of
// each channel.
func (b *Backend) biasGradFinish(ex executor, op string, pdb, part uintptr, channels, parts int, accumulate bool) {
	const warps = blockSize / 32
	devCheck(op, ex.launch(b.kernel("ember_bias_grad_finish"), Dim3{X: min((channels+warps-1)/warps, maxGrid), Y: 1, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1},
		[]any{pdb, part, int64(channels), i32arg(op, parts), flag(accumulate)}))
}

// AddBiasReLU implements tensor.BiasReLUBackend.
func (b *Backend) AddBiasReLU(y, bias tensor.Buffer, outer, channels int) {
	const op = "add_bias_relu"
	total := outer * channels
	need(op, "y", y, total)
	need(op, "bias", bias, channels)
	if total == 0 {
		return
	}
	b.launch(op, b.kernel("ember_add_bias_relu"), total, b.f32(op, y), b.f32(op, bias), int64(total), int64(channels))
}

// BiasReLUBackward implements tensor.BiasReLUBackend: one pass of
// ember_bias_grad_cols writes the masked gradient and sums it (plus a
// finishing launch beyond 128 rows).
func (b *Backend) BiasReLUBackward(g, db, dy, y tensor.Buffer, outer, channels int, accumulate bool) {
	const op = "bias_relu_backward"
	total := outer * channels
	need(op, "g", g, total)
	need(op, "dy", dy, total)
	need(op, "y", y, total)
	pg, pdy, py := b.f32(op, g), b.f32(op, dy), b.f32(op, y)
	var pdb uintptr
	if !db.Empty() {
		need(op, "db", db, channels)
		pdb = b.f32(op, db)
	}
	if channels <= 0 {
		return
	}
	if outer <= 0 {
		if pdb != 0 && !accumulate {
			devCheck(op, b.x.memset32(pdb, 0, channels))
		}
		return
	}
	b.biasGradCols(op, pdb, pg, pdy, py, outer, channels, accumulate)
}

// maxGridY is the largest gridDim.y (and z) CUDA allows.
const maxGridY = 65535

// biasColsRowsPerBlock is the row chunk of ember_bias_grad_cols: all rows
// in one block up to 128 (one launch: batch 64), else chunks of 128 rows (16
// per thread), or more when that would need more than maxGridY chunks: one
// chunk of many rows leaves too few blocks (docs/performance.md, tuning
// notes).
func biasColsRowsPerBlock(outer int) int {
	if outer <= 128 {
		return outer
	}
	return max(128, (outer+maxGridY-1)/maxGridY)
}

// biasRowsPerBlock is the number of outer rows one block of
// ember_bias_grad_rows takes: about 1024 elements (4 per thread).
func biasRowsPerBlock(inner int) int { return max(1, 1024/inner) }

// ---- loss, argmax, optimiser, data ----

// ceRowsPerBlock is the number of rows one block of cross_entropy (32 warps)
// takes before a second block is used; the block count depends on n alone.
// Batch 64 stays one block (no finishing launch); larger row counts per
// block left too few blocks at batch 1024 (docs/performance.md).
const ceRowsPerBlock = 64

// CrossEntropy writes the mean loss over n rows to loss[0] and, when
// dlogits is not empty, (softmax - onehot)/n to dlogits.
func (b *Backend) CrossEntropy(loss, dlogits, logits, labels tensor.Buffer, n, classes int) {
	const op = "cross_entropy"
	need(op, "loss", loss, 1)
	need(op, "logits", logits, n*classes)
	need(op, "labels", labels, n)
	pl, pz, py := b.f32(op, loss), b.f32(op, logits), b.i32(op, labels)
	var pdz uintptr
	if !dlogits.Empty() {
		need(op, "dlogits", dlogits, n*classes)
		pdz = b.f32(op, dlogits)
	}
	if n <= 0 {
		// The mean of no rows: 0/0, as on the CPU.
		devCheck(op, b.x.memset32(pl, math.Float32bits(float32(math.NaN())), 1))
		return
	}
	if classes <= 0 {
		panic(fmt.Sprintf("cuda: %s: %d classes", op, classes))
	}
	nb := min((n+ceRowsPerBlock-1)/ceRowsPerBlock, 1024)
	var part uintptr
	if nb > 1 {
		ws := b.workspace(op, nb*8)
		defer b.release(ws)
		part = ws.Ptr()
	}
	b.launchGrid(op, b.kernel("ember_cross_entropy"), nb, 1024, pl, pdz, pz, py, i32arg(op, n), i32arg(op, classes), part)
	if nb > 1 {
		b.launchGrid(op, b.kernel("ember_sum_final"), 1, blockSize, pl, part, int32(nb), int64(n))
	}
}

// Argmax sets dst[r] to the column of the first maximum of row r.
func (b *Backend) Argmax(dst, x tensor.Buffer, rows, cols int) {
	const op = "argmax"
	need(op, "dst", dst, rows)
	need(op, "x", x, rows*cols)
	pd, px := b.i32(op, dst), b.f32(op, x)
	if rows <= 0 {
		return
	}
	if cols <= 0 {
		devCheck(op, b.x.memset32(pd, 0, rows))
		return
	}
	const warps = blockSize / 32
	b.launchGrid(op, b.kernel("ember_argmax"), min((rows+warps-1)/warps, maxGrid), blockSize, pd, px, i32arg(op, rows), i32arg(op, cols))
}

// SGD applies one torch.optim.SGD update; v is used only with momentum.
func (b *Backend) SGD(p, g, v tensor.Buffer, h tensor.SGDStep) {
	const op = "sgd"
	n := p.Len
	need(op, "g", g, n)
	var pv uintptr
	if h.Momentum != 0 {
		need(op, "v", v, n)
		pv = b.f32(op, v)
	}
	pp, pg := b.f32(op, p), b.f32(op, g)
	f, count := b.kernel("ember_sgd"), n
	if n >= 4 && (pp|pg|pv)%16 == 0 { // four at a time, and the last n % 4 one each
		f, count = b.kernel("ember_sgd4"), n/4
	}
	b.launch(op, f, count, pp, pg, pv, int64(n),
		h.LR, h.Momentum, h.Dampening, h.WeightDecay, flag(h.Nesterov), flag(h.FirstStep), flag(h.ZeroGrad))
}

// GatherNormalize sets row i of dst to src row idx[i] (uint8) * scale +
// shift. An index outside the source gives a row of NaN.
func (b *Backend) GatherNormalize(dst, src, idx tensor.Buffer, rowLen int, scale, shift float32) {
	const op = "gather_normalize"
	rows := idx.Len
	if rowLen < 0 {
		panic(fmt.Sprintf("cuda: %s: row length %d", op, rowLen))
	}
	need(op, "dst", dst, rows*rowLen)
	pd, ps, pi := b.f32(op, dst), b.ptr(op, src, tensor.Uint8), b.i32(op, idx)
	if rowLen == 0 {
		return
	}
	b.launch(op, b.kernel("ember_gather_normalize"), rows*rowLen, pd, ps, pi, int64(rows), int64(rowLen), int64(src.Len/rowLen), scale, shift)
}

// defaultBLASWorkspaceMiB is the cuBLAS workspace the backend provides from
// its allocator. cuBLAS otherwise allocates its own (the same size), out of
// sight of the allocator's statistics; split-K GEMMs slow down badly with
// less (docs/performance.md).
const defaultBLASWorkspaceMiB = 32

// setBLASWorkspace gives cuBLAS its workspace from the caching allocator, so
// that every device buffer is counted in one place (the options may ask for
// another size, none, or cuBLAS's own).
func (b *Backend) setBLASWorkspace() error {
	if b.opt.BLASOwnWorkspace || !b.blas.CanSetWorkspace() {
		return nil
	}
	mib := defaultBLASWorkspaceMiB
	if b.opt.BLASWorkspaceMiB != 0 {
		mib = max(b.opt.BLASWorkspaceMiB, 0)
	}
	// Under a tight memory limit take less rather than fail: a smaller
	// workspace only makes some GEMMs slower.
	for ; mib > 0; mib /= 4 {
		blk, err := b.alloc.Alloc(mib<<20, b.stream)
		var oom *OutOfMemoryError
		if errors.As(err, &oom) {
			continue
		}
		if err != nil {
			return err
		}
		b.blasWorkspace = blk
		return b.blas.SetWorkspace(blk.Ptr(), mib<<20)
	}
	return b.blas.SetWorkspace(0, 0)
}

// BLASWorkspace is the size of the cuBLAS workspace taken from the
// allocator (0 when cuBLAS keeps its own).
func (b *Backend) BLASWorkspace() int {
	if b.blasWorkspace.IsZero() {
		return 0
	}
	return b.blasWorkspace.Size()
}
