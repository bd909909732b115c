package tensor

import (
	"fmt"
	"math"
)

// BatchMatMul is torch.matmul: a [..., m, k] times b [..., k, n] gives
// [..., m, n], the batch dimensions broadcast against each other; a 1-D a
// is a row [1, k] and a 1-D b a column [k, 1], whose dimension is dropped
// from the result. Two 2-D operands are MatMul's product. Operands that are
// transposed views of dense memory (Transpose of the last two axes) are
// read in place; the gradient of an operand broadcast over batch
// dimensions is summed over them. Under autocast (autocast.go) the
// products, forward and backward, are bfloat16 ones with float32 results.
func BatchMatMul(a, b *Tensor) *Tensor { return batchMatMul(a, b, 1, nil) }

// matOperand is one operand of a batched product as the backend reads it.
type matOperand struct {
	t      *Tensor // the tensor read (t itself, or a dense copy of it)
	trans  bool    // t's matrices are stored transposed
	stride int     // elements between consecutive matrices; 0 broadcasts one
	batch  []int   // t's batch dimensions, padded with leading 1s to the output's rank
}

// batchMatMul is alpha·(a·b) + addend, addend a constant (nil for none) of
// the output's shape without its batch dimensions ([m, n]), broadcast over
// the batch: ScaledDotProductAttention's scale and mask.
func batchMatMul(a, b *Tensor, alpha float32, addend *Tensor) *Tensor {
	sameBackend(a, b)
	origA, origB := a.Shape(), b.Shape()
	if len(a.shape) == 0 || len(b.shape) == 0 {
		panic(fmt.Sprintf("tensor: BatchMatMul of %v and %v: scalars have no product", origA, origB))
	}
	rowA, colB := len(a.shape) == 1, len(b.shape) == 1
	if rowA {
		a = a.Contiguous().Reshape(1, a.shape[0])
	}
	if colB {
		b = b.Contiguous().Reshape(b.shape[0], 1)
	}
	m, k, n := a.shape[len(a.shape)-2], a.shape[len(a.shape)-1], b.shape[len(b.shape)-1]
	if b.shape[len(b.shape)-2] != k {
		panic(fmt.Sprintf("tensor: BatchMatMul of %v and %v: inner dimensions %d and %d differ", origA, origB, k, b.shape[len(b.shape)-2]))
	}
	batch, ok := broadcastShapes(a.shape[:len(a.shape)-2], b.shape[:len(b.shape)-2])
	if !ok {
		panic(fmt.Sprintf("tensor: BatchMatMul of %v and %v: batch dimensions do not broadcast", origA, origB))
	}
	s := scopeOf(a, b)
	oa, ob := matrixOperand(a, batch, s), matrixOperand(b, batch, s)
	nb := numel(batch)
	be := a.st.b
	out := Empty(be, s, append(append([]int(nil), batch...), m, n)...)
	var beta float32
	if addend != nil {
		if !sameShape(addend.shape, []int{m, n}) {
			panic(fmt.Sprintf("tensor: BatchMatMul: addend %v for products [%d, %d]", addend.shape, m, n))
		}
		be.CopyStrided(out.buffer(), addend.Contiguous().buffer(), []int{nb, m, n}, []int{0, n, 1})
		beta = 1
	}
	p := productsFor(be, s)
	var ha, hb operand // under autocast the bfloat16 copies, kept for the backward pass
	if out.Len() > 0 {
		ha, hb = p.keep(oa.buffer(m*k)), p.keep(ob.buffer(k*n))
		p.batchedOf(out.buffer(), ha, hb, nb, m, n, k, oa.stride, ob.stride, m*n, oa.trans, ob.trans, alpha, beta)
	}
	record(out, "batch_matmul", func(g *Tensor, e *engine) {
		defer ha.release()
		defer hb.release()
		if out.Len() == 0 {
			ha, hb = operand{f: oa.buffer(m * k)}, operand{f: ob.buffer(k * n)}
		}
		hg := operand{f: g.buffer()}
		if a.requiresGrad && b.requiresGrad {
			hg = p.inScope(e.scopeFor(a)).keep(hg.f)
			defer hg.release()
		}
		if a.requiresGrad { // dA_i = alpha·G_i·B_iᵀ
			da := Empty(be, e.scopeFor(a), append(append([]int(nil), batch...), m, k)...)
			p.inScope(e.scopeFor(a)).batchedOf(da.buffer(), hg, hb, nb, m, k, n, m*n, ob.stride, m*k, false, !ob.trans, alpha, 0)
			e.give(a, sumToBatch(da, oa.batch, a.shape))
		}
		if b.requiresGrad { // dB_i = alpha·A_iᵀ·G_i
			db := Empty(be, e.scopeFor(b), append(append([]int(nil), batch...), k, n)...)
			p.inScope(e.scopeFor(b)).batchedOf(db.buffer(), ha, hg, nb, k, n, m, oa.stride, m*n, k*n, !oa.trans, false, alpha, 0)
			e.give(b, sumToBatch(db, ob.batch, b.shape))
		}
	}, a, b)
	saveFor(out, oa.copyOf(a), ob.copyOf(b), ha.h, hb.h)
	shape := out.Shape()
	switch {
	case rowA && colB:
		return out.Reshape(shape[:len(shape)-2]...)
	case rowA:
		return out.Reshape(append(shape[:len(shape)-2], n)...)
	case colB:
		return out.Reshape(shape[:len(shape)-1]...)
	}
	return out
}

