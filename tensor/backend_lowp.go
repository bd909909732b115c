package tensor

// LowPrecisionBackend is implemented by backends that hold BFloat16 buffers
// and multiply them with float32 results: the pieces of mixed precision
// (autocast.go). Both backends implement it; a backend without it runs
// everything in float32, and autocast on it is an error.
type LowPrecisionBackend interface {
	// Cast converts src into dst (same length) between Float32 and
	// BFloat16, either way; float32 to bfloat16 rounds to nearest, ties to
	// even, as torch does (BFloat16Bits), and the other way is exact.
	Cast(dst, src Buffer)
	// MatMulLowp is MatMul with a and b BFloat16 and c Float32: the
	// products are exact in float32 and summed in float32 (cuBLAS's
	// CUBLAS_COMPUTE_32F on the GPU), so the result differs from a float32
	// product of the rounded operands in the order of the sums only.
	MatMulLowp(c, a, b Buffer, m, n, k int, transA, transB bool, alpha, beta float32)
	// MatMulBatchedLowp is MatMulBatched with MatMulLowp's element types.
	MatMulBatchedLowp(c, a, b Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32)
}
