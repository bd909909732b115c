package tensor

// AttentionShape is the shape of one fused attention call: Heads matrices
// (every batch dimension folded) of T queries and S keys, head dimension
// D for queries, keys and values, and the softmax's scale (already
// resolved: never 0) and causal mask (keys after their query, s > t,
// excluded). BFloat16 is set under autocast to bfloat16: the two products
// of each pass may then round their operands (q, k, v, the output
// gradient, the weights and their gradients) to bfloat16 and accumulate in
// float32, as autocast's composed attention does; the buffers stay
// float32 either way, and a backend may compute such a call in float32.
type AttentionShape struct {
	Heads, T, S, D int
	Causal         bool
	Scale          float32
	BFloat16       bool
}

// AttentionDropout is the dropout on the attention weights of a fused
// call. Keep is 1 for none; otherwise weight (h, t, s) — element
// (h·T + t)·S + s of the [Heads, T, S] weights — is kept, and scaled by
// Scale, where the Bernoulli(Keep) draw of that element under Random's
// layout at (Seed, Offset) is 1: exactly the bits DropoutBackend.Dropout
// draws over the weights of the composed attention. When State is not
// empty, (seed, offset) are read from it instead (four int32 words, as
// RandomStateBackend's).
type AttentionDropout struct {
	Keep, Scale  float32
	Seed, Offset uint64
	State        Buffer
}

// AttentionBackend is implemented by backends with a fused attention
// (FlashAttention-style: the [T, S] weights are never stored), which
// ScaledDotProductAttention[Dropout] uses where AttentionSupported allows
// and composes from BatchMatMul, Softmax and Dropout elsewhere. q, out and
// dout are [Heads, T, D], k and v [Heads, S, D], all dense float32.
type AttentionBackend interface {
	// AttentionSupported reports whether the fused kernels take heads of
	// query/key dimension d and value dimension dv.
	AttentionSupported(d, dv int) bool
	// AttentionForward sets out to dropout(softmax(scale·q·kᵀ, masked))·v
	// and lse [Heads, T] to each row's natural log-sum-exp of the scaled,
	// masked scores, which the backward pass reads.
	AttentionForward(out, lse, q, k, v Buffer, sh AttentionShape, drop AttentionDropout)
	// AttentionBackward sets dq, dk and dv to the gradients of the
	// forward's inputs for the output gradient dout, recomputing the
	// weights from q, k and lse (and the dropout mask from drop, which
	// must be the forward's).
	AttentionBackward(dq, dk, dv, q, k, v, out, lse, dout Buffer, sh AttentionShape, drop AttentionDropout)
	// AttentionTakeState copies the four words of a device generator's
	// state into saved and then advances state's offset by blocks: saved
	// holds the draw of one fused call for its forward and backward pass.
	AttentionTakeState(saved, state Buffer, blocks uint64)
}
