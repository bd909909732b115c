package cuda

// GPU tests of the CUDA backend: the tensortest conformance suites, the
// LeNet training curve against the CPU backend, the caching allocator's
// steady state over training steps, out-of-memory reporting, and edge cases
// of the kernels. They skip without a GPU (fail with EMBER_REQUIRE_GPU=1).

import (
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/ember-ml/ember/models/modelstest"
	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// newGPUBackend makes a Backend on the test device, closed at the end of
// the test.
func newGPUBackend(t testing.TB, opt BackendOptions) *Backend {
	t.Helper()
	d := requireGPU(t)
	opt, err := OptionsFromEnv(opt)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBackend(d.Ordinal(), opt)
	if err != nil {
		t.Fatalf("NewBackend: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func TestGPUBackendConformance(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	tensortest.RunBackend(t, b)
}

// TestGPUBackendConformanceStreamed runs the suite with every reduction
// reading its input as one larger than half the L2 cache would be read
// (ember_ld_once, ember_reduce_rows_sum4), a path the suite's small inputs
// would otherwise not take.
func TestGPUBackendConformanceStreamed(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	b.streamAll = true
	tensortest.RunBackend(t, b)
}

func TestGPUBackendAutograd(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	tensortest.RunAutograd(t, b)
}

// TestGPUBackendTrainingCurve trains LeNet for 100 steps on the CPU and on
// the GPU from the same seed: every step's loss must agree within 1e-3
// relative.
func TestGPUBackendTrainingCurve(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const steps, seed = 100, 1
	leaks := tensor.Leaks()
	gpu, err := modelstest.TrainingCurve(b, steps, seed)
	if err != nil {
		t.Fatalf("GPU training: %v", err)
	}
	cpu, err := modelstest.TrainingCurve(tensor.CPU, steps, seed)
	if err != nil {
		t.Fatalf("CPU training: %v", err)
	}
	if len(gpu) != steps || len(cpu) != steps {
		t.Fatalf("got %d GPU and %d CPU losses, want %d", len(gpu), len(cpu), steps)
	}
	worst, at := 0.0, 0
	for i := range cpu {
		rel := math.Abs(float64(gpu[i])-float64(cpu[i])) / math.Abs(float64(cpu[i]))
		if rel > worst {
			worst, at = rel, i
		}
		if !(rel <= 1e-3) {
			t.Errorf("step %d: GPU loss %.7g, CPU loss %.7g (relative difference %.2g > 1e-3)", i, gpu[i], cpu[i], rel)
		}
	}
	t.Logf("loss %.5g -> %.5g (CPU %.5g -> %.5g); largest relative difference %.2g at step %d",
		gpu[0], gpu[steps-1], cpu[0], cpu[steps-1], worst, at)
	if cpu[steps-1] >= cpu[0] {
		t.Errorf("the CPU loss did not decrease (%g -> %g): the comparison proves little", cpu[0], cpu[steps-1])
	}
	checkNoLeaks(t, leaks)
}

// checkNoLeaks fails when tensors were collected by the GC without being
// released since tensor.Leaks() was before.
func checkNoLeaks(t *testing.T, before int64) {
	t.Helper()
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // cleanups run on their own goroutine
	}
	if n := tensor.Leaks() - before; n != 0 {
		t.Errorf("%d tensors were collected without being released", n)
	}
}

// TestGPUBackendNoDriverAllocs runs LeNet training steps with a scope
// reset per step: after the first step every allocation (tensors and
// workspaces) must be served from the allocator's cache.
func TestGPUBackendNoDriverAllocs(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	leaks := tensor.Leaks()
	tr := newLeNetTrainer(t, b, 64)
	first := tr.step()
	st := b.MemoryStats()
	var last float32
	for step := 2; step <= 20; step++ {
		last = tr.step()
		if s := b.MemoryStats(); s.DriverAllocs != st.DriverAllocs {
			t.Errorf("step %d: %d driver allocations (had %d after step 1)\n%s", step, s.DriverAllocs, st.DriverAllocs, b.Allocator().MemorySummary())
			break
		}
	}
	if err := b.Synchronize(); err != nil {
		t.Fatal(err)
	}
	s := b.MemoryStats()
	t.Logf("loss %.4g -> %.4g; %d driver allocations, %d segments, %.1f MiB reserved, peak %.1f MiB allocated, %d cache hits",
		first, last, s.DriverAllocs, s.Segments, float64(s.Reserved.Current)/(1<<20), float64(s.Allocated.Peak)/(1<<20), s.CacheHits)
	if math.IsNaN(float64(last)) || last >= first {
		t.Errorf("loss did not decrease: %g -> %g", first, last)
	}
	tr.close()
	// Only cuBLAS's workspace and the split sums' counters, held for the
	// backend's life, stay.
	if s := b.MemoryStats(); s.Allocated.Current != b.BLASWorkspace()+b.tileCounters.Size() {
		t.Errorf("%d bytes still allocated after releasing everything (cuBLAS workspace %d, counters %d)", s.Allocated.Current, b.BLASWorkspace(), b.tileCounters.Size())
	}
	checkNoLeaks(t, leaks)
}

// TestGPUBackendOutOfMemory: Alloc returns the allocator's *OutOfMemoryError, and a
// tensor operation turns it into a *tensor.Error that Guard recovers.
func TestGPUBackendOutOfMemory(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{MemoryLimit: 64 << 20})
	_, err := b.Alloc(128<<20, tensor.Float32)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Fatalf("Alloc over the limit: %v (%T), want an *OutOfMemoryError", err, err)
	}
	err = tensor.Guard(func() { tensor.Zeros(b, nil, 128<<20) })
	var te *tensor.Error
	if !errors.As(err, &te) || !errors.Is(err, ErrDeviceOutOfMemory) {
		t.Fatalf("Guard: %v (%T), want a *tensor.Error wrapping out of memory", err, err)
	}
	// The backend still works.
	x := tensor.Full(b, nil, 2, 1000)
	defer x.Release()
	if s := tensor.Sum(x).Item(); s != 2000 {
		t.Errorf("Sum after an OOM = %g, want 2000", s)
	}
}

