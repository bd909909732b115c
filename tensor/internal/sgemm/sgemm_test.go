package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// shape is one product: C (m×n) = op(A) (m×k) · op(B) (k×n).
type shape struct {
	transA, transB bool
	m, n, k        int
}

func (s shape) String() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%s%s_%dx%dx%d", t(s.transA), t(s.transB), s.m, s.n, s.k)
}

// lenetShapes are the products of a LeNet training step at batch 64: the
// convolutions as GEMMs over im2col matrices and the dense layers, forward
// and backward.
var lenetShapes = []shape{
	{false, false, 20, 36864, 25}, // conv1 forward
	{false, false, 50, 4096, 500}, // conv2 forward
	{false, true, 50, 500, 4096},  // conv2 weight gradient
	{true, false, 500, 4096, 50},  // conv2 input gradient
	{false, true, 64, 500, 800},   // dense1 forward
	{true, false, 500, 800, 64},   // dense1 weight gradient
	{false, false, 64, 800, 500},  // dense1 input gradient
}

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// problem is a random instance of a shape with leading dimensions padded by
// pad, plus the float64 reference result.
type problem struct {
	shape
	alpha, beta   float32
	a, b, c       []float32
	lda, ldb, ldc int
}

func newProblem(rng *rand.Rand, s shape, alpha, beta float32, pad int) *problem {
	p := &problem{shape: s, alpha: alpha, beta: beta}
	ar, ac := s.m, s.k
	if s.transA {
		ar, ac = s.k, s.m
	}
	br, bc := s.k, s.n
	if s.transB {
		br, bc = s.n, s.k
	}
	p.lda, p.ldb, p.ldc = ac+pad, bc+pad, s.n+pad
	p.a = randSlice(rng, ar*p.lda)
	p.b = randSlice(rng, br*p.ldb)
	if beta == 0 {
		p.c = make([]float32, s.m*p.ldc)
		for i := range p.c {
			p.c[i] = float32(math.NaN())
		}
	} else {
		p.c = randSlice(rng, s.m*p.ldc)
	}
	return p
}

func (p *problem) opA(i, k int) float32 {
	if p.transA {
		return p.a[k*p.lda+i]
	}
	return p.a[i*p.lda+k]
}

func (p *problem) opB(k, j int) float32 {
	if p.transB {
		return p.b[j*p.ldb+k]
	}
	return p.b[k*p.ldb+j]
}

// check runs Sgemm on a copy of C, with the assembly micro-kernel (where
// the CPU has one) and with the pure-Go one, and compares every element
// with a float64 triple loop. The products are exact in float64 and the
// float64 sum is far more accurate than float32's, so the difference is the
// float32 rounding of the k-term accumulation, which is bounded by a small
// multiple of k·2⁻²⁴·Σ_k|a_ik||b_kj| in the worst case and grows like
// √k·2⁻²⁴ times that for random signs; even for k = 4096, 1e-5 of Σ|a||b|
// leaves a margin over √k·2⁻²⁴ ≈ 4e-6. The beta·C term adds one more
// rounding, covered by 1e-5·|beta·c|, and 1e-6 absorbs cancellation to
// near zero. check also makes sure that the padding columns of C are left
// alone.
func (p *problem) check(t *testing.T) {
	t.Helper()
	want, tol := p.reference()
	saved := useAsm
	defer func() { useAsm = saved }()
	for _, asm := range []bool{true, false} {
		if asm && !hasAVX2FMA {
			continue
		}
		useAsm = asm
		name := "asm"
		if !asm {
			name = "pure Go"
		}
		got := append([]float32(nil), p.c...)
		Sgemm(p.transA, p.transB, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, got, p.ldc)
		bad := 0
		for i := 0; i < p.m; i++ {
			for j := 0; j < p.ldc; j++ {
				g := got[i*p.ldc+j]
				if j >= p.n {
					if math.Float32bits(g) != math.Float32bits(p.c[i*p.ldc+j]) {
						t.Fatalf("%s %v: C[%d][%d] outside the %d×%d result changed", name, p.shape, i, j, p.m, p.n)
					}
					continue
				}
				w, e := want[i*p.n+j], tol[i*p.n+j]
				if d := math.Abs(float64(g) - w); !(d <= e) {
					if bad++; bad <= 5 {
						t.Errorf("%s %v alpha=%v beta=%v ld+%d: C[%d][%d] = %v, want %v (diff %.3g, tol %.3g)",
							name, p.shape, p.alpha, p.beta, p.ldc-p.n, i, j, g, w, d, e)
					}
				}
			}
		}
		if bad > 5 {
			t.Fatalf("%s %v: %d elements wrong", name, p.shape, bad)
		}
	}
}

