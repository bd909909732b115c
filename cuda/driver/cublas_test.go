package driver

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// colMajorSgemm is a reference of what cublasSgemm computes, following the
// BLAS definition literally: column-major matrices, element (i, j) of X at
// X[i + j*ldX], C = alpha*op(A)*op(B) + beta*C with op(A) m x k.
// "first" and "second" are the operand arrays as passed to cuBLAS.
func colMajorSgemm(transa, transb, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	at := func(i, l int) float64 { // op(A)(i, l)
		if transa == cublasOpT {
			return a[l+i*lda]
		}
		return a[i+l*lda]
	}
	bt := func(l, j int) float64 { // op(B)(l, j)
		if transb == cublasOpT {
			return b[j+l*ldb]
		}
		return b[l+j*ldb]
	}
	for j := 0; j < n; j++ {
		for i := 0; i < m; i++ {
			var s float64
			for l := 0; l < k; l++ {
				s += at(i, l) * bt(l, j)
			}
			c[i+j*ldc] = alpha*s + beta*c[i+j*ldc]
		}
	}
}

// rowMajorProduct computes the expected row-major result directly, and the
// per-element error scale alpha*sum_l |op(A)_il||op(B)_lj| + |beta*C_ij|.
func rowMajorProduct(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) (want, scale []float64) {
	want = append([]float64(nil), c...)
	scale = make([]float64, len(c))
	opA := func(i, l int) float64 {
		if transA {
			return a[l*lda+i] // A stored k x m
		}
		return a[i*lda+l] // A stored m x k
	}
	opB := func(l, j int) float64 {
		if transB {
			return b[j*ldb+l] // B stored n x k
		}
		return b[l*ldb+j] // B stored k x n
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, sa float64
			for l := 0; l < k; l++ {
				p := opA(i, l) * opB(l, j)
				s += p
				sa += math.Abs(p)
			}
			want[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			scale[i*ldc+j] = math.Abs(alpha)*sa + math.Abs(beta*c[i*ldc+j])
		}
	}
	return want, scale
}

type gemmCase struct {
	transA, transB bool
	m, n, k        int
	pad            int // extra leading-dimension padding
}

func gemmCases() []gemmCase {
	var cs []gemmCase
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			for _, sz := range [][3]int{{37, 53, 71}, {1, 29, 5}, {64, 1, 17}, {13, 7, 1}} {
				for _, pad := range []int{0, 3} {
					cs = append(cs, gemmCase{ta, tb, sz[0], sz[1], sz[2], pad})
				}
			}
		}
	}
	return cs
}

// gemmData makes random row-major operands for a case (in float32-exact
// values) with the storage shapes Sgemm documents.
func gemmData(c gemmCase, r *rand.Rand) (a []float64, lda int, b []float64, ldb int, cm []float64, ldc int) {
	aRows, aCols := c.m, c.k
	if c.transA {
		aRows, aCols = c.k, c.m
	}
	bRows, bCols := c.k, c.n
	if c.transB {
		bRows, bCols = c.n, c.k
	}
	lda, ldb, ldc = aCols+c.pad, bCols+c.pad, c.n+c.pad
	fill := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = float64(float32(r.Float64()*2 - 1))
		}
		return x
	}
	return fill(aRows * lda), lda, fill(bRows * ldb), ldb, fill(c.m * ldc), ldc
}

// TestRowMajorGemmMapping checks the operand swap on the CPU: feeding the
// row-major arrays to a literal column-major GEMM with the mapped arguments
// must give the row-major product.
func TestRowMajorGemmMapping(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range gemmCases() {
		a, lda, b, ldb, cm, ldc := gemmData(c, r)
		const alpha, beta = 1.5, -0.5
		want, _ := rowMajorProduct(c.transA, c.transB, c.m, c.n, c.k, alpha, a, lda, b, ldb, beta, cm, ldc)
		g, err := rowMajorGemm(c.transA, c.transB, c.m, c.n, c.k, lda, ldb, ldc)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		got := append([]float64(nil), cm...)
		// First operand B, second A, as Sgemm passes them.
		colMajorSgemm(g.transa, g.transb, g.m, g.n, g.k, alpha, b, g.lda, a, g.ldb, beta, got, g.ldc)
		for i := 0; i < c.m; i++ {
			for j := 0; j < c.n; j++ {
				if d := math.Abs(got[i*ldc+j] - want[i*ldc+j]); d > 1e-12 {
					t.Fatalf("%+v: C[%d][%d] = %v, want %v", c, i, j, got[i*ldc+j], want[i*ldc+j])
				}
			}
			for j := c.n; j < ldc; j++ { // padding untouched
				if got[i*ldc+j] != cm[i*ldc+j] {
					t.Fatalf("%+v: padding C[%d][%d] written", c, i, j)
				}
			}
		}
	}
}