// gpuCPU holds the same data on the GPU and on the CPU backend.
type gpuCPU struct {
	t    *testing.T
	g    *Backend
	bufs []tensor.Buffer
}

func (h *gpuCPU) f32(data []float32) (gb, cb tensor.Buffer) {
	gb, err := h.g.Alloc(len(data), tensor.Float32)
	if err != nil {
		h.t.Fatal(err)
	}
	h.bufs = append(h.bufs, gb)
	h.g.Upload(gb, data)
	cb, _ = tensor.CPU.Alloc(len(data), tensor.Float32)
	tensor.CPU.Upload(cb, data)
	return gb, cb
}

func (h *gpuCPU) i32(data []int32) (gb, cb tensor.Buffer) {
	gb, err := h.g.Alloc(len(data), tensor.Int32)
	if err != nil {
		h.t.Fatal(err)
	}
	h.bufs = append(h.bufs, gb)
	h.g.Upload(gb, data)
	cb, _ = tensor.CPU.Alloc(len(data), tensor.Int32)
	tensor.CPU.Upload(cb, data)
	return gb, cb
}

func (h *gpuCPU) free() {
	for _, b := range h.bufs {
		h.g.Free(b)
	}
	h.bufs = nil
}

func downloadF(b tensor.Backend, buf tensor.Buffer) []float32 {
	out := make([]float32, buf.Len)
	b.Download(out, buf)
	return out
}

func downloadI(b tensor.Backend, buf tensor.Buffer) []int32 {
	out := make([]int32, buf.Len)
	b.Download(out, buf)
	return out
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
			return false
		}
	}
	return true
}

func pseudoRandom(n int, seed uint32) []float32 {
	return xorshiftValues(n, seed, func(x uint32) float32 { return float32(int32(x%2001)-1000) / 500 })
}

// xorshiftValues maps n successive states of a xorshift32 generator
// started at seed to values.
func xorshiftValues(n int, seed uint32, value func(uint32) float32) []float32 {
	out := make([]float32, n)
	x := seed | 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		out[i] = value(x)
	}
	return out
}

