package driver

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ---------------------------------------------------------------------------
// CPU tests: errors, library loading, Available.

func TestErrorFormatting(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Message: "out of memory"}
	if got, want := e.Error(), "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY: out of memory"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e2 := &Error{Call: "cuX", Code: 12345}
	if got := e2.Error(); got != "cuda: cuX: error 12345" {
		t.Errorf("Error() without name = %q", got)
	}
	e3 := &Error{Call: "nvrtcGetPTX", Code: 3, Name: "NVRTC_ERROR_INVALID_INPUT", Message: "NVRTC_ERROR_INVALID_INPUT"}
	if got := e3.Error(); got != "cuda: nvrtcGetPTX: NVRTC_ERROR_INVALID_INPUT" {
		t.Errorf("message equal to name must not repeat: %q", got)
	}
}

func TestErrorIsOutOfMemory(t *testing.T) {
	oom := newDriverError("cuMemAlloc_v2", 2)
	if oom.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Fatalf("name of CUresult 2 = %q", oom.Name)
	}
	if !errors.Is(oom, ErrDeviceOutOfMemory) {
		t.Error("CUDA_ERROR_OUT_OF_MEMORY does not satisfy errors.Is(err, ErrDeviceOutOfMemory)")
	}
	wrapped := fmt.Errorf("allocating tensor: %w", oom)
	if !errors.Is(wrapped, ErrDeviceOutOfMemory) {
		t.Error("wrapped OOM lost errors.Is")
	}
	for _, e := range []*Error{
		newDriverError("cuMemAlloc_v2", 1),
		newNVRTCError("nvrtcCreateProgram", 2, ""), // NVRTC_ERROR_PROGRAM_CREATION_FAILURE, also code 2
		newCublasError("cublasSgemm_v2", 3),
	} {
		if errors.Is(e, ErrDeviceOutOfMemory) {
			t.Errorf("%v must not match ErrDeviceOutOfMemory", e)
		}
	}
	var ce *Error
	if !errors.As(wrapped, &ce) || ce.Call != "cuMemAlloc_v2" {
		t.Error("errors.As to *Error failed")
	}
	if !errors.Is(oom, &Error{Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}) {
		t.Error("errors.Is against an *Error with the same code and name")
	}
}

func TestDriverErrorNames(t *testing.T) {
	// Without a driver the built-in table names the codes; with one, the
	// driver's cuGetErrorName must agree for these long-stable codes.
	for code, want := range map[uint32]string{
		1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 100: "CUDA_ERROR_NO_DEVICE",
		201: "CUDA_ERROR_INVALID_CONTEXT", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
		700: "CUDA_ERROR_ILLEGAL_ADDRESS", 719: "CUDA_ERROR_LAUNCH_FAILED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	} {
		e := newDriverError("cuTest", code)
		if e.Name != want || e.Code != int(code) {
			t.Errorf("code %d: got %q/%d, want %q", code, e.Name, e.Code, want)
		}
		if !strings.Contains(e.Error(), "cuTest") || !strings.Contains(e.Error(), want) {
			t.Errorf("Error() %q must name the call and the error", e.Error())
		}
	}
	if e := newDriverError("cuTest", 4242); e.Name == "" {
		t.Error("unknown code must still get a name")
	}
}

func TestCublasStatusNames(t *testing.T) {
	want := map[int]string{
		0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
		7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
		13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
		16: "CUBLAS_STATUS_LICENSE_ERROR",
	}
	for code, name := range want {
		if got := CublasStatusName(code); got != name {
			t.Errorf("CublasStatusName(%d) = %q, want %q", code, got, name)
		}
	}
	if got := CublasStatusName(99); got != "CUBLAS_STATUS_99" {
		t.Errorf("unknown status = %q", got)
	}
	e := newCublasError("cublasSgemm_v2", 7)
	if got := e.Error(); !strings.HasPrefix(got, "cuda: cublasSgemm_v2: CUBLAS_STATUS_INVALID_VALUE: ") {
		t.Errorf("cuBLAS error = %q", got)
	}
	if cublasCheck("x", 0) != nil {
		t.Error("status 0 must be nil")
	}
	// Only the low 32 bits of the returned register are the enum.
	if cublasCheck("x", uintptr(0xdead_0000_0000)) != nil {
		t.Error("upper register bits must be ignored")
	}
}

