package tensor

import "fmt"

// Cast converts between float32 and bfloat16 bit patterns (BFloat16Bits
// and BFloat16Float32, ops_cast.go).
func (*cpuBackend) Cast(dst, src Buffer) {
	if dst.Len != src.Len {
		panic(fmt.Sprintf("tensor: cpu: cast of %d elements into %d", src.Len, dst.Len))
	}
	switch {
	case src.DType == Float32 && dst.DType == BFloat16:
		d, s := bf16(dst), f32(src)
		for i, v := range s {
			d[i] = BFloat16Bits(v)
		}
	case src.DType == BFloat16 && dst.DType == Float32:
		d, s := f32(dst), bf16(src)
		for i, v := range s {
			d[i] = BFloat16Float32(v)
		}
	case src.DType == dst.DType:
		(&cpuBackend{}).Copy(dst, src)
	default:
		panic(fmt.Sprintf("tensor: cpu: no cast from %v to %v", src.DType, dst.DType))
	}
}

// MatMulLowp widens the bfloat16 operands to float32 (exactly) and runs
// the float32 SGEMM: the same products as cuBLAS's bfloat16 GEMM with
// float32 accumulation, summed in another order.
func (c *cpuBackend) MatMulLowp(dst, a, b Buffer, m, n, k int, transA, transB bool, alpha, beta float32) {
	c.MatMulBatchedLowp(dst, a, b, 1, m, n, k, 0, 0, m*n, transA, transB, alpha, beta)
}

// MatMulBatchedLowp is MatMulLowp over a batch (MatMulBatched's strides).
func (c *cpuBackend) MatMulBatchedLowp(dst, a, b Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	wa, wb := c.widen(a), c.widen(b)
	c.MatMulBatched(dst, wa, wb, batch, m, n, k, strideA, strideB, strideC, transA, transB, alpha, beta)
}

// widen returns a float32 copy of a bfloat16 buffer.
func (c *cpuBackend) widen(b Buffer) Buffer {
	if b.DType != BFloat16 {
		panic(fmt.Sprintf("tensor: cpu: low-precision product of a %v operand, want bfloat16", b.DType))
	}
	w, _ := c.Alloc(b.Len, Float32)
	c.Cast(w, b)
	return w
}