// broadcastShapes broadcasts two shapes as numpy does (aligned at the
// right, a 1 stretching to the other's size).
func broadcastShapes(a, b []int) ([]int, bool) {
	out := make([]int, max(len(a), len(b)))
	for i := range out {
		da, db := 1, 1
		if j := len(a) - len(out) + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - len(out) + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db || db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, false
		}
	}
	return out, true
}

// matrixOperand lays t [..., r, c] out for a product over the batch
// dimensions batch: in place when its matrices are dense or dense
// transposed and its batch is one matrix (stride 0) or all of batch in
// row-major order; otherwise a dense copy, expanded to all of batch where t
// broadcasts over only some of the dimensions.
func matrixOperand(t *Tensor, batch []int, s *Scope) matOperand {
	rank := len(t.shape)
	r, c := t.shape[rank-2], t.shape[rank-1]
	pad := make([]int, len(batch)-(rank-2), len(batch))
	for i := range pad {
		pad[i] = 1
	}
	tb := append(pad, t.shape[:rank-2]...)
	sr, sc := t.strides[rank-2], t.strides[rank-1]
	var trans bool
	switch {
	case (r == 1 || sr == c) && (c == 1 || sc == 1):
	case (r == 1 || sr == 1) && (c == 1 || sc == r):
		trans = true
	default:
		t = t.Contiguous()
	}
	if numel(tb) == 1 {
		return matOperand{t: t, trans: trans, stride: 0, batch: tb}
	}
	if sameShape(tb, batch) {
		dense, want := true, r*c
		for i := rank - 3; i >= 0; i-- {
			if t.shape[i] != 1 && t.strides[i] != want {
				dense = false
			}
			want *= t.shape[i]
		}
		if dense {
			return matOperand{t: t, trans: trans, stride: r * c, batch: tb}
		}
		return matOperand{t: t.Contiguous(), stride: r * c, batch: tb}
	}
	// Broadcast over some batch dimensions only: expand into a dense copy
	// (not recorded; the gradient is summed back by sumToBatch).
	full := append(append([]int(nil), batch...), r, c)
	strides := make([]int, len(full))
	ts := append(make([]int, len(pad)), t.strides[:rank-2]...)
	for i := range batch {
		if tb[i] != 1 {
			strides[i] = ts[i]
		}
	}
	strides[len(full)-2], strides[len(full)-1] = t.strides[rank-2], t.strides[rank-1]
	return matOperand{t: t.rawView(t.off, full, strides).copyDense(s), stride: r * c, batch: tb}
}

// copyOf is the operand's tensor when it is a dense copy of t that only
// the product reads (nil when it is t's own memory).
func (o matOperand) copyOf(t *Tensor) *Tensor {
	if o.t.st == t.st {
		return nil
	}
	return o.t
}

// buffer is the operand's memory from its first element: a whole batch of
// matrices of size elements, or one when it broadcasts.
func (o matOperand) buffer(size int) Buffer {
	t := o.t
	t.mustBeLive()
	t.fillPendingOnes()
	n := size
	if o.stride != 0 {
		n = numel(t.shape) // dense batch: the matrices follow each other
	}
	return t.st.buf.Slice(t.off, n)
}

