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

// LowPrecisionBiasBackend is implemented by backends whose bfloat16
// products can add a float32 bias in the same kernel (the GPU: cuBLASLt's
// bias epilogue): autocast's Linear then makes no separate pass over its
// output for the bias. Without it, or where LinearLowp declines, Linear
// runs MatMulLowp and then AddBias.
type LowPrecisionBiasBackend interface {
	// LinearLowp sets y [n, out] = x·wᵀ + bias for x [n, in] and w
	// [out, in] bfloat16, bias [out] and y float32: the float32 result of
	// MatMulLowp with the bias added to it (the order of the product's
	// sums may differ from MatMulLowp's). It reports false, having done
	// nothing, where it does not take the product.
	LinearLowp(y, x, w, bias Buffer, n, in, out int) bool
}

// LinearCastBackend is implemented by backends whose bfloat16 products can
// round their float32 result to bfloat16 as they write it (the GPU:
// cuBLASLt with a bfloat16 output, whose bias is bfloat16 too). LinearHalf
// uses it under autocast; without it, or where it declines, the float32
// result is written and then cast.
type LinearCastBackend interface {
	// LinearLowpCast sets y [n, out] (BFloat16) to x·wᵀ + bias rounded,
	// for x [n, in], w [out, in] and bias [out] (or empty) BFloat16: the
	// float32 sums plus the widened bias, rounded to nearest (the order of
	// the sums may differ from LinearLowp's). It reports false, having
	// done nothing, where it does not take the product.
	LinearLowpCast(y, x, w, bias Buffer, n, in, out int) bool
}

// UnaryCastBackend is implemented by backends that round a unary
// function's float32 result to bfloat16 in the same pass (the GPU).
// Autocast's Linear uses it to make again, in its backward pass, the
// bfloat16 copy of an input that a unary function (a GELU) made, from that
// function's input, which the function keeps anyway, instead of keeping
// the copy. Without it the copy is made by Unary and then Cast.
type UnaryCastBackend interface {
	// UnaryCast sets dst (BFloat16, n elements) to op(x) for x Float32 and
	// dense (n elements), rounded: Cast of Unary's result, bit for bit.
	UnaryCast(op UnaryOp, dst, x Buffer, n int, a, b float32)
}

// LayerNormCastBackend is implemented by backends whose layer norm can
// round its result to bfloat16 as it writes it (the GPU). LayerNormHalf
// uses it under autocast, for a result that only products read; without
// it, LayerNorm and then Cast.
type LayerNormCastBackend interface {
	// LayerNormCast is NormBackend's LayerNorm with y BFloat16: Cast of
	// LayerNorm's result, bit for bit.
	LayerNormCast(y, saveMean, saveInvStd, x, weight, bias Buffer, rows, cols int, eps float32)
}

// LowPrecisionConvBackend is implemented by backends that run convolutions
// with BFloat16 operands, float32 sums and float32 results: autocast's
// convolutions (autocast.go). Its operands and results are float32
// buffers: the backend rounds them to bfloat16 as it goes, so that the
// casts can be fused with what the convolution needs (a change of layout,
// say). Both backends implement it (the CPU as the float32 convolution of
// rounded operands with its results rounded, the GPU through cuDNN); on a
// backend without it, or for a geometry it does not take (ConvLowp false),
// convolutions stay float32 under autocast.
type LowPrecisionConvBackend interface {
	// ConvLowp reports whether Conv2dLowp and Conv2dBackwardLowp take g.
	ConvLowp(g ConvGeom) bool
	// Conv2dLowp is Conv2d with x and w rounded to bfloat16: the products
	// are exact and summed in float32, and the sum is rounded to bfloat16
	// before the bias (torch's autocast convolution gives a bfloat16
	// output).
	Conv2dLowp(y, x, w, bias Buffer, g ConvGeom)
	// Conv2dBackwardLowp is Conv2dBackward with x, w and dy (masked by y
	// under g.ReLU) rounded to bfloat16: the gradients are summed in
	// float32 and the input and weight gradients rounded to bfloat16
	// before they are written (dx) or added (dw); db is summed from the
	// float32 dy.
	Conv2dBackwardLowp(dx, dw, db, dy, x, w, y Buffer, g ConvGeom)
}