// TestGPUBackendEdgeCases checks behaviour the conformance suite leaves open, mostly
// against the CPU backend: NaN handling, the multi-block paths of the
// reductions, empty inputs, bad indices, merged high-rank views, and
// determinism.
func TestGPUBackendEdgeCases(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	h := &gpuCPU{t: t, g: b}
	defer h.free()

	t.Run("NaN propagation", func(t *testing.T) {
		x := pseudoRandom(2*3*8*8, 7)
		for i := 0; i < len(x); i += 11 {
			x[i] = float32(math.NaN())
		}
		x[1] = float32(math.Copysign(0, -1))
		gx, cx := h.f32(x)
		gy, cy := h.f32(make([]float32, len(x)))
		b.ReLU(gy, gx)
		tensor.Complete(tensor.CPU).ReLU(cy, cx)
		if g, c := downloadF(b, gy), downloadF(tensor.CPU, cy); !sameBits(g, c) {
			t.Errorf("ReLU with NaN and -0 differs from the CPU")
		}
		pg := tensor.PoolGeom{N: 2, C: 3, H: 8, W: 8, KH: 3, KW: 3, StrideH: 2, StrideW: 2}
		n := pg.N * pg.C * pg.OutH() * pg.OutW()
		gp, cp := h.f32(make([]float32, n))
		ga, ca := h.i32(make([]int32, n))
		b.MaxPool2d(gp, ga, gx, pg)
		tensor.Complete(tensor.CPU).MaxPool2d(cp, ca, cx, pg)
		if g, c := downloadF(b, gp), downloadF(tensor.CPU, cp); !sameBits(g, c) {
			t.Errorf("MaxPool2d with NaN: y differs from the CPU:\n%v\n%v", g, c)
		}
		if g, c := downloadI(b, ga), downloadI(tensor.CPU, ca); !equalI(g, c) {
			t.Errorf("MaxPool2d with NaN: argmax differs from the CPU:\n%v\n%v", g, c)
		}
		rows, cols := 6, 40
		z := pseudoRandom(rows*cols, 9)
		z[0] = float32(math.NaN())         // row 0: NaN first -> 0
		z[cols+5] = float32(math.NaN())    // row 1: NaN skipped
		z[2*cols+3], z[2*cols+30] = 50, 50 // row 2: tie, first wins
		gz, cz := h.f32(z)
		gd, cd := h.i32(make([]int32, rows))
		b.Argmax(gd, gz, rows, cols)
		tensor.Complete(tensor.CPU).Argmax(cd, cz, rows, cols)
		if g, c := downloadI(b, gd), downloadI(tensor.CPU, cd); !equalI(g, c) {
			t.Errorf("Argmax with NaN and ties: %v, CPU %v", g, c)
		}
	})

	t.Run("multi-block reductions", func(t *testing.T) {
		for _, n := range []int{4096, 4097, 1 << 20} {
			x := pseudoRandom(n, uint32(n))
			gx, cx := h.f32(x)
			gs, cs := h.f32([]float32{0})
			b.Sum(gs, gx)
			tensor.Complete(tensor.CPU).Sum(cs, cx)
			g, c := downloadF(b, gs)[0], downloadF(tensor.CPU, cs)[0]
			if math.Abs(float64(g-c)) > 1e-6*math.Abs(float64(c))+1e-6 {
				t.Errorf("Sum of %d: %g, CPU %g", n, g, c)
			}
		}
		// BiasGrad with inner 1 and a long outer (block path).
		outer, ch := 70000, 3
		dy := pseudoRandom(outer*ch, 5)
		gdy, cdy := h.f32(dy)
		gdb, cdb := h.f32(make([]float32, ch))
		b.BiasGrad(gdb, gdy, outer, ch, 1, false)
		tensor.Complete(tensor.CPU).BiasGrad(cdb, cdy, outer, ch, 1, false)
		for i, g := range downloadF(b, gdb) {
			c := downloadF(tensor.CPU, cdb)[i]
			if math.Abs(float64(g-c)) > 1e-6*math.Abs(float64(c))+1e-5 {
				t.Errorf("BiasGrad channel %d: %g, CPU %g", i, g, c)
			}
		}
		// CrossEntropy over many rows (several blocks, then the final sum).
		n, classes := 3000, 10
		z := pseudoRandom(n*classes, 3)
		lab := make([]int32, n)
		for i := range lab {
			lab[i] = int32(i * 7 % classes)
		}
		gz, cz := h.f32(z)
		gl, cl := h.i32(lab)
		gloss, closs := h.f32([]float32{0})
		gdz, cdz := h.f32(make([]float32, n*classes))
		b.CrossEntropy(gloss, gdz, gz, gl, n, classes)
		tensor.Complete(tensor.CPU).CrossEntropy(closs, cdz, cz, cl, n, classes)
		g, c := downloadF(b, gloss)[0], downloadF(tensor.CPU, closs)[0]
		if math.Abs(float64(g-c)) > 1e-5*math.Abs(float64(c)) {
			t.Errorf("CrossEntropy over %d rows: %g, CPU %g", n, g, c)
		}
		gd, cd := downloadF(b, gdz), downloadF(tensor.CPU, cdz)
		for i := range gd {
			if math.Abs(float64(gd[i]-cd[i])) > 1e-5*math.Abs(float64(cd[i]))+1e-10 {
				t.Errorf("CrossEntropy dlogits[%d] = %g, CPU %g", i, gd[i], cd[i])
				break
			}
		}
	})

	t.Run("empty and invalid", func(t *testing.T) {
		gs, _ := h.f32([]float32{7})
		ge, err := b.Alloc(0, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		b.Sum(gs, ge)
		if v := downloadF(b, gs)[0]; v != 0 {
			t.Errorf("Sum of nothing = %g", v)
		}
		b.Free(ge)
		// A label out of range gives NaN (the CPU panics).
		gz, _ := h.f32(pseudoRandom(20, 1))
		gl, _ := h.i32([]int32{3, 10})
		gloss, _ := h.f32([]float32{0})
		b.CrossEntropy(gloss, tensor.Buffer{}, gz, gl, 2, 10)
		if v := downloadF(b, gloss)[0]; !math.IsNaN(float64(v)) {
			t.Errorf("CrossEntropy with label 10 of 10 classes = %g, want NaN", v)
		}
		if err := b.Synchronize(); err != nil {
			t.Errorf("Synchronize: %v", err)
		}
	})

	t.Run("high-rank views", func(t *testing.T) {
		// Rank 8, merging to 3 dimensions: a transpose of the last two axes.
		shape := []int{2, 2, 2, 2, 2, 2, 3, 5}
		strides := []int{960, 480, 240, 120, 60, 15, 1, 3}
		src := pseudoRandom(128*15, 11)
		gsrc, csrc := h.f32(src)
		gd, cd := h.f32(make([]float32, 64*15))
		b.CopyStrided(gd, gsrc, shape, strides)
		tensor.CPU.CopyStrided(cd, csrc, shape, strides)
		if !sameBits(downloadF(b, gd), downloadF(tensor.CPU, cd)) {
			t.Error("CopyStrided of a rank-8 view differs from the CPU")
		}
	})

	t.Run("determinism", func(t *testing.T) {
		g := tensor.ConvGeom{N: 8, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1}
		x := pseudoRandom(g.N*g.C*g.H*g.W, 1)
		w := pseudoRandom(g.K*g.C*g.R*g.S, 2)
		dy := pseudoRandom(g.N*g.K*g.OutH()*g.OutW(), 3)
		gx, _ := h.f32(x)
		gw, _ := h.f32(w)
		gdy, _ := h.f32(dy)
		run := func() ([]float32, []float32, []float32) {
			gdx, _ := h.f32(make([]float32, len(x)))
			gdw, _ := h.f32(make([]float32, len(w)))
			gdb, _ := h.f32(make([]float32, g.K))
			b.Conv2dBackward(gdx, gdw, gdb, gdy, gx, gw, tensor.Buffer{}, g)
			return downloadF(b, gdx), downloadF(b, gdw), downloadF(b, gdb)
		}
		dx1, dw1, db1 := run()
		dx2, dw2, db2 := run()
		if !sameBits(dx1, dx2) || !sameBits(dw1, dw2) || !sameBits(db1, db2) {
			t.Error("two runs of Conv2dBackward differ")
		}
	})
}

func equalI(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestGPUBackendBasics(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{TF32: true})
	if b.Name() != "cuda:"+itoa(b.Device().Ordinal()) {
		t.Errorf("Name() = %q", b.Name())
	}
	if b.Stream() == 0 || b.Allocator() == nil {
		t.Error("no stream or allocator")
	}
	if err := b.Synchronize(); err != nil {
		t.Error(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

// TestGPUCoreOnly runs the fallbacks on the GPU's core alone
// (tensortest.CoreOnly hides every optional interface of the backend):
// CompleteBackend's operations against the references, the tensor layer
// against the CPU, and LeNet's training curve against the CPU's (1e-3
// relative per step, as TestGPUBackendTrainingCurve, over fewer steps).
func TestGPUCoreOnly(t *testing.T) {
	b := tensortest.CoreOnly(newGPUBackend(t, BackendOptions{}))
	tensortest.RunComplete(t, b)
	tensortest.RunAutograd(t, b)
	const steps, seed = 20, 1
	gpu, err := modelstest.TrainingCurve(b, steps, seed)
	if err != nil {
		t.Fatalf("core-only GPU training: %v", err)
	}
	cpu, err := modelstest.TrainingCurve(tensor.CPU, steps, seed)
	if err != nil {
		t.Fatalf("CPU training: %v", err)
	}
	for i := range cpu {
		if rel := math.Abs(float64(gpu[i])-float64(cpu[i])) / math.Abs(float64(cpu[i])); !(rel <= 1e-3) {
			t.Errorf("step %d: core-only GPU loss %.7g, CPU loss %.7g (relative difference %.2g > 1e-3)", i, gpu[i], cpu[i], rel)
		}
	}
}