// sumToBatch sums g [batch..., r, c] over the batch dimensions where an
// operand's padded batch tb is 1, and returns it with the operand's shape.
func sumToBatch(g *Tensor, tb []int, shape []int) *Tensor {
	cur := g
	for i := range tb {
		if tb[i] == 1 && cur.shape[i] != 1 {
			next := sumAxis(cur, i)
			if cur != g {
				cur.Release()
			}
			cur = next
		}
	}
	if cur != g {
		g.Release()
	}
	return cur.rawView(cur.off, append([]int(nil), shape...), contiguousStrides(shape))
}

// sumAxis sums a dense tensor over one axis (kept with size 1), as a
// product with a vector of ones: [outer, n, inner] → [outer, 1, inner]. A
// private stand-in for the reductions of the Reductions family.
func sumAxis(x *Tensor, axis int) *Tensor {
	outer, n, inner := axisView("sumAxis", x.shape, axis)
	be := x.st.b
	shape := x.Shape()
	shape[axis] = 1
	out := Empty(be, x.scope, shape...)
	ones := Full(be, x.scope, 1, n)
	be.MatMulBatched(out.buffer(), ones.buffer(), x.buffer(), outer, 1, inner, n, 0, n*inner, inner, false, false, 1, 0)
	ones.Release()
	return out
}

// linearLeading is Linear for x [..., in] other than 2-D: the leading
// dimensions are folded into rows (x [in] is one row) and unfolded after.
func linearLeading(x, w, b *Tensor, half bool) *Tensor {
	if len(x.shape) == 0 || len(w.shape) != 2 || x.shape[len(x.shape)-1] != w.shape[1] {
		panic(fmt.Sprintf("tensor: Linear of input %v with weight %v", x.shape, w.shape))
	}
	lead := x.shape[:len(x.shape)-1]
	// The two reshapes are this function's own: x and the result stay
	// their memory's only holders for the caller (ReleaseInput).
	y := heldInternally(linear(heldInternally(x.Contiguous().Reshape(numel(lead), w.shape[1])), w, b, half))
	return y.Reshape(append(append([]int(nil), lead...), w.shape[0])...)
}

// ScaledDotProductAttention is torch's scaled_dot_product_attention without
// dropout: softmax(scale·q·kᵀ + mask)·v for q [B, H, T, D], k [B, H, S, D]
// and v [B, H, S, Dv] (any matching batch dimensions in front), where scale
// 0 means 1/√D and causal masks the keys after each query (s > t, torch's
// is_causal: the lower-left triangle of [T, S] is kept).
//
// On an AttentionBackend that takes the head dimensions it is one fused
// kernel that never stores the [T, S] weights (the backward pass recomputes
// them from each row's log-sum-exp). Elsewhere it is composed of
// BatchMatMul and Softmax, whose backward pass gives the masked scores no
// gradient (their probability is 0): the causal mask is a backend's
// CausalSoftmax where it has one (no mask tensor; the masked scores are not
// read), else a [T, S] matrix of 0 and -Inf, broadcast over the batch, that
// the product of the scores adds to (beta 1). kᵀ is a transposed view:
// nothing is copied.
func ScaledDotProductAttention(q, k, v *Tensor, causal bool, scale float32) *Tensor {
	return attention(q, k, v, causal, scale, 0, nil)
}

// ScaledDotProductAttentionDropout is ScaledDotProductAttention with
// dropout of probability p on the attention weights (torch's dropout_p,
// which it applies in training only: pass p = 0 in evaluation), drawn from
// gen. The weights are softmax(scale·q·kᵀ + mask) before the dropout. The
// fused and the composed attention draw the same mask (Dropout's, over the
// [B, H, T, S] weights) and advance gen alike.
func ScaledDotProductAttentionDropout(q, k, v *Tensor, causal bool, scale, p float32, gen RandomSource) *Tensor {
	if !(p >= 0 && p <= 1) {
		panic(fmt.Sprintf("tensor: ScaledDotProductAttentionDropout probability %v outside [0, 1]", p))
	}
	if p > 0 && gen == nil {
		panic("tensor: ScaledDotProductAttentionDropout with probability > 0 needs a RandomSource, got nil")
	}
	return attention(q, k, v, causal, scale, p, gen)
}