func TestNVRTCErrorNames(t *testing.T) {
	e := newNVRTCError("nvrtcCompileProgram", 6, "kernel.cuCheck(3): error: identifier \"foo\" is undefined")
	if e.Name != "NVRTC_ERROR_COMPILATION" {
		t.Errorf("name = %q", e.Name)
	}
	if !strings.Contains(e.Error(), "nvrtcCompileProgram") || !strings.Contains(e.Error(), "identifier \"foo\"") {
		t.Errorf("Error() = %q must name the call and carry the log", e.Error())
	}
	if e := newNVRTCError("x", 77, ""); e.Name != "NVRTC_ERROR_77" {
		t.Errorf("unknown nvrtc code name = %q", e.Name)
	}
}

func TestVersionedNames(t *testing.T) {
	got := versionedNames("libx.so", []int{13, 12, 11}, 12)
	if want := []string{"libx.so.12", "libx.so.11", "libx.so.13"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("driver 12: %v, want %v", got, want)
	}
	got = versionedNames("libx.so", []int{13, 12, 11}, 0)
	if want := []string{"libx.so.13", "libx.so.12", "libx.so.11"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("unknown driver: %v, want %v", got, want)
	}
	n := nvrtcNames(13)
	if n[0] != "libnvrtc.so.13" || n[1] != "libnvrtc.so.12" || !containsString(n, "libnvrtc.so.11.2") {
		t.Errorf("nvrtcNames(13) = %v", n)
	}
	if c := cublasNames(12); c[0] != "libcublas.so.12" || c[1] != "libcublas.so.11" {
		t.Errorf("cublasNames(12) = %v", c)
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestLibraryNotFoundMessages(t *testing.T) {
	l := &Library{What: "NVRTC", Names: []string{"libember-nonexistent.so.13", "libember-nonexistent.so.12"},
		Display: "libnvrtc.so.13, .12, .11", Install: "the CUDA runtime compiler, e.g. cuda-nvrtc",
		Dirs: func() []string { return []string{t.TempDir()} }}
	_, err := l.Open()
	if err == nil {
		t.Fatal("opened a nonexistent library")
	}
	want := "NVRTC not found: tried libnvrtc.so.13, .12, .11 (install the CUDA runtime compiler, e.g. cuda-nvrtc)"
	if err.Error() != want {
		t.Errorf("got  %q\nwant %q", err.Error(), want)
	}
	var le *LibraryError
	if !errors.As(err, &le) || len(le.Tried) != 4 || le.Detail != "" {
		t.Errorf("LibraryError = %+v", le)
	}
	// The outcome is remembered.
	if _, err2 := l.Open(); err2 != err {
		t.Error("second open did not return the remembered error")
	}

	d := &Library{What: "CUDA driver", Names: []string{"libember-nonexistent-cuda.so.1"}, Display: "libcuda.so.1", Install: "the NVIDIA driver"}
	_, err = d.Open()
	if want := "no CUDA driver: libcuda.so.1 not found (install the NVIDIA driver)"; err == nil || err.Error() != want {
		t.Errorf("driver message = %v, want %q", err, want)
	}
}

func TestLibraryPresentButBroken(t *testing.T) {
	// A file that exists but is not a shared library must not be reported
	// as plainly "not found": the loader's message is kept.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "libember-broken.so.1"), []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := &Library{What: "cuBLAS", Names: []string{"libember-broken.so.1"}, Display: "libember-broken.so.1", Install: "nothing",
		Dirs: func() []string { return []string{dir} }}
	_, err := l.Open()
	var le *LibraryError
	if !errors.As(err, &le) {
		t.Fatalf("err = %v", err)
	}
	if le.Detail == "" || !strings.Contains(err.Error(), "loader said") {
		t.Errorf("broken library: detail lost: %q", err.Error())
	}
}

func TestAvailableWithoutGPU(t *testing.T) {
	err := Available()
	if err == nil {
		t.Skip("a CUDA device is available; this test checks the no-GPU path")
	}
	t.Logf("Available() = %v", err)
	msg := err.Error()
	var le *LibraryError
	var ce *Error
	switch {
	case errors.As(err, &le):
		if le.Library == "CUDA driver" && !strings.HasPrefix(msg, "no CUDA driver: libcuda.so.1 not found (install the NVIDIA driver)") &&
			le.Missing == "" {
			t.Errorf("driver-missing message = %q", msg)
		}
	case errors.Is(err, ErrNoDevice):
		if !strings.Contains(msg, "no CUDA device") {
			t.Errorf("no-device message = %q", msg)
		}
	case errors.As(err, &ce):
		if !strings.Contains(msg, "cuInit") || ce.Name == "" {
			t.Errorf("cuInit failure must name the call and the error: %q", msg)
		}
	default:
		t.Errorf("Available() returned an unexpected kind of error: %T %v", err, err)
	}
	// Consistent with Open and DeviceCount.
	if _, oerr := Open(0); oerr == nil {
		t.Error("Open succeeded although Available failed")
	}
	if n, cerr := DeviceCount(); cerr == nil && n != 0 {
		t.Errorf("DeviceCount = %d although Available failed", n)
	}
}

func TestNoDeviceMessageNamesVisibleDevices(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	err := noDeviceError(&Error{Call: "cuInit", Code: 100, Name: "CUDA_ERROR_NO_DEVICE"})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), `CUDA_VISIBLE_DEVICES=""`) {
		t.Errorf("got %v", err)
	}
	os.Unsetenv("CUDA_VISIBLE_DEVICES")
	err = noDeviceError(nil)
	if !errors.Is(err, ErrNoDevice) || strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES") {
		t.Errorf("got %v", err)
	}
}

