package driver

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// ---------------------------------------------------------------------------
// CPU tests.

func TestGrid1D(t *testing.T) {
	for _, c := range []struct{ n, block, want int }{
		{0, 256, 0}, {1, 256, 1}, {256, 256, 1}, {257, 256, 2}, {1000003, 256, 3907}, {5, 0, 5},
	} {
		g := Grid1D(c.n, c.block)
		if g.X != c.want || g.Y != 1 || g.Z != 1 {
			t.Errorf("Grid1D(%d, %d) = %+v, want X=%d", c.n, c.block, g, c.want)
		}
		if c.block > 0 && g.X*c.block < c.n {
			t.Errorf("Grid1D(%d, %d) does not cover n", c.n, c.block)
		}
	}
}

func TestDims(t *testing.T) {
	v, err := launchDims("block", Dim3{X: 32})
	if err != nil || v != [3]int{32, 1, 1} {
		t.Errorf("launchDims(X only) = %v, %v", v, err)
	}
	if _, err := launchDims("grid", Dim3{X: -1}); err == nil {
		t.Error("negative dimension accepted")
	}
	if _, err := launchDims("grid", Dim3{X: 1 << 33}); err == nil {
		t.Error("dimension above 2^32-1 accepted")
	}
}

func TestPackArgs(t *testing.T) {
	vals := make([]uint64, 10)
	buf := &Float32Buffer{ptr: 0x7000_0000_1000, n: 4}
	err := packArgs(vals, []any{
		uintptr(0xdead_beef_0000), int32(-2), uint32(7), int64(-3), uint64(1 << 40),
		float32(1.5), float64(-2.25), buf,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{
		0xdead_beef_0000,
		uint64(uint32(0xfffffffe)), // int32 -2: low 4 bytes, upper zero
		7,
		uint64(0xfffffffffffffffd),
		1 << 40,
		uint64(math.Float32bits(1.5)),
		math.Float64bits(-2.25),
		0x7000_0000_1000,
	}
	for i, w := range want {
		if vals[i] != w {
			t.Errorf("arg %d packed as %#x, want %#x", i, vals[i], w)
		}
	}
	if err := packArgs(vals, []any{int(3)}); err == nil || !strings.Contains(err.Error(), "int32") {
		t.Errorf("Go int must be rejected with a hint: %v", err)
	}
	if err := packArgs(vals, []any{"x"}); err == nil {
		t.Error("string accepted as kernel argument")
	}
	if err := packArgs(vals, make([]any, 11)); err == nil {
		t.Error("too many arguments accepted")
	}
}

func TestArgBufPointers(t *testing.T) {
	b := argPool.Get().(*argBuf)
	defer argPool.Put(b)
	for i := range b.ptrs {
		if b.ptrs[i] != uintptrOfSlot(b, i) {
			t.Fatalf("ptrs[%d] does not point at vals[%d]", i, i)
		}
	}
}

// TestKernelParamsLayout reads the kernelParams of a launch the way the
// driver does: void **kernelParams, kernelParams[i] points at argument i.
func TestKernelParamsLayout(t *testing.T) {
	b := argPool.Get().(*argBuf)
	defer argPool.Put(b)
	if b.kernelParams(0) != nil {
		t.Error("no arguments must give a NULL kernelParams")
	}
	args := []any{uintptr(0x1234_5678_9abc), int32(-5), float32(0.25), float64(3.5), int64(-1 << 40)}
	if err := packArgs(b.vals[:], args); err != nil {
		t.Fatal(err)
	}
	pp := (*[MaxKernelParams]unsafe.Pointer)(b.kernelParams(len(args)))
	if got := *(*uintptr)(pp[0]); got != 0x1234_5678_9abc {
		t.Errorf("param 0 (T*) = %#x", got)
	}
	if got := *(*int32)(pp[1]); got != -5 {
		t.Errorf("param 1 (int) = %d", got)
	}
	if got := *(*float32)(pp[2]); got != 0.25 {
		t.Errorf("param 2 (float) = %v", got)
	}
	if got := *(*float64)(pp[3]); got != 3.5 {
		t.Errorf("param 3 (double) = %v", got)
	}
	if got := *(*int64)(pp[4]); got != -1<<40 {
		t.Errorf("param 4 (long long) = %d", got)
	}
	runtime.KeepAlive(b)
}

func TestFloat32BufferChecks(t *testing.T) {
	var b *Float32Buffer
	if err := b.CopyFromHost([]float32{1}); err == nil {
		t.Error("nil buffer accepted")
	}
	if err := b.Free(); err != nil {
		t.Error("Free of nil buffer must be a no-op")
	}
	fb := &Float32Buffer{ptr: 1, n: 2}
	if err := fb.check(3); err == nil {
		t.Error("host slice longer than the buffer accepted")
	}
}

// ---------------------------------------------------------------------------
// GPU tests.

const saxpySrc = `
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void axpy64(double a, const double *x, double *y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
`

func TestGPUSaxpy(t *testing.T) {
	d := requireGPU(t)
	m := gpuCompile(t, d, saxpySrc)
	t.Logf("module: %v for %s; log %q", m.Kind, m.Arch, m.Log)
	saxpy := gpuFunction(t, m, "saxpy")
	for _, n := range []int{1, 255, 257, 1000003} {
		for _, block := range []int{128, 256, 1000} { // 1000: not a power of two
			hx, hy := make([]float32, n), make([]float32, n)
			r := rand.New(rand.NewPCG(uint64(n), uint64(block)))
			for i := range hx {
				hx[i], hy[i] = r.Float32()*2-1, r.Float32()*2-1
			}
			x, err := d.AllocFloat32(n)
			gpuCheck(t, err)
			y, err := d.AllocFloat32(n + 64) // slack: a missing bounds check would show here
			gpuCheck(t, err)
			gpuCheck(t, x.CopyFromHost(hx))
			gpuCheck(t, y.CopyFromHost(append(append([]float32(nil), hy...), make([]float32, 64)...)))
			const a = float32(2.5)
			gpuCheck(t, saxpy.Launch(Grid1D(n, block), Dim3{X: block}, 0, 0, a, x, y.Ptr(), int32(n)))
			got := make([]float32, n+64)
			gpuCheck(t, y.CopyToHost(got))
			for i := 0; i < n; i++ {
				want := a*hx[i] + hy[i]
				// The GPU fuses a*x+y into one FMA (one rounding); the CPU
				// expression may round twice: allow 2 ulp-ish.
				if diff := math.Abs(float64(got[i] - want)); diff > 2e-7*(math.Abs(float64(a*hx[i]))+math.Abs(float64(hy[i])))+1e-30 {
					t.Fatalf("n=%d block=%d: y[%d] = %v, want %v", n, block, i, got[i], want)
				}
			}
			for i := n; i < n+64; i++ {
				if got[i] != 0 {
					t.Fatalf("n=%d block=%d: kernel wrote past n at %d", n, block, i)
				}
			}
			gpuCheck(t, x.Free())
			gpuCheck(t, y.Free())
		}
	}
}

func TestGPULaunchInt64Float64Args(t *testing.T) {
	d := requireGPU(t)
	m := gpuCompile(t, d, saxpySrc)
	f := gpuFunction(t, m, "axpy64")
	const n = 777
	hx, hy := make([]float64, n), make([]float64, n)
	for i := range hx {
		hx[i], hy[i] = float64(i), 1
	}
	x, err := d.MemAlloc(8 * n)
	gpuCheck(t, err)
	defer d.MemFree(x)
	y, err := d.MemAlloc(8 * n)
	gpuCheck(t, err)
	defer d.MemFree(y)
	gpuCheck(t, d.CopyHtoD(x, unsafePtr(hx), 8*n, 0))
	gpuCheck(t, d.CopyHtoD(y, unsafePtr(hy), 8*n, 0))
	gpuCheck(t, f.Launch(Grid1D(n, 64), Dim3{X: 64}, 0, 0, float64(0.5), x, y, int64(n)))
	gpuCheck(t, d.CopyDtoH(unsafePtr(hy), y, 8*n, 0))
	for i, v := range hy {
		if v != 0.5*float64(i)+1 {
			t.Fatalf("y[%d] = %v", i, v)
		}
	}
}

func TestGPULaunchErrors(t *testing.T) {
	d := requireGPU(t)
	m := gpuCompile(t, d, saxpySrc)
	f := gpuFunction(t, m, "saxpy")
	if err := f.Launch(Dim3{X: 1}, Dim3{X: 32}, 0, 0, float32(1), uintptr(0), uintptr(0), 5); err == nil {
		t.Error("Go int argument accepted")
	}
	if err := f.Launch(Dim3{X: 1}, Dim3{X: 4096}, 0, 0, float32(1), uintptr(0), uintptr(0), int32(0)); err == nil {
		t.Error("block of 4096 threads accepted")
	} else {
		t.Log(err)
	}
	if err := f.Launch(Dim3{}, Dim3{X: 32}, 0, 0, float32(1), uintptr(0), uintptr(0), int32(0)); err != nil {
		t.Errorf("empty grid must be a no-op: %v", err)
	}
	if _, err := m.Function("no_such_kernel"); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_NOT_FOUND") {
		t.Errorf("missing kernel: %v", err)
	}
	gpuCheck(t, d.SynchronizeDevice())
}

func TestGPUFloat32Buffer(t *testing.T) {
	d := requireGPU(t)
	b, err := d.AllocFloat32(1000)
	gpuCheck(t, err)
	in := make([]float32, 1000)
	for i := range in {
		in[i] = float32(i) / 3
	}
	gpuCheck(t, b.CopyFromHost(in))
	out := make([]float32, 1000)
	gpuCheck(t, b.CopyToHost(out))
	for i := range in {
		if in[i] != out[i] {
			t.Fatalf("out[%d] = %v", i, out[i])
		}
	}
	if err := b.CopyFromHost(make([]float32, 1001)); err == nil {
		t.Error("oversized copy accepted")
	}
	gpuCheck(t, b.Free())
	gpuCheck(t, b.Free())
	if err := b.CopyToHost(out); err == nil {
		t.Error("use after Free accepted")
	}
}

func uintptrOfSlot(b *argBuf, i int) uintptr { return uintptr(unsafe.Pointer(&b.vals[i])) }

func unsafePtr(s []float64) unsafe.Pointer { return unsafe.Pointer(&s[0]) }