// attention is ScaledDotProductAttention with dropout of probability p
// (none when 0) drawn from gen applied to the attention weights before
// they weigh v.
func attention(q, k, v *Tensor, causal bool, scale, p float32, gen RandomSource) *Tensor {
	rq, rk, rv := len(q.shape), len(k.shape), len(v.shape)
	if rq < 2 || rk != rq || rv != rq || q.shape[rq-1] != k.shape[rk-1] || k.shape[rk-2] != v.shape[rv-2] ||
		!sameShape(q.shape[:rq-2], k.shape[:rk-2]) || !sameShape(q.shape[:rq-2], v.shape[:rv-2]) {
		panic(fmt.Sprintf("tensor: ScaledDotProductAttention of q %v, k %v, v %v; want [..., T, D], [..., S, D], [..., S, Dv]", q.shape, k.shape, v.shape))
	}
	sameBackend(q, k)
	sameBackend(q, v)
	t, sk, d, dv := q.shape[rq-2], k.shape[rk-2], q.shape[rq-1], v.shape[rv-1]
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	heads := numel(q.shape[:rq-2])
	// p = 1 drops everything without a draw (Dropout's zeros): composed.
	if ab, ok := q.st.b.(AttentionBackend); ok && heads > 0 && t > 0 && sk > 0 && p < 1 && ab.AttentionSupported(d, dv) {
		return attentionFused(ab, q, k, v, AttentionShape{Heads: heads, T: t, S: sk, D: d, Causal: causal, Scale: scale}, p, gen)
	}
	drop := func(w *Tensor) *Tensor { return w }
	if p > 0 {
		drop = func(w *Tensor) *Tensor { return Dropout(w, p, true, gen) }
	}
	if cs, ok := q.st.b.(CausalSoftmaxBackend); ok && causal && sk > 0 {
		scores := batchMatMul(q, k.Transpose(rk-2, rk-1), scale, nil)
		return BatchMatMul(drop(causalSoftmax(cs, scores, t)), v)
	}
	var mask *Tensor
	if causal {
		m := make([]float32, t*sk)
		for i := 0; i < t; i++ {
			for j := i + 1; j < sk; j++ {
				m[i*sk+j] = float32(math.Inf(-1))
			}
		}
		mask = FromFloat32(q.st.b, scopeOf(q, k, v), m, t, sk)
	}
	scores := batchMatMul(q, k.Transpose(rk-2, rk-1), scale, mask)
	if mask != nil && mask.scope == nil { // read by the product already queued
		mask.Release()
	}
	return BatchMatMul(drop(Softmax(scores, -1)), v)
}

// attentionFused is attention as ab's fused kernels: the output and each
// row's log-sum-exp forward, the three gradients from them backward. With
// dropout (0 < p < 1) the draw takes gen's next (Heads·T·S+3)/4 blocks, as
// Dropout over the weights would; a DeviceGenerator's (seed, offset) are
// copied on the device for the backward pass. Under autocast to bfloat16
// sh.BFloat16 lets the backend multiply in bfloat16. q, k and v are read
// through their strides where the kernels take them (attentionOperand):
// permuted views need no copy. The output and the gradients are dense.
func attentionFused(ab AttentionBackend, q, k, v *Tensor, sh AttentionShape, p float32, gen RandomSource) *Tensor {
	rank := len(q.shape)
	sh.Inner = 1
	if rank >= 3 {
		sh.Inner = q.shape[rank-3]
	}
	q, sh.Q = attentionOperand(q, sh.Inner)
	k, sh.K = attentionOperand(k, sh.Inner)
	v, sh.V = attentionOperand(v, sh.Inner)
	be := q.st.b
	s := scopeOf(q, k, v)
	out := Empty(be, s, append(q.Shape()[:rank-1], v.shape[rank-1])...)
	sh.O = denseAttentionLayout(sh, sh.T)
	a := attentionRun(ab, q, k, v, out, sh, p, gen, s.GradEnabled() && (q.requiresGrad || k.requiresGrad || v.requiresGrad))
	record(out, "attention", func(g *Tensor, e *engine) {
		dq := Empty(be, e.scopeFor(q), q.shape...)
		dk := Empty(be, e.scopeFor(k), k.shape...)
		dv := Empty(be, e.scopeFor(v), v.shape...)
		dT, dS := denseAttentionLayout(sh, sh.T), denseAttentionLayout(sh, sh.S)
		a.backward(g, dq.buffer(), dk.buffer(), dv.buffer(), dT, dS, dS)
		e.give(q, dq)
		e.give(k, dk)
		e.give(v, dv)
	}, q, k, v)
	saveFor(out, a.lse, a.saved, a.mask)
	return out
}

