package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// linearCase is one layer of the cuBLASLt tests: n x in -> out, its ReLU
// and bias, which gradients are wanted and whether each is added to.
type linearCase struct {
	n, in, out      int
	relu, bias      bool
	dx, dw, db      bool
	accX, accW, acc bool // acc: db added to
}

func (c linearCase) String() string {
	return fmt.Sprintf("%dx%d·%dx%d relu=%v bias=%v grads=%v,%v,%v acc=%v,%v,%v", c.n, c.in, c.in, c.out, c.relu, c.bias, c.dx, c.dw, c.db, c.accX, c.accW, c.acc)
}

// runLinear runs c's forward and backward passes on b from x, w, bias, g
// (gradients starting from start's values) and returns y, then the
// gradients wanted.
func runLinear(t *testing.T, b *Backend, c linearCase, x, w, bias, g []float32, start func(n int, seed uint32) []float32) [][]float32 {
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	gx, _ := h.f32(x)
	gw, _ := h.f32(w)
	var gbias tensor.Buffer
	if c.bias {
		gbias, _ = h.f32(bias)
	}
	gg, _ := h.f32(g)
	gy, _ := h.f32(make([]float32, c.n*c.out))
	b.Linear(gy, gx, gw, gbias, c.n, c.in, c.out, c.relu)
	var mask tensor.Buffer
	if c.relu {
		mask = gy
	}
	var gdx, gdw, gdb tensor.Buffer
	if c.dx {
		gdx, _ = h.f32(start(c.n*c.in, 5))
	}
	if c.dw {
		gdw, _ = h.f32(start(c.out*c.in, 6))
	}
	if c.db {
		gdb, _ = h.f32(start(c.out, 7))
	}
	b.LinearGrads(gdx, gdw, gdb, gg, mask, gx, gw, c.n, c.in, c.out, c.accX, c.accW, c.acc)
	var out [][]float32
	for _, buf := range []tensor.Buffer{gy, gdx, gdw, gdb} {
		if !buf.Empty() {
			out = append(out, downloadF(b, buf))
		}
	}
	return out
}

// withPath runs f with b's linear layers on one path: "cublas" (no
// cuBLASLt, no tiled kernels: cuBLAS and the separate bias, ReLU and mask
// passes, or ember_gemm_small), "lt" (cuBLASLt for every layer it takes),
// "lt>256" (BackendOptions.LinearLt's choice: cuBLASLt above 256 rows) or
// "current" (the default without cuBLASLt: the tiled kernels up to 256
// rows, cuBLAS above). b must have cuBLASLt open.
func withPath(b *Backend, path string, f func()) {
	lt, tiled, everywhere, wide := b.lt, b.noLinearTiled, b.ltEverywhere, b.ltWide
	defer func() { b.lt, b.noLinearTiled, b.ltEverywhere, b.ltWide = lt, tiled, everywhere, wide }()
	switch path {
	case "cublas":
		b.lt, b.noLinearTiled, b.ltEverywhere = nil, true, false
	case "current":
		b.lt, b.ltEverywhere = nil, false
	case "lt>256":
		b.ltEverywhere, b.ltWide = false, false
	case "lt":
		b.ltEverywhere = true
	}
	f()
}

// requireLt skips (fails with EMBER_REQUIRE_GPU=1) without cuBLASLt, and
// logs, at the end of the test, the shapes cuBLASLt refused.
func requireLt(t testing.TB, b *Backend) {
	t.Helper()
	if b.lt == nil {
		if os.Getenv("EMBER_REQUIRE_GPU") == "1" {
			t.Fatalf("no cuBLASLt: %v", b.ltErr)
		}
		t.Skipf("no cuBLASLt: %v", b.ltErr)
	}
	t.Logf("cuBLASLt version %d", b.lt.Version())
	t.Cleanup(func() {
		for g, err := range b.lt.Refused() {
			t.Logf("cuBLASLt refused %+v: %v", g, err)
		}
	})
}