// TestCallThroughPurego checks the calling path (purego, CGO_ENABLED=0,
// out-parameters kept alive by go:uintptrescapes, 32-bit result
// truncation) against libc.
func TestCallThroughPurego(t *testing.T) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skipf("no glibc: %v", err)
	}
	strlen, err := purego.Dlsym(h, "strlen")
	if err != nil {
		t.Skip(err)
	}
	s := cString("hello, gpu")
	if n := CCall(strlen, uintptr(unsafe.Pointer(&s[0]))); n != 10 {
		t.Errorf("strlen = %d", n)
	}
	if got := GoString(uintptr(unsafe.Pointer(&s[0]))); got != "hello, gpu" {
		t.Errorf("goString = %q", got)
	}
	runtime.KeepAlive(s)
	if GoString(0) != "" {
		t.Error("GoString(0)")
	}
	// memcpy into a Go out-parameter, like every cuXxx(&out, ...) call.
	memcpy, err := purego.Dlsym(h, "memcpy")
	if err != nil {
		t.Skip(err)
	}
	var out uint64
	in := uint64(0x1122334455667788)
	CCall(memcpy, uintptr(unsafe.Pointer(&out)), uintptr(unsafe.Pointer(&in)), 8)
	if out != in {
		t.Errorf("out-parameter = %#x", out)
	}
}

// ---------------------------------------------------------------------------
// GPU tests (skip without a GPU; fail under EMBER_REQUIRE_GPU=1).

func TestGPUDeviceInfo(t *testing.T) {
	d := requireGPU(t)
	n, err := DeviceCount()
	gpuCheck(t, err)
	if n < 1 {
		t.Fatalf("DeviceCount = %d", n)
	}
	major, minor := d.ComputeCapability()
	t.Logf("%v: sm_%d%d, %d SMs, %d devices, driver %v", d, major, minor, d.MultiprocessorCount(), n, driverVersion)
	if d.Name() == "" || major < 3 || minor < 0 || d.MultiprocessorCount() < 1 {
		t.Errorf("implausible device info: %q sm_%d%d SMs=%d", d.Name(), major, minor, d.MultiprocessorCount())
	}
	free, total, err := d.MemGetInfo()
	gpuCheck(t, err)
	if total <= 0 || free <= 0 || free > total {
		t.Errorf("MemGetInfo = %d free of %d", free, total)
	}
	if d.TotalMemory() < total/2 || d.TotalMemory() > 2*total {
		t.Errorf("TotalMemory %d vs MemGetInfo total %d", d.TotalMemory(), total)
	}
	if _, err := Open(n); err == nil {
		t.Error("Open(out of range) succeeded")
	}
	if err := Available(); err != nil {
		t.Errorf("Available = %v on a GPU machine", err)
	}
}

func TestGPUOpenClose(t *testing.T) {
	requireGPU(t)
	d, err := Open(0)
	gpuCheck(t, err)
	p, err := d.MemAlloc(1 << 20)
	gpuCheck(t, err)
	gpuCheck(t, d.MemFree(p))
	gpuCheck(t, d.Close())
	gpuCheck(t, d.Close()) // idempotent
	if _, err := d.MemAlloc(256); !errors.Is(err, ErrClosed) {
		t.Errorf("MemAlloc after Close: %v", err)
	}
	// The shared test device (another retain of the same primary context)
	// must be unaffected.
	sd := requireGPU(t)
	p, err = sd.MemAlloc(256)
	gpuCheck(t, err)
	gpuCheck(t, sd.MemFree(p))
}