// ScaledDotProductAttentionPacked is ScaledDotProductAttention[Dropout] of
// the heads of one projection qkv [B, T, 3, H, D] (queries, keys and values
// along axis 2, as a transformer's one Linear to 3·H·D channels makes
// them) with the output as [B, T, H, D], the order in which the heads are
// merged again: it is
//
//	q, k, v := qkv.Select(2, i).Permute(0, 2, 1, 3) for i = 0, 1, 2
//	ScaledDotProductAttentionDropout(q, k, v, causal, scale, p, gen).Permute(0, 2, 1, 3)
//
// (p = 0 and gen nil for none). On an AttentionBackend that takes heads of
// D the fused kernels read q, k and v in place, write the output dense in
// [B, T, H, D] order (so that a Reshape to [B, T, H·D] is free) and the
// backward pass writes the three gradients into one [B, T, 3, H, D]
// gradient: no copies either way. Elsewhere it is the composition above.
func ScaledDotProductAttentionPacked(qkv *Tensor, causal bool, scale, p float32, gen RandomSource) *Tensor {
	sh := qkv.Shape()
	if len(sh) != 5 || sh[2] != 3 {
		panic(fmt.Sprintf("tensor: ScaledDotProductAttentionPacked of %v; want [B, T, 3, H, D]", sh))
	}
	if !(p >= 0 && p <= 1) {
		panic(fmt.Sprintf("tensor: ScaledDotProductAttentionPacked dropout probability %v outside [0, 1]", p))
	}
	if p > 0 && gen == nil {
		panic("tensor: ScaledDotProductAttentionPacked with dropout probability > 0 needs a RandomSource, got nil")
	}
	b, t, h, d := sh[0], sh[1], sh[3], sh[4]
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	if qkv.DType() == BFloat16 && !PackedAttentionTakesHalf(qkv.st.b, qkv.scope, b, t, h, d, causal, p) {
		// The products of the composed attention take float32 operands.
		qkv = Cast(qkv, Float32)
	}
	head := func(i int) *Tensor { return qkv.Narrow(2, i, 1).Squeeze(2).Permute(0, 2, 1, 3) }
	ab, ok := qkv.st.b.(AttentionBackend)
	if !ok || b*h == 0 || t == 0 || p >= 1 || !ab.AttentionSupported(d, d) {
		return attention(head(0), head(1), head(2), causal, scale, p, gen).Permute(0, 2, 1, 3)
	}
	x := qkv
	// q, k or v of src as [B, H, T, D] (views that are not recorded; the
	// checks' are not counted as holders).
	viewOf := func(src *Tensor, i int, counted bool) *Tensor {
		st := src.strides
		off, shape, strides := src.off+i*st[2], []int{b, h, t, d}, []int{st[0], st[3], st[1], st[4]}
		if counted {
			return src.view(off, shape, strides)
		}
		return src.rawView(off, shape, strides)
	}
	if !attentionStrides(viewOf(x, 0, false)) || !attentionStrides(viewOf(x, 1, false)) || !attentionStrides(viewOf(x, 2, false)) {
		x = x.Contiguous()
	}
	a := AttentionShape{Heads: b * h, T: t, S: t, D: d, Causal: causal, Scale: scale, Inner: h}
	be := x.st.b
	// Under autocast, where the backend takes bfloat16 q, k and v, they are
	// read from one bfloat16 copy of x, which the backward pass keeps
	// instead of x: the same results (the kernels round x as the cast
	// does), half the bytes, and x may go back once the caller is done
	// with it (ReleaseInputs).
	// A bfloat16 x (LinearHalf's) is that copy already, kept as it is.
	src := x
	var xh *Tensor
	if x.DType() == Float32 && x.IsContiguous() && PackedAttentionTakesHalf(be, x.scope, b, t, h, d, causal, p) {
		xh = newTensor(be, BFloat16, x.scope, x.shape...)
		be.(LowPrecisionBackend).Cast(xh.buffer(), x.buffer())
		src = xh
	}
	var q, k, v *Tensor
	q, a.Q = attentionOperand(viewOf(src, 0, xh == nil), h)
	k, a.K = attentionOperand(viewOf(src, 1, xh == nil), h)
	v, a.V = attentionOperand(viewOf(src, 2, xh == nil), h)
	out := Empty(be, x.scope, b, t, h, d)
	a.O = AttentionLayout{Group: t * h * d, Head: d, Row: h * d}
	run := attentionRun(ab, q, k, v, out, a, p, gen, x.scope.GradEnabled() && x.requiresGrad)
	record(out, "attention_packed", func(g *Tensor, e *engine) {
		dx := Empty(be, e.scopeFor(x), b, t, 3, h, d)
		l := AttentionLayout{Group: t * 3 * h * d, Head: d, Row: 3 * h * d}
		buf, hd := dx.buffer(), h*d
		gv := g.view(g.off, []int{b, h, t, d}, []int{g.strides[0], g.strides[2], g.strides[1], g.strides[3]})
		run.backward(gv, buf, buf.Slice(hd, buf.Len-hd), buf.Slice(2*hd, buf.Len-2*hd), l, l, l)
		e.give(x, dx)
	}, x)
	saveFor(out, run.lse, run.saved, run.mask, xh)
	if xh != nil {
		readsNot(out, false, x) // its bfloat16 copy is what it reads
	}
	return out
}

