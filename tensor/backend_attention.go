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
//
// Inner and the layouts say where each tensor's rows lie in its buffer
// (AttentionLayout): the Heads heads are Heads/Inner groups of Inner (an
// Inner of 0 reads as 1), and a zero layout is the dense one. The layouts
// of q, k, v, out and dout are the tensors the forward reads and writes;
// DQ, DK and DV those of the gradients the backward pass writes (which may
// share one buffer, as long as their elements are disjoint).
type AttentionShape struct {
	Heads, T, S, D int
	Causal         bool
	Scale          float32
	BFloat16       bool

	Inner                      int
	Q, K, V, O, DO, DQ, DK, DV AttentionLayout
}

// AttentionLayout places the rows of one [Heads, rows, D] tensor of a fused
// attention call in its buffer: row r of head h = g·Inner + i (group g,
// i < Inner) starts at element g·Group + i·Head + r·Row, and its D elements
// follow each other. The zero layout is the dense one (Group Inner·rows·D,
// Head rows·D, Row D): a permuted view of a projection, as q of [B, T, 3,
// H, D] seen as [B, H, T, D], is Group T·3·H·D, Head D, Row 3·H·D.
type AttentionLayout struct {
	Group, Head, Row int
}

// InnerHeads is sh.Inner, 1 when unset.
func (sh AttentionShape) InnerHeads() int { return max(sh.Inner, 1) }

// Resolve is l, or for the zero layout the dense one of a tensor of rows
// rows per head in sh.
func (l AttentionLayout) Resolve(sh AttentionShape, rows int) AttentionLayout {
	if l == (AttentionLayout{}) {
		return AttentionLayout{Group: sh.InnerHeads() * rows * sh.D, Head: rows * sh.D, Row: sh.D}
	}
	return l
}

// Extent is the number of elements from the first that a buffer laid out
// as l (resolved) must hold for sh's heads of rows rows: one past the
// last element of the last row.
func (l AttentionLayout) Extent(sh AttentionShape, rows int) int {
	l = l.Resolve(sh, rows)
	inner := sh.InnerHeads()
	return (sh.Heads/inner-1)*l.Group + (inner-1)*l.Head + (rows-1)*l.Row + sh.D
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
	// Mask, when not empty, holds AttentionMaskWords Int32 words in which
	// the forward pass stores the kept bits it drew, in the backend's own
	// layout, and from which the backward pass reads them instead of
	// drawing them again.
	Mask Buffer
}

// AttentionMaskBackend is implemented by backends whose fused attention can
// keep the dropout's kept bits from its forward pass for its backward pass
// (AttentionDropout.Mask): one bit a weight, where drawing them again
// costs each backward kernel a Philox draw for every four weights.
type AttentionMaskBackend interface {
	// AttentionMaskWords is the number of Int32 words the mask of a call
	// of sh takes, 0 where the backend draws the bits again instead.
	AttentionMaskWords(sh AttentionShape) int
}

// AttentionBackend is implemented by backends with a fused attention
// (FlashAttention-style: the [T, S] weights are never stored), which
// ScaledDotProductAttention[Dropout] uses where AttentionSupported allows
// and composes from BatchMatMul, Softmax and Dropout elsewhere. q, out,
// dout and dq are [Heads, T, D], k, v, dk and dv [Heads, S, D], all
// float32 (q, k and v may be BFloat16 where AttentionBF16InputsBackend
// says so), laid out as AttentionShape's layouts say (dense by default);
// each buffer starts at its tensor's first element.
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

// AttentionBF16InputsBackend is implemented by backends whose fused
// attention under autocast (AttentionShape.BFloat16) also takes q, k and v
// as BFloat16 buffers, giving what it gives for their float32 values
// (which it rounds to bfloat16 as a cast does). The packed attention then
// keeps one bfloat16 copy of its input for the backward pass instead of the
// float32 input, half the bytes.
type AttentionBF16InputsBackend interface {
	// AttentionTakesBF16 reports whether AttentionForward and
	// AttentionBackward take BFloat16 q, k and v for calls of sh.
	AttentionTakesBF16(sh AttentionShape) bool
}