func TestGPUAllocCopyRoundTrip(t *testing.T) {
	d := requireGPU(t)
	const n = 1<<20 + 3 // not a multiple of anything nice
	host := make([]float32, n)
	for i := range host {
		host[i] = float32(i)*0.5 - 7
	}
	a, err := d.MemAlloc(4 * n)
	gpuCheck(t, err)
	defer d.MemFree(a)
	b, err := d.MemAlloc(4 * n)
	gpuCheck(t, err)
	defer d.MemFree(b)

	// Synchronous path (stream 0).
	gpuCheck(t, d.CopyHtoD(a, unsafe.Pointer(&host[0]), 4*n, 0))
	gpuCheck(t, d.CopyDtoD(b, a, 4*n, 0))
	back := make([]float32, n)
	gpuCheck(t, d.CopyDtoH(unsafe.Pointer(&back[0]), b, 4*n, 0))
	for i := range back {
		if back[i] != host[i] {
			t.Fatalf("sync round trip: back[%d] = %v, want %v", i, back[i], host[i])
		}
	}

	// Stream-ordered path.
	s, err := d.NewStream()
	gpuCheck(t, err)
	defer d.DestroyStream(s)
	gpuCheck(t, d.Memset32(a, math.Float32bits(3.25), n, s))
	gpuCheck(t, d.CopyDtoD(b, a, 4*n, s))
	gpuCheck(t, d.CopyHtoD(a, unsafe.Pointer(&host[0]), 4*(n/2), s)) // overwrite first half
	gpuCheck(t, d.Synchronize(s))
	runtime.KeepAlive(host)
	gpuCheck(t, d.CopyDtoH(unsafe.Pointer(&back[0]), a, 4*n, s))
	for i := range back {
		want := float32(3.25)
		if i < n/2 {
			want = host[i]
		}
		if back[i] != want {
			t.Fatalf("stream round trip: a[%d] = %v, want %v", i, back[i], want)
		}
	}
	gpuCheck(t, d.CopyDtoH(unsafe.Pointer(&back[0]), b, 4*n, s))
	if back[0] != 3.25 || back[n-1] != 3.25 {
		t.Fatalf("memset+DtoD: %v %v", back[0], back[n-1])
	}
	// Zero-byte copies are no-ops; negative sizes are errors.
	gpuCheck(t, d.CopyDtoD(b, a, 0, s))
	if err := d.CopyDtoD(b, a, -1, s); err == nil {
		t.Error("negative copy size accepted")
	}
}

func TestGPUOutOfMemory(t *testing.T) {
	d := requireGPU(t)
	_, err := d.MemAlloc(1 << 50) // 1 PiB
	if err == nil {
		t.Fatal("1 PiB allocation succeeded")
	}
	if !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Errorf("error %v does not satisfy errors.Is(err, ErrDeviceOutOfMemory)", err)
	}
	t.Log(err)
}

func TestGPUEvents(t *testing.T) {
	d := requireGPU(t)
	s, err := d.NewStream()
	gpuCheck(t, err)
	defer d.DestroyStream(s)
	e, err := d.EventRecord(s)
	gpuCheck(t, err)
	gpuCheck(t, d.EventSynchronize(e))
	done, err := d.EventQuery(e)
	gpuCheck(t, err)
	if !done {
		t.Error("EventQuery false after EventSynchronize")
	}
	gpuCheck(t, d.EventDestroy(e))

	// Timing events around a copy.
	start, err := d.NewEvent(true)
	gpuCheck(t, err)
	end, err := d.NewEvent(true)
	gpuCheck(t, err)
	p, err := d.MemAlloc(64 << 20)
	gpuCheck(t, err)
	defer d.MemFree(p)
	gpuCheck(t, d.RecordEvent(start, s))
	gpuCheck(t, d.Memset32(p, 0, 16<<20, s))
	gpuCheck(t, d.RecordEvent(end, s))
	el, err := d.EventElapsed(start, end)
	gpuCheck(t, err)
	if el < 0 || el > 10*time.Second {
		t.Errorf("elapsed %v", el)
	}
	t.Logf("memset of 64 MiB: %v", el)
	gpuCheck(t, d.EventDestroy(start))
	gpuCheck(t, d.EventDestroy(end))
}

// The kernels the graph and concurrency tests use.
const testKernels = `
extern "C" __global__ void add_one(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
extern "C" __global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
`