// PackedAttentionTakesHalf reports whether ScaledDotProductAttentionPacked
// of a [batch, t, 3, heads, d] input on backend be, in scope s, with
// dropout probability p, reads that input as bfloat16: a fused attention
// that takes bfloat16 inputs (AttentionBF16InputsBackend), under
// autocast. The projection that makes the input may then give it in
// bfloat16 (LinearHalf), and nothing is cast between the two; elsewhere a
// bfloat16 input is cast to float32 first.
func PackedAttentionTakesHalf(be Backend, s *Scope, batch, t, heads, d int, causal bool, p float32) bool {
	ab, ok := be.(AttentionBackend)
	if !ok || batch*heads == 0 || t == 0 || p >= 1 || s.Autocast() != BFloat16 || !ab.AttentionSupported(d, d) {
		return false
	}
	bb, ok := ab.(AttentionBF16InputsBackend)
	if _, lp := be.(LowPrecisionBackend); !ok || !lp {
		return false
	}
	return bb.AttentionTakesBF16(AttentionShape{Heads: batch * heads, T: t, S: t, D: d, Causal: causal, Inner: heads, BFloat16: true})
}

// attentionCall is a fused attention after its forward pass: what its
// backward pass reads.
type attentionCall struct {
	ab       AttentionBackend
	q, k, v  *Tensor
	out, lse *Tensor
	saved    *Tensor // a DeviceGenerator's state at the draw, or nil
	mask     *Tensor // the dropout's kept bits (AttentionMaskBackend), or nil
	drop     AttentionDropout
	sh       AttentionShape // as the forward ran (BFloat16 set)
}

// attentionRun queues the forward pass of q, k and v (laid out as sh.Q,
// sh.K, sh.V) into out (laid out as sh.O) with dropout p drawn from gen.
// grad says whether the call's backward pass will run (whether its inputs
// require gradients), so that the kept bits are stored only then.
func attentionRun(ab AttentionBackend, q, k, v, out *Tensor, sh AttentionShape, p float32, gen RandomSource, grad bool) attentionCall {
	be := q.st.b
	s := scopeOf(q, k, v)
	sh.BFloat16 = s.Autocast() == BFloat16 // the backward pass follows the forward's choice
	a := attentionCall{ab: ab, q: q, k: k, v: v, out: out, drop: AttentionDropout{Keep: 1, Scale: 1}, sh: sh}
	if p > 0 {
		noteDraw(s, gen)
		a.drop, a.saved = gen.attentionDraw(ab, be, s, sh.Heads*sh.T*sh.S)
		a.drop.Keep, a.drop.Scale = 1-p, 1/(1-p)
		// The kept bits stored for the backward pass, where there is one.
		if mb, ok := ab.(AttentionMaskBackend); ok && grad {
			if n := mb.AttentionMaskWords(sh); n > 0 {
				a.mask = newTensor(be, Int32, s, n)
				a.drop.Mask = a.mask.buffer()
			}
		}
	}
	a.lse = Empty(be, s, sh.Heads, sh.T)
	ab.AttentionForward(out.buffer(), a.lse.buffer(), q.window(sh.Q.Extent(sh, sh.T)), k.window(sh.K.Extent(sh, sh.S)),
		v.window(sh.V.Extent(sh, sh.S)), sh, a.drop)
	return a
}

