package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// skinnyCases are layers the skinny kernels take (at most 64 rows, in·out
// from 2^19): the MLP's at batch 64, fewer rows than a tile, a k longer
// than one piece of shared memory (1500: two pieces a block), a k whose
// last block gets no terms (1028 over 8 blocks of 132), columns that end
// inside a tile, and accumulating gradients.
var skinnyCases = []linearCase{
	{n: 64, in: 784, out: 1024, relu: true, bias: true, dx: true, dw: true, db: true},
	{n: 64, in: 1024, out: 1024, relu: true, bias: true, dx: true, dw: true, db: true},
	{n: 1, in: 1024, out: 1024, bias: true, dx: true, dw: true},
	{n: 37, in: 1500, out: 700, relu: true, bias: true, dx: true, dw: true, db: true, accX: true},
	{n: 64, in: 1028, out: 516, dx: true, accX: true},
	{n: 17, in: 516, out: 1028, relu: true, dx: true, dw: true, accW: true},
	{n: 64, in: 512, out: 2048, bias: true, dx: true},
}

// TestGPULinearSkinnyMatchesCuBLAS runs skinnyCases through the skinny
// kernels and through cuBLASLt and cuBLAS (the paths they replace), on
// inputs whose sums are exact in any order (gridRandom), and wants the same
// bits: the kernels' sums, splits, zero fills, epilogues and accumulation. It wants
// the skinny kernels to have run a product in each case (so the comparison
// did not run the fallback twice).
func TestGPULinearSkinnyMatchesCuBLAS(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	requireLt(t, b)
	requireSkinny(t, b)
	for _, c := range skinnyCases {
		x, w, bias, g := gridRandom(c.n*c.in, 1), gridRandom(c.out*c.in, 2), gridRandom(c.out, 3), gridRandom(c.n*c.out, 4)
		var ref, got [][]float32
		withPath(b, "lt", func() { ref = runLinear(t, b, c, x, w, bias, g, gridRandom) })
		calls := b.skinnyCalls.Load()
		withPath(b, "skinny", func() { got = runLinear(t, b, c, x, w, bias, g, gridRandom) })
		if want := int64(1 + btoi(c.dx)); b.skinnyCalls.Load()-calls != want {
			t.Errorf("%v: %d skinny products, want %d", c, b.skinnyCalls.Load()-calls, want)
		}
		for i := range ref {
			if !sameBits(got[i], ref[i]) {
				j := firstDiff(got[i], ref[i])
				t.Errorf("%v: result %d (y, then the gradients wanted) differs from cuBLASLt's and cuBLAS's: [%d] %g, want %g", c, i, j, got[i][j], ref[i][j])
			}
		}
	}
}

// TestGPULinearSkinnyMatchesCPU runs skinnyCases through the skinny kernels
// on fresh random inputs (uniform in [-1, 1), a new seed each run, logged)
// and compares y and the gradients with the CPU backend's: |got - want| <=
// 1e-4·(1 + |want|), as for cuBLASLt's FP32 products (sums of up to 1500
// terms of about 0.25 each; float32 rounding gives about 1e-5 of them).
func TestGPULinearSkinnyMatchesCPU(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	requireLt(t, b)
	requireSkinny(t, b)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 64))
	uniform := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 2*rng.Float32() - 1
		}
		return v
	}
	const tol = 1e-4
	for _, c := range skinnyCases {
		x, w, bias, g := uniform(c.n*c.in), uniform(c.out*c.in), uniform(c.out), uniform(c.n*c.out)
		starts := map[uint32][]float32{5: uniform(c.n * c.in), 6: uniform(c.out * c.in), 7: uniform(c.out)}
		start := func(n int, seed uint32) []float32 { return starts[seed][:n] }
		var got [][]float32
		calls := b.skinnyCalls.Load()
		withPath(b, "skinny", func() { got = runLinear(t, b, c, x, w, bias, g, start) })
		if b.skinnyCalls.Load() == calls {
			t.Errorf("%v: no skinny product: the layer took the fallback", c)
		}
		want := cpuLinear(c, x, w, bias, g, got[0], starts)
		for i := range want {
			for j := range want[i] {
				if d := math.Abs(float64(got[i][j]) - want[i][j]); !(d <= tol*(1+math.Abs(want[i][j]))) {
					t.Errorf("%v: result %d [%d] = %g, want %g (CPU)", c, i, j, got[i][j], want[i][j])
					break
				}
			}
		}
	}
}

// requireSkinny skips (fails with EMBER_REQUIRE_GPU=1 on sm_90 and later)
// where the skinny kernels do not run.
func requireSkinny(t testing.TB, b *Backend) {
	t.Helper()
	if b.skinnyReady() {
		return
	}
	major, _ := b.dev.ComputeCapability()
	if major >= 9 && os.Getenv("EMBER_REQUIRE_GPU") == "1" {
		t.Fatal("the skinny kernels did not load on an sm_90 device")
	}
	t.Skip("no skinny kernels on this device (they need thread block clusters, sm_90)")
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}
