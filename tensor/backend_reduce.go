package tensor

// ReduceOp selects the reduction of Backend.Reduce.
type ReduceOp uint8

const (
	ReduceSum    ReduceOp = iota // Σ
	ReduceMax                    // maximum; NaN if any is NaN
	ReduceMin                    // minimum; NaN if any is NaN
	ReduceArgmax                 // index (int32) of the first maximum (of a NaN, if any)
	ReduceArgmin                 // index (int32) of the first minimum (of a NaN, if any)
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
	// for ReduceSum (the sum is 0).
	Reduce(op ReduceOp, dst, x Buffer, outer, n, inner int, accumulate bool)
	// Softmax sets y [outer, n, inner] to the softmax of x over the middle
	// axis, or its logarithm when log (computed stably, max subtracted).
	Softmax(y, x Buffer, outer, n, inner int, log bool)
	// SoftmaxBackward sets dx (+= when accumulate) to the gradient of the
	// loss with respect to x, given dy and the forward output y:
	// dx = y·(dy - Σ dy·y) for softmax, dx = dy - e^y·Σ dy for log-softmax.
	SoftmaxBackward(dx, dy, y Buffer, outer, n, inner int, log, accumulate bool)
}