// backward queues the gradients of the call for the output gradient g
// (the output's [..., Heads, T, D] order, any strides) into dq, dk and dv,
// laid out as lq, lk and lv.
func (a attentionCall) backward(g *Tensor, dq, dk, dv Buffer, lq, lk, lv AttentionLayout) {
	sh := a.sh
	sh.DQ, sh.DK, sh.DV = lq, lk, lv
	g, sh.DO = attentionOperand(g, sh.InnerHeads())
	a.ab.AttentionBackward(dq, dk, dv, a.q.window(sh.Q.Extent(sh, sh.T)), a.k.window(sh.K.Extent(sh, sh.S)),
		a.v.window(sh.V.Extent(sh, sh.S)), a.out.buffer(), a.lse.buffer(), g.window(sh.DO.Extent(sh, sh.T)), sh, a.drop)
}

// denseAttentionLayout is the layout of a dense [Heads, rows, D] tensor.
func denseAttentionLayout(sh AttentionShape, rows int) AttentionLayout {
	return AttentionLayout{}.Resolve(sh, rows)
}

// attentionOperand is t [..., rows, D] as the fused kernels read it: its
// layout with the last batch dimension (of size inner; 1 for a rank-2 t)
// as the inner heads, t itself where attentionStrides allows, else a
// dense copy.
func attentionOperand(t *Tensor, inner int) (*Tensor, AttentionLayout) {
	if !attentionStrides(t) {
		t = t.Contiguous()
	}
	// A stride of an axis of size 1 is never stepped: it takes the dense
	// value, so that a dense t has the dense layout.
	r := len(t.shape)
	rows, d := t.shape[r-2], t.shape[r-1]
	l := AttentionLayout{Group: inner * rows * d, Head: rows * d, Row: d}
	if rows != 1 {
		l.Row = t.strides[r-2]
	}
	if r >= 3 && inner != 1 {
		l.Head = t.strides[r-3]
	}
	// The outer batch dimensions nest (attentionStrides): a group steps
	// by the stride of the innermost one that is not 1.
	for i := r - 4; i >= 0; i-- {
		if t.shape[i] != 1 {
			l.Group = t.strides[i]
			break
		}
	}
	return t, l
}

// attentionStrides reports whether the fused kernels read t [..., rows, D]
// in place: its last dimension dense, its batch dimensions before the last
// one a single stride, and (unless t is dense) its offset and strides
// multiples of 4 elements, for the kernels' 16-byte loads.
func attentionStrides(t *Tensor) bool {
	if t.IsContiguous() {
		return true
	}
	r := len(t.shape)
	if t.shape[r-1] != 1 && t.strides[r-1] != 1 {
		return false
	}
	if t.off%4 != 0 {
		return false
	}
	for i := 0; i < r-1; i++ {
		if t.shape[i] != 1 && t.strides[i]%4 != 0 {
			return false
		}
	}
	// Outer batch dimensions (before the last batch dimension): nested.
	prev := -1 // the next inner outer dimension of size > 1
	for i := r - 4; i >= 0; i-- {
		if t.shape[i] == 1 {
			continue
		}
		if prev >= 0 && t.strides[i] != t.strides[prev]*t.shape[prev] {
			return false
		}
		prev = i
	}
	return true
}

// window is t's memory from its first element, n elements of it (a
// strided view's extent).
func (t *Tensor) window(n int) Buffer {
	t.mustBeLive()
	t.fillPendingOnes()
	return t.st.buf.Slice(t.off, n)
}

// causalSoftmax is Softmax over the last axis of scores [..., t, S] with
// the keys after each query masked, without a mask tensor: cs's
// CausalSoftmax. The backward pass is Softmax's, whose zero probabilities
// give the masked scores no gradient, as the mask's -Inf did.
func causalSoftmax(cs CausalSoftmaxBackend, scores *Tensor, t int) *Tensor {
	x := scores.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	if out.Len() == 0 {
		return out
	}
	n := x.shape[len(x.shape)-1]
	rows := x.Len() / n
	cs.CausalSoftmax(out.buffer(), x.buffer(), rows, t, n)
	record(out, "causal_softmax", func(g *Tensor, e *engine) {
		if dx, acc := e.sink(x); !dx.Empty() {
			be.SoftmaxBackward(dx, g.buffer(), out.buffer(), rows, n, 1, false, acc)
		}
	}, x)
	return out
}
