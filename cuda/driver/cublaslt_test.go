package driver

import (
	"testing"
	"unsafe"
)

// TestLtLayouts checks the column-major layouts given to cuBLASLt for the
// row-major products of a linear layer: every layout must describe its
// row-major array read column-major (an r x c array with leading dimension
// ld is the c x r transpose), and the bias of the forward pass must run
// along the rows of cuBLASLt's D (one per output feature).
func TestLtLayouts(t *testing.T) {
	const n, in, out = 300, 200, 132
	for _, c := range []struct {
		name                string
		transA, transB      bool
		m, nn, k, lda, ldb  int
		ldc                 int
		first, second, cLay ltLayout
	}{
		// y [n, out] = x [n, in] · wᵀ: first operand w (stored [out, in]:
		// column-major in x out), second x (column-major in x n), D out x n.
		{"forward", false, true, n, out, in, in, in, out, ltLayout{in, out, in}, ltLayout{in, n, in}, ltLayout{out, n, out}},
		// dw [out, in] = gᵀ · x: first x (in x n), second g (out x n), D in x out.
		{"weight gradient", true, false, out, in, n, out, in, in, ltLayout{in, n, in}, ltLayout{out, n, out}, ltLayout{in, out, in}},
		// dx [n, in] = g · w: first w (in x out), second g (out x n), D in x n.
		{"input gradient", false, false, n, in, out, out, in, in, ltLayout{in, out, in}, ltLayout{out, n, out}, ltLayout{in, n, in}},
	} {
		ga, err := rowMajorGemm(c.transA, c.transB, c.m, c.nn, c.k, c.lda, c.ldb, c.ldc)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := ltLayouts(ga)
		if want := [3]ltLayout{c.first, c.second, c.cLay}; got != want {
			t.Errorf("%s: layouts %v, want %v", c.name, got, want)
		}
		// D's rows are the row-major C's columns: the bias (one per
		// output feature, N of them) runs along them.
		if got[2].rows != c.nn {
			t.Errorf("%s: D has %d rows, want N = %d", c.name, got[2].rows, c.nn)
		}
	}
}

// TestLtHeuristicResultSize: cublasLtMatmulHeuristicResult_t is 96 bytes
// (a 64-byte algorithm, size_t, two 4-byte fields, four reserved ints).
func TestLtHeuristicResultSize(t *testing.T) {
	if s := unsafe.Sizeof(ltHeuristicResult{}); s != 96 {
		t.Errorf("ltHeuristicResult is %d bytes, want 96", s)
	}
}