func TestRowMajorGemmValidation(t *testing.T) {
	bad := []struct {
		ta, tb                 bool
		m, n, k, lda, ldb, ldc int
	}{
		{false, false, 4, 5, 6, 5, 5, 5},  // lda < k
		{true, false, 4, 5, 6, 3, 5, 5},   // transA: lda < m
		{false, false, 4, 5, 6, 6, 4, 5},  // ldb < n
		{false, true, 4, 5, 6, 6, 5, 5},   // transB: ldb < k
		{false, false, 4, 5, 6, 6, 5, 4},  // ldc < n
		{false, false, -1, 5, 6, 6, 5, 5}, // negative
		{false, false, 4, 5, 6, 0, 5, 5},  // ld 0
		{false, false, 4, 5, 1 << 31, 1 << 31, 5, 5},
	}
	for _, c := range bad {
		if _, err := rowMajorGemm(c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc); err == nil {
			t.Errorf("rowMajorGemm%+v accepted", c)
		}
	}
	g, err := rowMajorGemm(true, false, 2, 3, 4, 2, 3, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := gemmArgs{transa: cublasOpN, transb: cublasOpT, m: 3, n: 2, k: 4, lda: 3, ldb: 2, ldc: 3}
	if g != want {
		t.Errorf("mapping = %+v, want %+v", g, want)
	}
	// Degenerate sizes are valid (cuBLAS returns at once).
	if _, err := rowMajorGemm(false, false, 0, 0, 0, 1, 1, 1); err != nil {
		t.Errorf("empty gemm: %v", err)
	}
}

// ---------------------------------------------------------------------------
// GPU tests.

func gemmToF32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

func gpuUpload(t *testing.T, d *Device, x []float64) uintptr {
	t.Helper()
	f := gemmToF32(x)
	p, err := d.MemAlloc(4 * max(1, len(f)))
	gpuCheck(t, err)
	t.Cleanup(func() { d.MemFree(p) })
	if len(f) > 0 {
		gpuCheck(t, d.CopyHtoD(p, unsafe.Pointer(&f[0]), 4*len(f), 0))
	}
	return p
}

func gpuDownload(t *testing.T, d *Device, p uintptr, n int, s Stream) []float32 {
	t.Helper()
	out := make([]float32, n)
	gpuCheck(t, d.CopyDtoH(unsafe.Pointer(&out[0]), p, 4*n, s))
	return out
}

// checkGemm compares a GPU result against the float64 reference.
//
// Tolerance: each output is a sum of k products accumulated in FP32. The
// classic bound for recursive summation is |error| <= k*u*sum_l |a_il b_lj|
// (+ the roundings of alpha* and beta*, u each), u = 2^-24 ~ 6e-8. For the
// k <= 71 used here k*u <= 4.2e-6, so an error above 1e-5 * (alpha*sum|a||b|
// + |beta c|) cannot come from rounding in any summation order cuBLAS picks
// (blocked or split-k, which only lower the effective k), but a wrong
// operand, transpose, stride or leading dimension gives errors of order 1
// times that scale. TF32 (10-bit mantissa, u ~ 4.9e-4 per input) needs the
// looser bound used when tf32 is set.
func checkGemm(t *testing.T, label string, got []float32, want, scale []float64, m, n, ldc int, tf32 bool) {
	t.Helper()
	tol := 1e-5
	if tf32 {
		tol = 5e-3
	}
	worst := 0.0
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			idx := i*ldc + j
			err := math.Abs(float64(got[idx]) - want[idx])
			bound := tol*scale[idx] + 1e-30
			if r := err / (scale[idx] + 1e-30); r > worst {
				worst = r
			}
			if err > bound {
				t.Fatalf("%s: C[%d][%d] = %v, want %v (error %.3g > %.3g)", label, i, j, got[idx], want[idx], err, bound)
			}
		}
		for j := n; j < ldc; j++ {
			if float64(got[i*ldc+j]) != float64(float32(want[i*ldc+j])) {
				t.Fatalf("%s: padding C[%d][%d] modified", label, i, j)
			}
		}
	}
	t.Logf("%s: worst error / (sum|a||b| + |beta c|) = %.2e", label, worst)
}

