package cuda

import (
	"errors"
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// Mixed precision on the GPU (tensor.LowPrecisionBackend): casts between
// float32 and bfloat16 (kernels/cast.cu), and bfloat16 products with
// float32 results and accumulation through cublasGemmEx.

// Cast converts src into dst between float32 and bfloat16, rounding as
// tensor.BFloat16Bits does, bit for bit.
func (b *Backend) Cast(dst, src tensor.Buffer) {
	const op = "cast"
	if dst.Len != src.Len {
		panic(fmt.Sprintf("cuda: %s of %d elements into %d", op, src.Len, dst.Len))
	}
	switch {
	case src.DType == tensor.Float32 && dst.DType == tensor.BFloat16:
		b.launch(op, b.kernel("ember_cast_f32_bf16"), dst.Len, b.ptr(op, dst, tensor.BFloat16), b.f32(op, src), int64(dst.Len))
	case src.DType == tensor.BFloat16 && dst.DType == tensor.Float32:
		b.launch(op, b.kernel("ember_cast_bf16_f32"), dst.Len, b.f32(op, dst), b.ptr(op, src, tensor.BFloat16), int64(dst.Len))
	case src.DType == dst.DType:
		b.Copy(dst, src)
	default:
		panic(fmt.Sprintf("cuda: %s: no cast from %v to %v", op, src.DType, dst.DType))
	}
}

// bf16GemmExec is an executor that runs bfloat16 GEMMs with float32
// results (cublasGemmEx, cublasGemmStridedBatchedEx).
type bf16GemmExec interface {
	gemmBF16(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, strideA int64,
		b uintptr, ldb int, strideB int64, beta float32, c uintptr, ldc int, strideC int64, batch int) error
}

func (g *gpuExec) gemmBF16(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, strideA int64,
	b uintptr, ldb int, strideB int64, beta float32, c uintptr, ldc int, strideC int64, batch int) error {
	if g.blas == nil {
		return errors.New("cuda: a bfloat16 GEMM queued on the side stream, which has no cuBLAS handle")
	}
	if err := g.settle(); err != nil {
		return err
	}
	if batch == 1 {
		return g.blas.GemmBF16(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	}
	return g.blas.GemmStridedBatchedBF16(transA, transB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC, batch)
}

// MatMulLowp sets c = alpha·op(a)·op(b) + beta·c for bfloat16 a and b and
// float32 c (row-major, as MatMul), with float32 accumulation.
func (b *Backend) MatMulLowp(c, x, y tensor.Buffer, m, n, k int, transA, transB bool, alpha, beta float32) {
	b.MatMulBatchedLowp(c, x, y, 1, m, n, k, 0, 0, m*n, transA, transB, alpha, beta)
}

// MatMulBatchedLowp is MatMulLowp over batch matrices, matrix i of each
// operand starting i·stride elements in (MatMulBatched's layout): one
// cublasGemmEx for a batch of one, else one cublasGemmStridedBatchedEx.
// Unlike MatMul, no product goes to a kernel of ours: cuBLAS's bfloat16
// kernels run on the tensor cores.
func (b *Backend) MatMulBatchedLowp(c, x, y tensor.Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	const op = "matmul_lowp"
	if batch < 0 || m < 0 || n < 0 || k < 0 || strideA < 0 || strideB < 0 || (batch > 1 && strideC < m*n) {
		panic(fmt.Sprintf("cuda: %s batch=%d m=%d n=%d k=%d strides %d, %d, %d", op, batch, m, n, k, strideA, strideB, strideC))
	}
	if batch == 0 {
		return
	}
	need(op, "a", x, (batch-1)*strideA+m*k)
	need(op, "b", y, (batch-1)*strideB+k*n)
	need(op, "c", c, (batch-1)*strideC+m*n)
	pc, pa, pb := b.f32(op, c), b.ptr(op, x, tensor.BFloat16), b.ptr(op, y, tensor.BFloat16)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		b.scaleBatched(op, pc, batch, m*n, strideC, beta)
		return
	}
	lda, ldb := gemmLeading(m, n, k, transA, transB)
	x16, ok := b.x.(bf16GemmExec)
	if !ok {
		panic(&tensor.Error{Op: op, Err: errors.New("cuda: this executor has no bfloat16 GEMM")})
	}
	devCheck(op, x16.gemmBF16(transA, transB, m, n, k, alpha, pa, lda, int64(strideA), pb, ldb, int64(strideB),
		beta, pc, n, int64(strideC), batch))
}

var _ tensor.LowPrecisionBackend = (*Backend)(nil)

// UnaryCast implements tensor.UnaryCastBackend: one pass of
// ember_unary_cast_bf16 (strided.cu), four elements a thread where x is
// 16-byte and dst 8-byte aligned.
func (b *Backend) UnaryCast(op tensor.UnaryOp, dst, x tensor.Buffer, n int, a, c float32) {
	const name = "unary_cast"
	if op >= tensor.NumUnaryOps {
		panic(fmt.Sprintf("cuda: %s: unknown op %d", name, op))
	}
	if n < 0 {
		panic(fmt.Sprintf("cuda: %s of %d elements", name, n))
	}
	need(name, "x", x, n)
	need(name, "dst", dst, n)
	pd, px := b.ptr(name, dst, tensor.BFloat16), b.f32(name, x)
	b.launch4(name, b.kernel("ember_unary_cast_bf16"), n, px%16 == 0 && pd%8 == 0, pd, px, int64(n), int32(op), a, c)
}
