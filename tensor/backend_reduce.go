package tensor

// ReduceOp selects the reduction of Backend.Reduce.
type ReduceOp uint8

const (
	ReduceSum    ReduceOp = iota // Σ
	ReduceMax                    // maximum; NaN if any is NaN
	ReduceMin                    // minimum; NaN if any is NaN
	ReduceArgmax                 // index (int32) of the first maximum (of a NaN, if any)
	ReduceArgmin                 // index (int32) of the first minimum (of a NaN, if any)
	ReduceMean                   // Σ / n, divided before the one rounding to float32
	NumReduceOps                 // the number of reduction codes
)

// Reductions is the reducing part of the Backend core. Every reduction
// views its dense input as [outer, n, inner] and reduces the middle axis:
// any set of adjacent axes is one call, other sets are permuted together
// first by the tensor layer.
type Reductions interface {
	// Reduce sets dst [outer, inner] to op over the n elements of each
	// column of x [outer, n, inner] (dst += when accumulate, ReduceSum
	// only). dst is int32 for ReduceArgmax and ReduceArgmin. n may be 0
	// for ReduceSum (the sum is 0), not for ReduceMean.
	Reduce(op ReduceOp, dst, x Buffer, outer, n, inner int, accumulate bool)
	// Softmax sets y [outer, n, inner] to the softmax of x over the middle
	// axis, or its logarithm when log (computed stably, max subtracted).
	Softmax(y, x Buffer, outer, n, inner int, log bool)
	// SoftmaxBackward sets dx (+= when accumulate) to the gradient of the
	// loss with respect to x, given dy and the forward output y:
	// dx = y·(dy - Σ dy·y) for softmax, dx = dy - e^y·Σ dy for log-softmax.
	SoftmaxBackward(dx, dy, y Buffer, outer, n, inner int, log, accumulate bool)
}

// CausalSoftmaxBackend is implemented by backends with a softmax of
// causal attention scores, so that ScaledDotProductAttention needs no mask
// tensor (uploaded, then added to every score) and reads only the scores
// that are kept.
type CausalSoftmaxBackend interface {
	// CausalSoftmax sets y [rows, n] to the softmax of each row of x over
	// its first min(q+1, n) elements, q = row mod t (the query of a batch
	// of [t, n] score matrices), and to 0 after them: exactly Softmax of x
	// plus -Inf above the diagonal. Its backward pass is SoftmaxBackward
	// (a probability of 0 passes no gradient).
	CausalSoftmax(y, x Buffer, rows, t, n int)
}