// ltCases cover the batches that go to cuBLASLt by default (above 256
// rows) and, through LinearLtEverywhere, the MLP's own at batch 64; each
// epilogue (bias, ReLU + bias, ReLU alone, none); the weight gradient
// with the bias gradient in its epilogue (no ReLU, db written) and the
// cases that keep db apart (db added to, ReLU's mask, no dw).
var ltCases = []linearCase{
	{n: 300, in: 200, out: 132, relu: true, bias: true, dx: true, dw: true, db: true, accW: true},
	{n: 520, in: 96, out: 64, bias: true, dx: true, dw: true, db: true},
	{n: 520, in: 96, out: 64, bias: true, dw: true, db: true, accW: true, acc: true},
	{n: 260, in: 64, out: 40, relu: true, dx: true, dw: true},
	{n: 288, in: 128, out: 36, db: true, dx: true},
	{n: 1024, in: 784, out: 1024, relu: true, bias: true, dw: true, db: true},
	{n: 64, in: 784, out: 1024, relu: true, bias: true, dw: true, db: true},
	{n: 64, in: 1024, out: 1024, relu: true, bias: true, dx: true, dw: true, db: true},
	{n: 64, in: 1024, out: 12, bias: true, dx: true, dw: true, db: true},
}

// TestGPULinearLtMatchesCuBLAS runs ltCases through cuBLASLt and through
// cuBLAS with the separate passes, on inputs that are multiples of 1/4
// (every sum exact in any order, gridRandom), and wants the same bits; it
// checks that cuBLASLt ran a product (so the comparison did not run the
// fallback twice).
func TestGPULinearLtMatchesCuBLAS(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{LinearLt: true})
	requireLt(t, b)
	for _, c := range ltCases {
		x, w, bias, g := gridRandom(c.n*c.in, 1), gridRandom(c.out*c.in, 2), gridRandom(c.out, 3), gridRandom(c.n*c.out, 4)
		var ref, got [][]float32
		withPath(b, "cublas", func() { ref = runLinear(t, b, c, x, w, bias, g, gridRandom) })
		calls := b.ltCalls.Load()
		withPath(b, "lt", func() { got = runLinear(t, b, c, x, w, bias, g, gridRandom) })
		if b.ltCalls.Load() == calls {
			t.Errorf("%v: no cuBLASLt product: the layer took the fallback", c)
		}
		for i := range ref {
			if !sameBits(got[i], ref[i]) {
				j := firstDiff(got[i], ref[i])
				t.Errorf("%v: result %d (y, then the gradients wanted) differs from the cuBLAS path: [%d] %g, want %g", c, i, j, got[i][j], ref[i][j])
			}
		}
	}
}