func TestGPUSgemm(t *testing.T) {
	d := requireGPU(t)
	bl, err := d.NewBLAS(0)
	gpuCheck(t, err)
	defer bl.Close()
	v, err := bl.Version()
	gpuCheck(t, err)
	t.Logf("cuBLAS %d (%s)", v, cublasLib.path)
	if bl.TF32() {
		t.Fatal("TF32 on by default")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range gemmCases() {
		a, lda, b, ldb, cm, ldc := gemmData(c, r)
		const alpha, beta = 1.5, -0.5
		want, scale := rowMajorProduct(c.transA, c.transB, c.m, c.n, c.k, alpha, a, lda, b, ldb, beta, cm, ldc)
		da, db, dc := gpuUpload(t, d, a), gpuUpload(t, d, b), gpuUpload(t, d, cm)
		gpuCheck(t, bl.Sgemm(c.transA, c.transB, c.m, c.n, c.k, alpha, da, lda, db, ldb, beta, dc, ldc))
		got := gpuDownload(t, d, dc, len(cm), 0)
		checkGemm(t, fmt.Sprintf("%+v", c), got, want, scale, c.m, c.n, ldc, false)
	}
	if err := bl.Sgemm(false, false, 4, 5, 6, 1, 0, 5, 0, 5, 0, 0, 5); err == nil {
		t.Error("invalid lda accepted")
	}
}

func TestGPUSgemmTF32AndStream(t *testing.T) {
	d := requireGPU(t)
	s, err := d.NewStream()
	gpuCheck(t, err)
	defer d.DestroyStream(s)
	bl, err := d.NewBLAS(s)
	gpuCheck(t, err)
	defer bl.Close()
	gpuCheck(t, bl.SetTF32(true))
	if !bl.TF32() || bl.Stream() != s {
		t.Fatal("TF32 / stream not recorded")
	}
	r := rand.New(rand.NewPCG(5, 6))
	c := gemmCase{false, true, 256, 192, 320, 0}
	a, lda, b, ldb, cm, ldc := gemmData(c, r)
	want, scale := rowMajorProduct(c.transA, c.transB, c.m, c.n, c.k, 1, a, lda, b, ldb, 0, cm, ldc)
	da, db, dc := gpuUpload(t, d, a), gpuUpload(t, d, b), gpuUpload(t, d, cm)
	gpuCheck(t, bl.Sgemm(c.transA, c.transB, c.m, c.n, c.k, 1, da, lda, db, ldb, 0, dc, ldc))
	got := gpuDownload(t, d, dc, len(cm), s) // ordered after the GEMM on s
	checkGemm(t, "tf32", got, want, scale, c.m, c.n, ldc, true)
	gpuCheck(t, bl.SetTF32(false))
	gpuCheck(t, bl.SetStream(0))
}

func TestGPUSgemmStridedBatched(t *testing.T) {
	d := requireGPU(t)
	bl, err := d.NewBLAS(0)
	gpuCheck(t, err)
	defer bl.Close()
	r := rand.New(rand.NewPCG(7, 8))
	const batch = 3
	for _, c := range []gemmCase{{false, false, 19, 23, 31, 0}, {true, true, 19, 23, 31, 2}, {true, false, 8, 40, 12, 1}} {
		// Batch entry i of X starts stride elements after entry i-1; the
		// strides include 5 spare elements so an off-by-one shows.
		var as, bs, cs [][]float64
		var lda, ldb, ldc int
		for i := 0; i < batch; i++ {
			a, la, b, lb, cm, lc := gemmData(c, r)
			as, bs, cs = append(as, a), append(bs, b), append(cs, cm)
			lda, ldb, ldc = la, lb, lc
		}
		strideA, strideB, strideC := len(as[0])+5, len(bs[0])+5, len(cs[0])+5
		flat := func(xs [][]float64, stride int) []float64 {
			out := make([]float64, stride*len(xs))
			for i, x := range xs {
				copy(out[i*stride:], x)
			}
			return out
		}
		da, db, dc := gpuUpload(t, d, flat(as, strideA)), gpuUpload(t, d, flat(bs, strideB)), gpuUpload(t, d, flat(cs, strideC))
		const alpha, beta = 0.75, 2
		gpuCheck(t, bl.SgemmStridedBatched(c.transA, c.transB, c.m, c.n, c.k, alpha,
			da, lda, int64(strideA), db, ldb, int64(strideB), beta, dc, ldc, int64(strideC), batch))
		got := gpuDownload(t, d, dc, strideC*batch, 0)
		for i := 0; i < batch; i++ {
			want, scale := rowMajorProduct(c.transA, c.transB, c.m, c.n, c.k, alpha, as[i], lda, bs[i], ldb, beta, cs[i], ldc)
			checkGemm(t, fmt.Sprintf("%+v batch %d", c, i), got[i*strideC:i*strideC+len(cs[i])], want, scale, c.m, c.n, ldc, false)
			for j := len(cs[i]); j < strideC; j++ {
				if got[i*strideC+j] != 0 {
					t.Fatalf("%+v: gap after batch %d written", c, i)
				}
			}
		}
	}
	// Stride 0 broadcasts one B to every batch entry.
	c := gemmCase{false, false, 4, 6, 5, 0}
	a, lda, b, ldb, cm, ldc := gemmData(c, r)
	da := gpuUpload(t, d, append(append([]float64(nil), a...), a...))
	db := gpuUpload(t, d, b)
	dc := gpuUpload(t, d, append(append([]float64(nil), cm...), cm...))
	gpuCheck(t, bl.SgemmStridedBatched(false, false, c.m, c.n, c.k, 1, da, lda, int64(len(a)), db, ldb, 0, 0, dc, ldc, int64(len(cm)), 2))
	got := gpuDownload(t, d, dc, 2*len(cm), 0)
	want, scale := rowMajorProduct(false, false, c.m, c.n, c.k, 1, a, lda, b, ldb, 0, cm, ldc)
	checkGemm(t, "broadcast B #0", got[:len(cm)], want, scale, c.m, c.n, ldc, false)
	checkGemm(t, "broadcast B #1", got[len(cm):], want, scale, c.m, c.n, ldc, false)
}