// reference returns alpha·op(A)·op(B) + beta·C computed in float64 and the
// tolerance for each element (m×n, row-major).
func (p *problem) reference() (want, tol []float64) {
	at := make([]float64, p.m*p.k) // op(A), m×k
	for i := 0; i < p.m; i++ {
		for k := 0; k < p.k; k++ {
			at[i*p.k+k] = float64(p.opA(i, k))
		}
	}
	bt := make([]float64, p.n*p.k) // op(B) transposed, n×k
	for j := 0; j < p.n; j++ {
		for k := 0; k < p.k; k++ {
			bt[j*p.k+k] = float64(p.opB(k, j))
		}
	}
	want = make([]float64, p.m*p.n)
	tol = make([]float64, p.m*p.n)
	alpha, beta := float64(p.alpha), float64(p.beta)
	for i := 0; i < p.m; i++ {
		ai := at[i*p.k : i*p.k+p.k]
		for j := 0; j < p.n; j++ {
			bj := bt[j*p.k : j*p.k+p.k]
			var s0, s1, a0, a1 float64
			k := 0
			for ; k+1 < len(ai); k += 2 {
				x0, x1 := ai[k]*bj[k], ai[k+1]*bj[k+1]
				s0, s1 = s0+x0, s1+x1
				a0, a1 = a0+math.Abs(x0), a1+math.Abs(x1)
			}
			if k < len(ai) {
				x := ai[k] * bj[k]
				s0, a0 = s0+x, a0+math.Abs(x)
			}
			w := alpha * (s0 + s1)
			e := 1e-5*math.Abs(alpha)*(a0+a1) + 1e-6
			if beta != 0 {
				bc := beta * float64(p.c[i*p.ldc+j])
				w += bc
				e += 1e-5 * math.Abs(bc)
			}
			want[i*p.n+j], tol[i*p.n+j] = w, e
		}
	}
	return want, tol
}

var transposes = [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}}

// alphaBetas are the scalings each shape is tried with: beta 0 (over a
// NaN-filled C), beta 1 and a general alpha and beta.
var alphaBetas = [][2]float32{{1, 0}, {1, 1}, {0.5, -1.5}}

// TestShapes checks both micro-kernels on all the edge sizes.
func TestShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 5, 7, 16, 17, 33, 100, 257}
	for _, tr := range transposes {
		for _, m := range sizes {
			for _, n := range sizes {
				for _, k := range sizes {
					if m >= 100 && n >= 100 && k >= 100 {
						continue // done below, once
					}
					s := shape{tr[0], tr[1], m, n, k}
					ab := alphaBetas[(m+n+k)%len(alphaBetas)]
					pad := (m + 2*n + 3*k) % 4 // ld = width + 0..3
					newProblem(rng, s, ab[0], ab[1], pad).check(t)
				}
			}
		}
	}
	for _, s := range []shape{
		{false, false, 1, 1, 1},
		{false, false, 6, 16, 256},
		{true, true, 257, 257, 257},
		{false, true, 150, 4100, 300}, // two blocks of m (mc) and of n (nc)
		{true, false, 100, 100, 600},  // three blocks of k (kc)
	} {
		for i, ab := range alphaBetas {
			newProblem(rng, s, ab[0], ab[1], 5*(i%2)).check(t)
		}
	}
}

// TestLeNetShapes checks both micro-kernels on the LeNet products, with
// padded leading dimensions for every other one.
func TestLeNetShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i, s := range lenetShapes {
		ab := alphaBetas[i%len(alphaBetas)]
		newProblem(rng, s, ab[0], ab[1], i%2).check(t)
	}
}

// TestKernels compares the assembly micro-kernels with the Go one
// directly, for every row count, including a B with k steps more than 64
// bytes apart, beta 0 over NaN, and C rows wider than the tile.
func TestKernels(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no assembly kernel")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	const ldc = 20
	for _, kb := range []int{0, 1, 3, 4, 5, 255, 256} {
		for _, bs := range []int{nr, nr + 3} {
			for _, beta := range []float32{0, 1, -0.5} {
				a := randSlice(rng, max(1, kb*mr))
				b := randSlice(rng, max(1, kb*bs))
				c0 := randSlice(rng, mr*ldc)
				if beta == 0 {
					for i := range c0 {
						c0[i] = float32(math.NaN())
					}
				}
				for rows := 1; rows <= mr; rows++ {
					want := append([]float32(nil), c0...)
					kernelGeneric(kb, rows, &a[0], &b[0], 4*bs, &want[0], ldc, 0.75, beta)
					kernels := []struct {
						name string
						f    func(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32)
					}{{"6×16", kernel6x16}, {"4×16", kernel4x16}}
					for _, k := range kernels {
						if k.name == "4×16" && rows > 4 {
							continue
						}
						got := append([]float32(nil), c0...)
						k.f(kb, rows, &a[0], &b[0], 4*bs, &got[0], ldc, 0.75, beta)
						for i, g := range got {
							w := want[i]
							if i >= rows*ldc || i%ldc >= nr {
								w = c0[i] // outside the tile
							}
							d := math.Abs(float64(g - w))
							if !(d <= 1e-4*(1+math.Abs(float64(w)))) && !(math.IsNaN(float64(g)) && math.IsNaN(float64(w))) {
								t.Fatalf("%s kb=%d rows=%d bstride=%d beta=%v: element %d: asm %v, want %v",
									k.name, kb, rows, bs, beta, i, g, w)
							}
						}
					}
				}
			}
		}
	}
}