// TestGPULinearLtMatchesCPU runs ltCases through cuBLASLt on fresh random
// inputs (uniform in [-1, 1), a new seed each run, logged) in FP32 and in
// TF32, and compares y and the gradients with the CPU backend's MatMul
// (the bias, ReLU, mask and bias sums in float64 on the host). Tolerance:
// in FP32 |got - want| <= 1e-4·(1 + |want|) (sums of up to 1024 terms of
// about 0.25 each: float32 rounding gives about 1e-5 of the result). In
// TF32 each operand loses its mantissa below 10 bits, so each product is
// off by up to 2^-10 of its magnitude, and a sum that cancels can be off by
// far more than 1e-2 of itself: the bound is (2^-10 + k·2^-24)·A + 1e-6,
// A the same result over the inputs' magnitudes and k the sum's length.
// The FP32 pass, on the same code with exact products, is the tight check
// of the epilogues and masks.
func TestGPULinearLtMatchesCPU(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{LinearLt: true})
	requireLt(t, b)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 18))
	uniform := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 2*rng.Float32() - 1
		}
		return v
	}
	for _, tf32 := range []bool{false, true} {
		if err := b.blas.SetTF32(tf32); err != nil {
			t.Fatal(err)
		}
		const tol = 1e-4 // FP32
		for _, c := range ltCases {
			x, w, bias, g := uniform(c.n*c.in), uniform(c.out*c.in), uniform(c.out), uniform(c.n*c.out)
			starts := map[uint32][]float32{5: uniform(c.n * c.in), 6: uniform(c.out * c.in), 7: uniform(c.out)}
			start := func(n int, seed uint32) []float32 { return starts[seed][:n] }
			var got [][]float32
			calls := b.ltCalls.Load()
			withPath(b, "lt", func() { got = runLinear(t, b, c, x, w, bias, g, start) })
			if b.ltCalls.Load() == calls {
				t.Errorf("tf32=%v %v: no cuBLASLt product: the layer took the fallback", tf32, c)
			}
			// The gradients' ReLU mask is the y the backward pass reads (the
			// GPU's): in TF32 a y near 0 may have the other sign on the CPU.
			want := cpuLinear(c, x, w, bias, g, got[0], starts)
			mag := cpuLinear(c, absAll(x), absAll(w), absAll(bias), absAll(g), got[0],
				map[uint32][]float32{5: absAll(starts[5]), 6: absAll(starts[6]), 7: absAll(starts[7])})
			k := float64(max(c.in, c.out, c.n))
			for i := range want {
				for j := range want[i] {
					bound := tol * (1 + math.Abs(want[i][j]))
					if tf32 {
						bound = (0x1p-10+k*0x1p-24)*mag[i][j] + 1e-6
					}
					if d := math.Abs(float64(got[i][j]) - want[i][j]); !(d <= bound) {
						t.Errorf("tf32=%v %v: result %d [%d] = %g, want %g (CPU)", tf32, c, i, j, got[i][j], want[i][j])
						break
					}
				}
			}
		}
	}
	if err := b.blas.SetTF32(false); err != nil {
		t.Fatal(err)
	}
}

// cpuLinear is c on the CPU backend: the products through tensor.CPU's
// MatMul, the rest in float64. With ReLU, g counts where mask > 0 (the
// layer's output that LinearGrads is given).
func cpuLinear(c linearCase, x, w, bias, g, mask []float32, starts map[uint32][]float32) [][]float64 {
	cpu := tensor.CPU
	buf := func(v []float32) tensor.Buffer {
		b, _ := cpu.Alloc(len(v), tensor.Float32)
		cpu.Upload(b, v)
		return b
	}
	matmul := func(a, bm []float32, m, n, k int, transA, transB bool) []float32 {
		cb := buf(make([]float32, m*n))
		defer cpu.Free(cb)
		ab, bb := buf(a), buf(bm)
		defer cpu.Free(ab)
		defer cpu.Free(bb)
		cpu.MatMul(cb, ab, bb, m, n, k, transA, transB, 1, 0)
		return downloadF(cpu, cb)
	}
	f64 := func(v []float32) []float64 {
		out := make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e)
		}
		return out
	}
	y := f64(matmul(x, w, c.n, c.out, c.in, false, true))
	gm := slices.Clone(g)
	for i := range y {
		if c.bias {
			y[i] += float64(bias[i%c.out])
		}
		if c.relu {
			y[i] = max(y[i], 0)
			if !(mask[i] > 0) {
				gm[i] = 0
			}
		}
	}
	out := [][]float64{y}
	add := func(v []float64, acc bool, seed uint32) []float64 {
		if acc {
			for i := range v {
				v[i] += float64(starts[seed][i])
			}
		}
		return v
	}
	if c.dx {
		out = append(out, add(f64(matmul(gm, w, c.n, c.in, c.out, false, false)), c.accX, 5))
	}
	if c.dw {
		out = append(out, add(f64(matmul(gm, x, c.out, c.in, c.n, true, false)), c.accW, 6))
	}
	if c.db {
		db := make([]float64, c.out)
		for i, v := range gm {
			db[i%c.out] += float64(v)
		}
		out = append(out, add(db, c.acc, 7))
	}
	return out
}