func TestGPUGraphCaptureReplay(t *testing.T) {
	d := requireGPU(t)
	m := gpuCompile(t, d, testKernels)
	addOne := gpuFunction(t, m, "add_one")
	scale := gpuFunction(t, m, "scale")
	const n = 10007
	x, err := d.AllocFloat32(n)
	gpuCheck(t, err)
	defer x.Free()
	s, err := d.NewStream()
	gpuCheck(t, err)
	defer d.DestroyStream(s)
	gpuCheck(t, d.Memset32(x.Ptr(), 0, n, s))
	gpuCheck(t, d.Synchronize(s))

	if err := d.BeginCapture(0); err == nil {
		t.Error("capture of the legacy stream accepted")
	}
	gpuCheck(t, d.BeginCapture(s))
	grid, block := Grid1D(n, 128), Dim3{X: 128}
	gpuCheck(t, addOne.Launch(grid, block, 0, s, x.Ptr(), int32(n)))
	gpuCheck(t, scale.Launch(grid, block, 0, s, x.Ptr(), float32(2), int32(n)))
	g, err := d.EndCapture(s)
	gpuCheck(t, err)
	defer g.Destroy()
	ge, err := g.Instantiate()
	gpuCheck(t, err)
	defer ge.Destroy()

	host := make([]float32, n)
	gpuCheck(t, x.CopyToHost(host))
	if host[0] != 0 || host[n-1] != 0 {
		t.Fatalf("captured work ran during capture: %v", host[0])
	}
	want := float32(0)
	for r := 0; r < 3; r++ {
		gpuCheck(t, ge.Launch(s))
		want = (want + 1) * 2
	}
	gpuCheck(t, d.Synchronize(s))
	gpuCheck(t, x.CopyToHost(host))
	for i, v := range host {
		if v != want {
			t.Fatalf("after 3 replays x[%d] = %v, want %v", i, v, want)
		}
	}
	gpuCheck(t, g.Destroy())
	gpuCheck(t, g.Destroy())
}

// TestGPUThreadWithoutContext fails deterministically if a Device method
// does not make its context current: it runs on an OS thread where no
// context is current.
func TestGPUThreadWithoutContext(t *testing.T) {
	d := requireGPU(t)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // this goroutine's thread exits with it
		if r := CCall(cuDrv.cuCtxSetCurrent, 0); uint32(r) != 0 {
			errc <- newDriverError("cuCtxSetCurrent", uint32(r))
			return
		}
		p, err := d.MemAlloc(4096)
		if err != nil {
			errc <- fmt.Errorf("MemAlloc on a thread without a current context: %w", err)
			return
		}
		var cur uintptr
		CCall(cuDrv.cuCtxGetCurrent, uintptr(unsafe.Pointer(&cur)))
		if cur != d.ctx {
			errc <- fmt.Errorf("context current after the call = %#x, want %#x", cur, d.ctx)
			return
		}
		errc <- d.MemFree(p)
	}()
	gpuCheck(t, <-errc)
}

