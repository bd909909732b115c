package cuda

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// indexArgs checks the buffers of IndexSelect and IndexAdd (the gathered
// one [outer, m, inner], the full one [outer, n, inner], m indices) and
// returns the kernel arguments after the pointers.
func (b *Backend) indexArgs(op string, gathered, full, idx tensor.Buffer, outer, n, inner int) (m int, dims []any) {
	m = idx.Len
	if outer < 0 || n < 0 || inner < 0 || gathered.Len != outer*m*inner || full.Len != outer*n*inner {
		panic(fmt.Sprintf("cuda: %s of [%d, %d, %d] with %d indices: buffers of %d and %d elements", op, outer, n, inner, m, full.Len, gathered.Len))
	}
	return m, []any{int64(outer), int64(n), int64(m), int64(inner)}
}

// IndexSelect gathers rows of src along the middle axis (kernels/index.cu).
func (b *Backend) IndexSelect(dst, src, idx tensor.Buffer, outer, n, inner int) {
	const op = "index_select"
	m, dims := b.indexArgs(op, dst, src, idx, outer, n, inner)
	args := append([]any{b.f32(op, dst), b.f32(op, src), b.i32(op, idx)}, dims...)
	b.launch(op, b.kernel("ember_index_select"), outer*m*inner, args...)
}

// orderedIndexAddMax is the longest index list that IndexAdd adds in order
// (deterministic, the CPU's sums bit for bit): each thread of that kernel
// walks the whole list, so longer lists go to atomics instead.
const orderedIndexAddMax = 1024

// ember_index_add_scan replaces the ordered kernel when its work is
// small: at most scanIndexAddMax compares of an index in shared memory
// (outer·n·inner·m) and scanDstMax elements of dst, which it reads and
// writes whole, and at least scanIndexesMin indices (shorter chains of the
// ordered kernel cost little). The GPT's position embedding backward,
// [1, 256, 384] from 256 indices, one after another on an H200: 19.5 µs a
// launch, the ordered kernel 58.5 µs (131 µs in a training step).
const (
	scanIndexAddMax = 1 << 27
	scanDstMax      = 1 << 22
	scanIndexesMin  = 16
)

// IndexAdd adds the rows of src into dst at the rows idx names. Up to
// orderedIndexAddMax indices, or when the columns alone fill the GPU
// (outer·inner at least 64k threads), the sums are the CPU's, bit for bit:
// a thread per destination element scanning the list when that is cheap
// (see scanIndexAddMax), else a thread per column adding them in order.
// Otherwise atomicAdd: repeated indices then add up in an order that
// varies from run to run (not bitwise reproducible).
func (b *Backend) IndexAdd(dst, src, idx tensor.Buffer, outer, n, inner int) {
	const op = "index_add"
	m, dims := b.indexArgs(op, src, dst, idx, outer, n, inner)
	args := append([]any{b.f32(op, dst), b.f32(op, src), b.i32(op, idx)}, dims...)
	if m <= orderedIndexAddMax || outer*inner >= 1<<16 {
		if full := outer * n * inner; m >= scanIndexesMin && full > 0 && full <= scanDstMax && full <= scanIndexAddMax/m {
			b.launch(op, b.kernel("ember_index_add_scan"), full, args...)
			return
		}
		b.launch(op, b.kernel("ember_index_add_ordered"), outer*inner, args...)
		return
	}
	b.launch(op, b.kernel("ember_index_add_atomic"), outer*m*inner, args...)
}

// stridedBatchedExec is an executor that runs cublasSgemmStridedBatched;
// MatMulBatched queues one GEMM per matrix on one that does not.
type stridedBatchedExec interface {
	sgemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, strideA int64,
		b uintptr, ldb int, strideB int64, beta float32, c uintptr, ldc int, strideC int64, batch int) error
}

func (g *gpuExec) sgemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, strideA int64,
	b uintptr, ldb int, strideB int64, beta float32, c uintptr, ldc int, strideC int64, batch int) error {
	if g.blas == nil {
		return fmt.Errorf("cuda: a batched GEMM queued on the side stream, which has no cuBLAS handle")
	}
	if err := g.settle(); err != nil {
		return err
	}
	return g.blas.SgemmStridedBatched(transA, transB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC, batch)
}

// MatMulBatched runs batch products c_i = alpha·op(a_i)·op(b_i) + beta·c_i,
// matrix i of each operand starting i·stride elements in: a batch of one
// is MatMul (whose small products run in a kernel of ours), more are one
// cublasSgemmStridedBatched (row-major, as driver/cublas.go explains).
func (b *Backend) MatMulBatched(c, a, bm tensor.Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	const op = "matmul_batched"
	if batch < 0 || m < 0 || n < 0 || k < 0 || strideA < 0 || strideB < 0 || (batch > 1 && strideC < m*n) {
		panic(fmt.Sprintf("cuda: %s batch=%d m=%d n=%d k=%d strides %d, %d, %d", op, batch, m, n, k, strideA, strideB, strideC))
	}
	if batch == 0 {
		return
	}
	need(op, "a", a, (batch-1)*strideA+m*k)
	need(op, "b", bm, (batch-1)*strideB+k*n)
	need(op, "c", c, (batch-1)*strideC+m*n)
	if batch == 1 {
		b.MatMul(c.Slice(0, m*n), a.Slice(0, m*k), bm.Slice(0, k*n), m, n, k, transA, transB, alpha, beta)
		return
	}
	pc, pa, pb := b.f32(op, c), b.f32(op, a), b.f32(op, bm)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		b.scaleBatched(op, pc, batch, m*n, strideC, beta)
		return
	}
	lda, ldb := gemmLeading(m, n, k, transA, transB)
	if x, ok := b.x.(stridedBatchedExec); ok {
		devCheck(op, x.sgemmStridedBatched(transA, transB, m, n, k, alpha, pa, lda, int64(strideA), pb, ldb, int64(strideB),
			beta, pc, n, int64(strideC), batch))
		return
	}
	for i := 0; i < batch; i++ {
		devCheck(op, b.x.sgemm(transA, transB, m, n, k, alpha, pa+uintptr(4*i*strideA), lda, pb+uintptr(4*i*strideB), ldb,
			beta, pc+uintptr(4*i*strideC), n))
	}
}

// scaleBatched sets each of batch matrices of size elements, strideC
// apart, to beta times itself (0 when beta is 0, NaN included, as on the
// CPU), leaving the gaps between them untouched: a batched product with
// no terms (k == 0).
func (b *Backend) scaleBatched(op string, pc uintptr, batch, size, strideC int, beta float32) {
	for i := 0; i < batch; i++ {
		p := pc + uintptr(4*i*strideC)
		if beta == 0 {
			devCheck(op, b.x.memset32(p, 0, size))
		} else {
			b.launch(op, b.kernel("ember_scale"), size, p, beta, int64(size))
		}
	}
}

// gemmLeading is the leading dimensions of dense row-major operands of an
// m×n×k product (a is k×m when transA, b is n×k when transB).
func gemmLeading(m, n, k int, transA, transB bool) (lda, ldb int) {
	lda, ldb = k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	return lda, ldb
}