// TestGPULinearPathsBench times the linear paths on the MLP's layers at
// batch 64 (784->1024 and 1024->1024 with ReLU, 1024->10) and on the GPT's
// at B·T = 16384 (384->1536, 1536->384, 384->1152, with bias), forward
// (Linear) and backward (LinearGrads: dx, dw, db, through the ReLU's mask
// where there is one), in FP32 and TF32, on each path of withPath:
// "current" (the default today: the tiled kernels of linear.cu at batch
// 64, cuBLAS above 256 rows), "cublas" (cuBLAS and the separate passes, or
// ember_gemm_small), "lt>256" (BackendOptions.LinearLt) and "lt" (cuBLASLt
// for every layer). Each time is the median over 15 samples of the time per call of
// k calls queued back to back between two Synchronize calls (k: about 2 ms
// per sample). It runs only with EMBER_LINEAR_BENCH=1 and prints one line
// per case.
func TestGPULinearPathsBench(t *testing.T) {
	if os.Getenv("EMBER_LINEAR_BENCH") != "1" {
		t.Skip("EMBER_LINEAR_BENCH=1 runs the linear paths' benchmark")
	}
	b := newGPUBackend(t, BackendOptions{LinearLt: true})
	requireLt(t, b)
	// EMBER_LINEAR_BENCH_CLUSTERS=0: the tiled kernels' split sums through
	// the workspace and counters, to compare with the clusters.
	b.noClusters = os.Getenv("EMBER_LINEAR_BENCH_CLUSTERS") == "0"
	for _, c := range []struct {
		n, in, out int
		relu       bool
	}{
		{64, 784, 1024, true}, {64, 1024, 1024, true}, {64, 1024, 10, false},
		{16384, 384, 1536, false}, {16384, 1536, 384, false}, {16384, 384, 1152, false},
	} {
		sizes := []int{c.n * c.in, c.out * c.in, c.out, c.n * c.out, c.n * c.out, c.n * c.in, c.out * c.in, c.out}
		bufs := make([]tensor.Buffer, len(sizes))
		for i, size := range sizes {
			buf, err := b.Alloc(size, tensor.Float32)
			if err != nil {
				t.Fatal(err)
			}
			b.Upload(buf, pseudoRandom(size, uint32(i+1)))
			bufs[i] = buf
		}
		x, w, bias, y, g, dx, dw, db := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7]
		var mask tensor.Buffer
		if c.relu {
			mask = y
		}
		flops := 2 * float64(c.n) * float64(c.in) * float64(c.out)
		for _, tf32 := range []bool{false, true} {
			if err := b.blas.SetTF32(tf32); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"current", "cublas", "lt>256", "lt"} {
				var fwd, bwd time.Duration
				calls := b.ltCalls.Load()
				withPath(b, path, func() {
					fwd = benchLinear(t, b, func() { b.Linear(y, x, w, bias, c.n, c.in, c.out, c.relu) })
					bwd = benchLinear(t, b, func() { b.LinearGrads(dx, dw, db, g, mask, x, w, c.n, c.in, c.out, false, false, false) })
				})
				prec := "fp32"
				if tf32 {
					prec = "tf32"
				}
				us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
				line := fmt.Sprintf("linear %dx%d->%d relu=%v %s %-7s fwd %9.1f us (%6.1f TFLOP/s)  bwd %9.1f us (%6.1f TFLOP/s)  cuBLASLt calls %d",
					c.n, c.in, c.out, c.relu, prec, path, us(fwd), flops/us(fwd)/1e6, us(bwd), 2*flops/us(bwd)/1e6, b.ltCalls.Load()-calls)
				fmt.Println(line)
			}
		}
		for _, buf := range bufs {
			b.Free(buf)
		}
	}
	if err := b.blas.SetTF32(false); err != nil {
		t.Fatal(err)
	}
}

// benchLinear is the median time per call of f (see TestGPULinearPathsBench).
func benchLinear(t *testing.T, b *Backend, f func()) time.Duration {
	sync := func() {
		if err := b.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		f()
	}
	sync()
	start := time.Now()
	f()
	sync()
	k := max(1, min(500, int(2*time.Millisecond/max(time.Since(start), time.Microsecond))))
	samples := make([]time.Duration, 15)
	for i := range samples {
		start := time.Now()
		for range k {
			f()
		}
		sync()
		samples[i] = time.Since(start) / time.Duration(k)
	}
	slices.Sort(samples)
	return samples[len(samples)/2]
}