// TestGPUConcurrentLaunches launches kernels, allocates, copies and
// records events from 8 goroutines at once, while other goroutines keep
// clearing the current context of whatever threads they run on, and every
// driver call yields the processor between cuCtxSetCurrent and the call
// (testHookEnter). Without the LockOSThread + cuCtxSetCurrent discipline of
// Device.enter, calls land on threads with no current context and fail with
// CUDA_ERROR_INVALID_CONTEXT. (Verified against a fake libcuda that checks
// the calling thread's context: removing LockOSThread from enter makes this
// test fail.)
func TestGPUConcurrentLaunches(t *testing.T) {
	d := requireGPU(t)
	m := gpuCompile(t, d, testKernels)
	addOne := gpuFunction(t, m, "add_one")
	if p := runtime.GOMAXPROCS(0); p < 8 {
		runtime.GOMAXPROCS(8)
		defer runtime.GOMAXPROCS(p)
	}
	// Yield between cuCtxSetCurrent and each driver call: an unpinned
	// goroutine would then usually continue on another thread, one that a
	// polluter has just left without a context.
	testHookEnter = runtime.Gosched
	defer func() { testHookEnter = nil }()

	var stop atomic.Bool
	var polluters sync.WaitGroup
	for i := 0; i < 4; i++ {
		polluters.Add(1)
		go func() {
			defer polluters.Done()
			for !stop.Load() {
				runtime.LockOSThread()
				CCall(cuDrv.cuCtxSetCurrent, 0)
				runtime.UnlockOSThread()
				runtime.Gosched()
			}
		}()
	}
	defer func() { stop.Store(true); polluters.Wait() }()

	const workers, iters, n = 8, 300, 4099
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			err := func() error {
				s, err := d.NewStream()
				if err != nil {
					return err
				}
				defer d.DestroyStream(s)
				x, err := d.MemAlloc(4 * n)
				if err != nil {
					return err
				}
				defer d.MemFree(x)
				if err := d.Memset32(x, math.Float32bits(float32(w)), n, s); err != nil {
					return err
				}
				for i := 0; i < iters; i++ {
					if err := addOne.Launch(Grid1D(n, 256), Dim3{X: 256}, 0, s, x, int32(n)); err != nil {
						return fmt.Errorf("iteration %d: %w", i, err)
					}
					if i%50 == 0 {
						e, err := d.EventRecord(s)
						if err != nil {
							return err
						}
						if _, err := d.EventQuery(e); err != nil {
							return err
						}
						if err := d.EventDestroy(e); err != nil {
							return err
						}
						tmp, err := d.MemAlloc(1 << 16)
						if err != nil {
							return err
						}
						if err := d.MemFree(tmp); err != nil {
							return err
						}
					}
					runtime.Gosched()
				}
				host := make([]float32, n)
				if err := d.CopyDtoH(unsafe.Pointer(&host[0]), x, 4*n, s); err != nil {
					return err
				}
				for i, v := range host {
					if v != float32(w+iters) {
						return fmt.Errorf("worker %d: x[%d] = %v, want %v", w, i, v, w+iters)
					}
				}
				return nil
			}()
			if err != nil {
				errs <- err
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// BenchmarkGPUEnterLeave measures the per-call threading overhead
// (LockOSThread + cuCtxSetCurrent + UnlockOSThread).
func BenchmarkGPUEnterLeave(b *testing.B) {
	d := requireGPU(b)
	for i := 0; i < b.N; i++ {
		if err := d.enter(); err != nil {
			b.Fatal(err)
		}
		d.leave()
	}
}

// BenchmarkGPULaunch measures the host cost of one kernel launch.
func BenchmarkGPULaunch(b *testing.B) {
	d := requireGPU(b)
	old := d.KernelCache()
	d.SetKernelCache(NewKernelCache(b.TempDir()))
	defer d.SetKernelCache(old)
	m, err := d.Compile(`extern "C" __global__ void empty(float *x, int n) {}`)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Unload()
	f, err := m.Function("empty")
	if err != nil {
		b.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer d.DestroyStream(s)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := f.Launch(Dim3{X: 1}, Dim3{X: 32}, 0, s, uintptr(0), int32(0)); err != nil {
			b.Fatal(err)
		}
		if i%1024 == 1023 {
			d.Synchronize(s) // keep the launch queue from filling
		}
	}
	b.StopTimer()
	d.Synchronize(s)
}

// TestGPUVirtualMemory maps pages into a reserved range one call at a time,
// so that a buffer spans separate physical allocations, checks that data
// crosses the page boundary intact, and unmaps and releases it all.
func TestGPUVirtualMemory(t *testing.T) {
	d := requireGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("no virtual memory management on", d)
	}
	page := d.PageSize()
	if page <= 0 || page&(page-1) != 0 {
		t.Fatalf("page size %d", page)
	}
	va, err := d.ReserveAddress(8 * page)
	gpuCheck(t, err)
	gpuCheck(t, d.MapPages(va, page))
	gpuCheck(t, d.MapPages(va+uintptr(page), 2*page))
	if err := d.MapPages(va+uintptr(page), page); err == nil {
		t.Error("mapping a mapped page again succeeded")
	}
	n := 3 * page / 4
	host := make([]float32, n)
	for i := range host {
		host[i] = float32(i%1000) - 3.5
	}
	gpuCheck(t, d.CopyHtoD(va, unsafe.Pointer(&host[0]), 4*n, 0))
	back := make([]float32, n)
	gpuCheck(t, d.CopyDtoH(unsafe.Pointer(&back[0]), va, 4*n, 0))
	for i := range back {
		if back[i] != host[i] {
			t.Fatalf("across pages: back[%d] = %v, want %v", i, back[i], host[i])
		}
	}
	gpuCheck(t, d.UnmapPages(va+uintptr(2*page), page))
	gpuCheck(t, d.UnmapPages(va, 2*page))
	if err := d.UnmapPages(va, page); err == nil {
		t.Error("unmapping an unmapped page succeeded")
	}
	gpuCheck(t, d.FreeAddress(va, 8*page))
}
