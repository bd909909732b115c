package cuda

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/cuda/driver"
	"github.com/ember-ml/ember/tensor"
)

// TestGPULtCandidatesBench times every algorithm cuBLASLt's heuristics
// rank (driver.Lt.Candidates, up to 16) for the products of the MLP
// 784-1024-1024-10 at batch 64, and the cuBLAS products those layers take
// today where they do not go to cuBLASLt: does timing the candidates, as
// cuDNN's searches do for convolutions, find faster ones than the
// heuristics' first? Each time is per product, from a captured graph of
// ltBenchCalls products replayed (the gaps between them are a captured
// step's), the median of 11 samples. It runs only with
// EMBER_LT_CANDIDATES=1 and prints one line per algorithm;
// EMBER_LT_CANDIDATES_PREC=tf32 times the TF32 products instead, =bf16
// the bfloat16 ones (bfloat16 operands, float32 results), as autocast
// would run them.
func TestGPULtCandidatesBench(t *testing.T) {
	if os.Getenv("EMBER_LT_CANDIDATES") != "1" {
		t.Skip("EMBER_LT_CANDIDATES=1 times cuBLASLt's candidate algorithms")
	}
	prec := os.Getenv("EMBER_LT_CANDIDATES_PREC")
	b := newGPUBackend(t, BackendOptions{TF32: prec == "tf32"})
	requireLt(t, b)
	lx, ok := b.x.(ltExec)
	if !ok {
		t.Skip("the backend's executor queues no cuBLASLt products")
	}
	buf := func(n int, seed uint32) uintptr {
		v, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		b.Upload(v, pseudoRandom(n, seed))
		t.Cleanup(func() { b.Free(v) })
		return b.f32("bench", v)
	}
	// in is an operand of the products: bfloat16 when timing those.
	in := buf
	if prec == "bf16" {
		in = func(n int, seed uint32) uintptr {
			v, err := b.Alloc(n, tensor.BFloat16)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Free(v) })
			return b.ptr("bench", v, tensor.BFloat16)
		}
	}
	const n = 64
	x1, w1, b1, h1 := in(n*784, 1), in(1024*784, 2), buf(1024, 3), in(n*1024, 4)
	w2, b2, h2 := in(1024*1024, 5), buf(1024, 6), buf(n*1024, 7)
	g2, d1, dw1, dw2, db := in(n*1024, 8), in(n*1024, 9), buf(1024*784, 10), buf(1024*1024, 11), buf(1024, 12)
	out := buf(n*1024, 13)
	type product struct {
		name           string
		g              LtGemm
		a, bb, c, bias uintptr
		cublas         func() // the path the layer takes today, when not cuBLASLt
	}
	dwGemm := func(in int, epi driver.LtEpilogue, noWS bool) LtGemm {
		g := weightGradGemm(n, in, 1024, epi)
		g.NoWorkspace = noWS
		return g
	}
	products := []product{
		{name: "fc1 forward 64x784->1024 relu+bias", g: LtGemm{TransB: true, M: n, N: 1024, K: 784, LDA: 784, LDB: 784, LDC: 1024, Epilogue: driver.LtReLUBias},
			a: x1, bb: w1, c: h1, bias: b1},
		{name: "fc2 forward 64x1024->1024 relu+bias", g: LtGemm{TransB: true, M: n, N: 1024, K: 1024, LDA: 1024, LDB: 1024, LDC: 1024, Epilogue: driver.LtReLUBias},
			a: h1, bb: w2, c: h2, bias: b2},
		{name: "fc2 dx 64x1024 = g·w", g: LtGemm{M: n, N: 1024, K: 1024, LDA: 1024, LDB: 1024, LDC: 1024},
			a: g2, bb: w2, c: d1, cublas: func() { b.product("bench", d1, g2, w2, n, 1024, 1024, false, false) }},
		{name: "fc2 dw 1024x1024 = gᵀ·h1 (side lane, no workspace)", g: dwGemm(1024, driver.LtDefault, true),
			a: g2, bb: h1, c: dw2},
		{name: "fc2 dw+db (side lane, no workspace)", g: dwGemm(1024, driver.LtBGradA, true),
			a: g2, bb: h1, c: dw2, bias: db},
		{name: "fc1 dw 1024x784 = gᵀ·x", g: dwGemm(784, driver.LtDefault, false),
			a: d1, bb: x1, c: dw1, cublas: func() { b.product("bench", dw1, d1, x1, 1024, 784, n, true, false) }},
		{name: "fc1 dw+db", g: dwGemm(784, driver.LtBGradA, false), a: d1, bb: x1, c: dw1, bias: db},
	}
	for _, p := range products {
		if prec == "bf16" {
			// The operands are bfloat16 (their values do not matter for
			// the time); the float32 cuBLAS path is not comparable.
			p.g.BF16, p.cublas = true, nil
			if p.c == h1 || p.c == d1 {
				p.c = out // a float32 result
			}
		}
		g, ok := b.ltPlan(p.g, p.a, p.bb, p.c, p.bias)
		if !ok {
			t.Logf("%s: cuBLASLt has no plan", p.name)
			continue
		}
		cands, err := b.lt.Candidates(g, 16)
		if err != nil {
			t.Fatal(err)
		}
		if p.cublas != nil {
			t.Logf("%-52s cuBLAS today      %7.2f µs", p.name, us(graphTime(t, b, p.cublas)))
		}
		for i, c := range cands {
			if err := b.lt.Use(g, i); err != nil {
				t.Fatal(err)
			}
			d := graphTime(t, b, func() { devCheck("bench", lx.ltMatmul(g, 1, p.a, p.bb, 0, p.c, p.bias, 0)) })
			t.Logf("%-52s candidate %2d     %7.2f µs (workspace %d, waves %.2f)", p.name, i, us(d), c.Workspace, c.Waves)
		}
		if err := b.lt.Use(g, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// ltBenchCalls is the products in one graph of TestGPULtCandidatesBench.
const ltBenchCalls = 20

// graphTime is the time per call of f from a captured graph of
// ltBenchCalls calls, the median of 11 samples of 5 replays.
func graphTime(t *testing.T, b *Backend, f func()) time.Duration {
	t.Helper()
	g, err := b.Capture(func() {
		for range ltBenchCalls {
			f()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	run := func(k int) time.Duration {
		start := time.Now()
		for range k {
			if err := g.Replay(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Synchronize(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	run(3)
	samples := make([]time.Duration, 11)
	for i := range samples {
		samples[i] = run(5) / (5 * ltBenchCalls)
	}
	slices.Sort(samples)
	return samples[len(samples)/2]
}

func us(d time.Duration) float64 { return d.Seconds() * 1e6 }

// TestGPULtTuneKeepsOutputs runs ltCases with every layer on cuBLASLt,
// once on a backend that times each shape's candidate algorithms on its
// first call (linear_lt_tune.go) and once on one that keeps the
// heuristics' picks, on inputs whose sums are exact in any order
// (gridRandom): the same bits, so the timing runs (into scratch outputs,
// ten products a candidate, some of them adding into dw) left the
// caller's outputs alone. It checks that the timing ran.
func TestGPULtTuneKeepsOutputs(t *testing.T) {
	var log strings.Builder
	tuned := newGPUBackend(t, BackendOptions{LinearLtEverywhere: true, KernelLog: &syncWriter{w: &log}})
	plain := newGPUBackend(t, BackendOptions{LinearLtEverywhere: true, NoTuneProducts: true})
	requireLt(t, tuned)
	for _, c := range ltCases {
		x, w, bias, g := gridRandom(c.n*c.in, 1), gridRandom(c.out*c.in, 2), gridRandom(c.out, 3), gridRandom(c.n*c.out, 4)
		want := runLinear(t, plain, c, x, w, bias, g, gridRandom)
		got := runLinear(t, tuned, c, x, w, bias, g, gridRandom)
		for i := range want {
			if !sameBits(got[i], want[i]) {
				j := firstDiff(got[i], want[i])
				t.Errorf("%v: result %d (y, then the gradients wanted) differs with the algorithms timed: [%d] %g, want %g", c, i, j, got[i][j], want[i][j])
			}
		}
	}
	if n := strings.Count(log.String(), "cuBLASLt algorithm of"); n == 0 {
		t.Errorf("no product shape was timed; kernel log:\n%s", log.String())
	} else {
		t.Logf("%d shapes timed:\n%s", n, log.String())
	}
}
