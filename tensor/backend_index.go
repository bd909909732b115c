package tensor

// Indexing is the gather/scatter part of the Backend core, and the batched
// matrix product.
type Indexing interface {
	// IndexSelect sets dst [outer, m, inner] to src [outer, n, inner]
	// gathered along the middle axis: dst[o, i, r] = src[o, idx[i], r],
	// idx int32 of m elements, each in [0, n). An index out of range is a
	// programming error: the CPU panics, CUDA reports a device error.
	IndexSelect(dst, src, idx Buffer, outer, n, inner int)
	// IndexAdd adds src [outer, m, inner] into dst [outer, n, inner]:
	// dst[o, idx[i], r] += src[o, i, r] (the backward pass of IndexSelect
	// and of an embedding lookup; repeated indices add up).
	IndexAdd(dst, src, idx Buffer, outer, n, inner int)
	// MatMulBatched runs MatMul on batch matrices: matrix i of a starts at
	// element i·strideA (likewise b and c), so that a stride of 0
	// broadcasts one operand over the batch.
	MatMulBatched(c, a, b Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32)
}