// TestGPULinearLtNaN: a NaN in x makes its row of y NaN through the ReLU
// epilogue too, as tensor.LinearBackend promises (ReLU keeps NaN).
func TestGPULinearLtNaN(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{LinearLt: true})
	requireLt(t, b)
	c := linearCase{n: 300, in: 64, out: 32, relu: true, bias: true}
	x := gridRandom(c.n*c.in, 1)
	x[0] = float32(math.NaN())
	var got [][]float32
	calls := b.ltCalls.Load()
	withPath(b, "lt", func() {
		got = runLinear(t, b, c, x, gridRandom(c.out*c.in, 2), gridRandom(c.out, 3), gridRandom(c.n*c.out, 4), gridRandom)
	})
	if b.ltCalls.Load() == calls {
		t.Fatal("no cuBLASLt product: the layer took the fallback")
	}
	for j, v := range got[0][:c.out] {
		if !math.IsNaN(float64(v)) {
			t.Fatalf("y[0][%d] = %g with x[0][0] NaN, want NaN", j, v)
		}
	}
}

// TestGPULinearLowpMatchesUnfused checks autocast's linear layer with the
// bias in cuBLASLt's epilogue (LinearLowp) against the unfused path on the
// same bfloat16 operands: MatMulLowp and AddBias on the GPU, and on the
// CPU. All three sum the same exact products in float32 in their own
// orders and add the bias once, so they differ by at most three times
// (k+2)·2⁻²⁴ of Σ|x·w| plus one rounding of the sum with the bias (as in
// TestGPUGemmBF16MatchesCPU). The GPT's shapes (in 384, out 1152 and
// 1536) must go through cuBLASLt; odd ones may fall back.
func TestGPULinearLowpMatchesUnfused(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	requireLt(t, b)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct {
		n, in, out int
		mustLt     bool
	}{
		{300, 384, 1152, true},
		{256, 1536, 384, true},
		{64, 96, 40, true},
		{33, 130, 66, false},
	} {
		bitsX, bitsW := make([]uint16, c.n*c.in), make([]uint16, c.out*c.in)
		for i := range bitsX {
			bitsX[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
		}
		for i := range bitsW {
			bitsW[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
		}
		bias := make([]float32, c.out)
		for i := range bias {
			bias[i] = float32(rng.NormFloat64())
		}
		// unfused on the CPU and the GPU, then fused on the GPU.
		var got [3][]float32
		for i, be := range []tensor.Backend{tensor.CPU, b, b} {
			s := tensor.NewScope()
			x, w := tensor.FromBFloat16Bits(be, s, bitsX, c.n, c.in), tensor.FromBFloat16Bits(be, s, bitsW, c.out, c.in)
			tb, y := tensor.FromFloat32(be, s, bias, c.out), tensor.Zeros(be, s, c.n, c.out)
			if i < 2 {
				be.(tensor.LowPrecisionBackend).MatMulLowp(y.Buffer(), x.Buffer(), w.Buffer(), c.n, c.out, c.in, false, true, 1, 0)
				tensor.Complete(be).AddBias(y.Buffer(), tb.Buffer(), c.n, c.out, 1)
			} else {
				calls := b.ltCalls.Load()
				if !b.LinearLowp(y.Buffer(), x.Buffer(), w.Buffer(), tb.Buffer(), c.n, c.in, c.out) {
					if c.mustLt {
						t.Fatalf("%+v: cuBLASLt declined the product", c)
					}
					t.Logf("%+v: cuBLASLt declined; the unfused path takes it", c)
					s.Release()
					got[i] = nil
					continue
				}
				if b.ltCalls.Load() == calls {
					t.Fatalf("%+v: LinearLowp reported true without a cuBLASLt product", c)
				}
			}
			got[i] = y.Float32s()
			s.Release()
		}
		for i := 0; i < c.n; i++ {
			for j := 0; j < c.out; j++ {
				bound := 0.0
				for p := 0; p < c.in; p++ {
					bound += math.Abs(float64(tensor.BFloat16Float32(bitsX[i*c.in+p])) * float64(tensor.BFloat16Float32(bitsW[j*c.in+p])))
				}
				at := i*c.out + j
				tol := 3*float64(c.in+2)*0x1p-24*bound + 0x1p-23*(bound+math.Abs(float64(bias[j])))
				for k, name := range []string{"GPU unfused", "GPU fused"} {
					if g := got[k+1]; g != nil && math.Abs(float64(g[at])-float64(got[0][at])) > tol {
						t.Fatalf("%+v: element [%d, %d]: %s %.9g, CPU %.9g, allowed %.3g", c, i, j, name, g[at], got[0][at], tol)
					}
				}
			}
		}
	}
}

// TestGPULinearLowpCast checks autocast's linear layer with a bfloat16
// result (LinearLowpCast: cuBLASLt rounding its float32 sums plus the
// bfloat16 bias as it writes them) against LinearLowp's float32 result
// with that bias, rounded by Cast: the two sum in their own orders, so an
// element may round to the neighbouring bfloat16 value, never further.
// The GPT's projections (in 384, out 1152, with and without the bias)
// must go through cuBLASLt.
func TestGPULinearLowpCast(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	requireLt(t, b)
	rng := rand.New(rand.NewPCG(9, 10))
	for _, c := range []struct {
		n, in, out int
		bias       bool
		mustLt     bool
	}{
		{16384, 384, 1152, true, true},
		{300, 384, 1152, false, true},
		{33, 130, 66, true, false},
	} {
		bitsX, bitsW := make([]uint16, c.n*c.in), make([]uint16, c.out*c.in)
		for i := range bitsX {
			bitsX[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
		}
		for i := range bitsW {
			bitsW[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
		}
		bias := make([]float32, c.out) // bfloat16 values
		for i := range bias {
			bias[i] = tensor.BFloat16Float32(tensor.BFloat16Bits(float32(rng.NormFloat64())))
		}
		s := tensor.NewScope()
		x, w := tensor.FromBFloat16Bits(b, s, bitsX, c.n, c.in), tensor.FromBFloat16Bits(b, s, bitsW, c.out, c.in)
		tb, y := tensor.FromFloat32(b, s, bias, c.out), tensor.Zeros(b, s, c.n, c.out)
		var hb tensor.Buffer
		if c.bias {
			hb = tensor.Cast(tb, tensor.BFloat16).Buffer()
			if !b.LinearLowp(y.Buffer(), x.Buffer(), w.Buffer(), tb.Buffer(), c.n, c.in, c.out) {
				t.Fatalf("%+v: cuBLASLt declined the float32 product", c)
			}
		} else {
			b.MatMulLowp(y.Buffer(), x.Buffer(), w.Buffer(), c.n, c.out, c.in, false, true, 1, 0)
		}
		h := tensor.Cast(tensor.Zeros(b, s, c.n, c.out), tensor.BFloat16)
		if !b.LinearLowpCast(h.Buffer(), x.Buffer(), w.Buffer(), hb, c.n, c.in, c.out) {
			if c.mustLt {
				t.Fatalf("%+v: cuBLASLt declined the product with a bfloat16 result", c)
			}
			t.Logf("%+v: cuBLASLt declined; LinearHalf casts the float32 result", c)
			s.Release()
			continue
		}
		want, got := y.Float32s(), tensor.Cast(h, tensor.Float32).Float32s()
		differ := 0
		for i, f := range want {
			r := tensor.BFloat16Float32(tensor.BFloat16Bits(f))
			if got[i] == r {
				continue
			}
			differ++
			if ulp := math.Abs(float64(r)) * 0x1p-7; math.Abs(float64(got[i])-float64(r)) > ulp {
				t.Fatalf("%+v: element %d: %.9g, the float32 result %.9g rounds to %.9g: more than one bfloat16 step apart", c, i, got[i], f, r)
			}
		}
		t.Logf("%+v: %d of %d elements round to the neighbouring bfloat16 value", c, differ, len(want))
		s.Release()
	}
}