// TestPacking compares the assembly and Go packing of whole blocks, edges
// included, and checks that neither writes past the packed block.
func TestPacking(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no assembly packing")
	}
	saved := useAsm
	defer func() { useAsm = saved }()
	rng := rand.New(rand.NewPCG(9, 10))
	const ld = 300
	src := randSlice(rng, ld*ld)
	for _, trans := range []bool{false, true} {
		for _, kb := range []int{1, 7, 8, 9, 16, 23, 256} {
			for _, width := range []int{1, 4, 6, 16, 17, 40} {
				var bufs [2][2][]float32 // [asm, Go][A, B]
				for i, asm := range []bool{true, false} {
					useAsm = asm
					pa := make([]float32, ceilDiv(width, mr)*mr*kb+1)
					pb := make([]float32, ceilDiv(width, nr)*nr*kb+1)
					pa[len(pa)-1], pb[len(pb)-1] = 42, 42
					packA(trans, src, ld, 3, 5, width, kb, pa)
					packB(trans, src, ld, 5, 3, kb, width, pb)
					if pa[len(pa)-1] != 42 || pb[len(pb)-1] != 42 {
						t.Fatalf("asm=%v trans=%v kb=%d width=%d: wrote past the block", asm, trans, kb, width)
					}
					bufs[i] = [2][]float32{pa, pb}
				}
				for w, name := range []string{"A", "B"} {
					for j, v := range bufs[0][w] {
						if v != bufs[1][w][j] {
							t.Fatalf("trans=%v kb=%d width=%d: packed %s[%d]: asm %v, Go %v", trans, kb, width, name, j, v, bufs[1][w][j])
						}
					}
				}
			}
		}
	}
}

// TestParallelGrids forces more goroutines than cores, so that the products
// are split over grids of blocks in both dimensions.
func TestParallelGrids(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	rng := rand.New(rand.NewPCG(7, 8))
	for _, p := range []int{1, 3, 4, 7, 16} {
		runtime.GOMAXPROCS(p)
		for _, s := range []shape{{false, false, 300, 300, 64}, {true, true, 31, 1000, 40}, {false, true, 1000, 20, 90}, {true, false, 97, 97, 97}} {
			newProblem(rng, s, 0.5, 1, 2).check(t)
		}
	}
}

// TestSpecial covers alpha == 0 and k == 0 (C = beta*C, A and B unread),
// empty results, and rejected arguments.
func TestSpecial(t *testing.T) {
	nan := float32(math.NaN())
	a := []float32{nan, nan, nan, nan}
	c := []float32{1, 2, 3, 4}
	Sgemm(false, false, 2, 2, 2, 0, a, 2, a, 2, 2, c, 2)
	if c[0] != 2 || c[1] != 4 || c[2] != 6 || c[3] != 8 {
		t.Errorf("alpha=0, beta=2: C = %v, want [2 4 6 8]", c)
	}
	Sgemm(false, false, 2, 2, 0, 1, nil, 1, nil, 2, 0, []float32{nan, nan, nan, nan}, 2)
	c = []float32{nan, nan, nan, nan}
	Sgemm(true, true, 2, 2, 0, 1, nil, 2, nil, 1, 0, c, 2)
	for _, v := range c {
		if v != 0 {
			t.Errorf("k=0, beta=0: C = %v, want zeros", c)
		}
	}
	Sgemm(false, false, 0, 5, 5, 1, nil, 5, make([]float32, 25), 5, 0, nil, 5)

	for name, f := range map[string]func(){
		"negative m": func() { Sgemm(false, false, -1, 1, 1, 1, a, 1, a, 1, 0, c, 1) },
		"small lda":  func() { Sgemm(false, false, 2, 2, 2, 1, a, 1, a, 2, 0, c, 2) },
		"short B":    func() { Sgemm(false, true, 2, 2, 2, 1, a, 2, a[:3], 2, 0, c, 2) },
		"short C":    func() { Sgemm(false, false, 2, 2, 2, 1, a, 2, a, 2, 0, c[:3], 2) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
