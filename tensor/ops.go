package tensor

import "fmt"

// Operations with autograd. Each forward function is followed by the
// backward closure it records; the backend does the arithmetic.

// Add returns a + b, broadcast as NumPy does. Dense operands of one shape
// take ArithmeticBackend's Add (the path LeNet's results depend on); others the
// strided core, with the gradient of a broadcast operand summed back to
// its shape.
func Add(a, b *Tensor) *Tensor {
	if !plainOperands(a, b) {
		return addBroadcast(a, b)
	}
	sameBackend(a, b)
	if out := addChannelsLast(a, b); out != nil {
		return out
	}
	out := Empty(a.st.b, scopeOf(a, b), a.shape...)
	Complete(a.st.b).Add(out.buffer(), a.Contiguous().buffer(), b.Contiguous().buffer())
	record(out, "add", func(g *Tensor, e *engine) {
		// b takes a copy first; a may then adopt g itself (give), which
		// saves a copy of the gradient for a computed a.
		e.pass(b, g)
		e.give(a, g)
	}, a, b)
	takesUniform(out)
	readsNot(out, true, a, b)
	return out
}

// Mul returns a * b elementwise, broadcast as NumPy does (dense operands
// of one shape take ArithmeticBackend's Mul, as Add).
func Mul(a, b *Tensor) *Tensor {
	if !plainOperands(a, b) {
		return mulBroadcast(a, b)
	}
	sameBackend(a, b)
	a, b = a.Contiguous(), b.Contiguous()
	be := a.st.b
	out := Empty(be, scopeOf(a, b), a.shape...)
	Complete(be).Mul(out.buffer(), a.buffer(), b.buffer())
	record(out, "mul", func(g *Tensor, e *engine) {
		src, uniform := g.uniformSource()
		for _, p := range [][2]*Tensor{{a, b}, {b, a}} {
			switch {
			case !p[0].requiresGrad:
			case uniform: // g's one element times the other operand, in one pass
				dst, acc := e.sink(p[0])
				Complete(be).ScaleBy(dst, p[1].buffer(), src, acc)
			default:
				ga := Empty(be, e.scopeFor(p[0]), p[0].shape...)
				Complete(be).Mul(ga.buffer(), g.buffer(), p[1].buffer())
				e.give(p[0], ga)
			}
		}
	}, a, b)
	takesUniform(out)
	return out
}

// Sum returns the sum of all elements as a one-element tensor.
func Sum(x *Tensor) *Tensor {
	x = x.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, 1)
	Complete(be).Sum(out.buffer(), x.buffer())
	record(out, "sum", func(g *Tensor, e *engine) { giveUniform(e, x, g) }, x)
	return out
}

// MatMul returns the matrix product a·b of a [m,k] and b [k,n].
func MatMul(a, b *Tensor) *Tensor {
	if len(a.shape) != 2 || len(b.shape) != 2 || a.shape[1] != b.shape[0] {
		panic(fmt.Sprintf("tensor: MatMul of %v and %v", a.shape, b.shape))
	}
	sameBackend(a, b)
	a, b = a.Contiguous(), b.Contiguous()
	m, k, n := a.shape[0], a.shape[1], b.shape[1]
	be := a.st.b
	out := Empty(be, scopeOf(a, b), m, n)
	p := productsFor(be, out.scope)
	ha, hb := p.keep(a.buffer()), p.keep(b.buffer()) // for the backward pass too
	p.matMulOf(out.buffer(), ha, hb, m, n, k, false, false, 1, 0)
	record(out, "matmul", func(g *Tensor, e *engine) {
		defer ha.release()
		defer hb.release()
		da, accA := e.sink(a)
		db, accB := e.sink(b)
		if da.Empty() && db.Empty() {
			return
		}
		p := p.inScope(e.scopeFor(a))
		hg := p.keep(g.buffer())
		defer hg.release()
		if !da.Empty() { // da = g·bᵀ
			p.matMulOf(da, hg, hb, m, k, n, false, true, 1, beta(accA))
		}
		if !db.Empty() { // db = aᵀ·g
			p.matMulOf(db, ha, hg, k, n, m, true, false, 1, beta(accB))
		}
	}, a, b)
	saveFor(out, ha.h, hb.h) // freed at once when no backward pass will read them
	return out
}

// nonNil drops nil tensors (an absent bias) from a list of operands.
func nonNil(ts ...*Tensor) []*Tensor {
	out := ts[:0]
	for _, t := range ts {
		if t != nil {
			out = append(out, t)
		}
	}
	return out
}

func beta(accumulate bool) float32 {
	if accumulate {
		return 1
	}
	return 0
}

// Linear returns x·wᵀ + b for x [n,in], w [out,in], b [out] (b may be nil),
// the affine map of nn.Linear. x may also be [..., in] (or [in]): the
// leading dimensions are folded into rows (ops_matmul.go). Under autocast
// (autocast.go) the products are bfloat16 ones and the bias is added in
// float32; the fused float32 paths of a LinearBackend are not taken. Under
// autocast x may also be bfloat16 (what LayerNormHalf, ActivationLinear's
// activation or LinearHalf write): it is then the product's operand as it
// is, kept for the backward pass instead of a copy, and its gradient is
// float32.
func Linear(x, w, b *Tensor) *Tensor { return linear(x, w, b, false) }

// LinearHalf is Linear for a result that is only read as bfloat16 (a
// fused attention's packed input): under autocast its result is bfloat16,
// and, as in torch's autocast linear, its bias is rounded to bfloat16 too:
// the float32 sums plus the rounded bias, rounded as the product writes
// them (LinearCastBackend; elsewhere the float32 result, then Cast). Its
// gradients are float32, as every gradient is, and its backward pass is
// Linear's (the bias's gradient is the sum of the incoming one). Without
// autocast it is Linear.
func LinearHalf(x, w, b *Tensor) *Tensor { return linear(x, w, b, AutocastOf(x, w, b) == BFloat16) }

// linear is Linear, with a bfloat16 result when half.
func linear(x, w, b *Tensor, half bool) *Tensor {
	if len(x.shape) != 2 {
		return linearLeading(x, w, b, half)
	}
	autocast := AutocastOf(x, w, b)
	if x.DType() != Float32 && (x.DType() != BFloat16 || autocast != BFloat16) {
		panic(fmt.Sprintf("tensor: Linear of a %s input %v; want float32 (or bfloat16 under autocast)", x.DType(), x.shape))
	}
	if lb, ok := x.st.b.(LinearBackend); ok && autocast == Float32 && !half {
		return linearFused(lb, x, w, b, false)
	}
	x, w = linearOperands("Linear", x, w, b)
	n, in, outF := x.shape[0], x.shape[1], w.shape[0]
	be := x.st.b
	var out *Tensor
	if half {
		out = newTensor(be, BFloat16, scopeOf(x, w, b), n, outF)
	} else {
		out = Empty(be, scopeOf(x, w, b), n, outF)
	}
	p := productsFor(be, out.scope)
	// Under autocast the bfloat16 x and w are kept for the backward pass
	// (x itself when it is bfloat16 already), but not x's copy when the
	// backward pass can make it again at the cost of one pass: when the
	// operation that made x keeps x for its own backward pass (an
	// attention's output), by casting x again; when x is a unary
	// function's output (a GELU), from that function's input, which it
	// keeps.
	hx, hw := p.keepInput(x), p.keep(w.buffer())
	var remake *unaryRecipe
	// Not inside a Recompute's runs: the first keeps nothing but its
	// result, and the second's copies are read as soon as they are made.
	again := p.lowp() && recastHeld && x.Len() >= recastMin && out.scope.run == nil
	if again {
		remake = unaryMaker(x)
	}
	recastX := again && (remake != nil || x.DType() == Float32 && heldByMaker(x))
	xItself := hx.borrowed && !recastX // the bfloat16 x is what the backward pass reads
	if half {
		p.linearHalfOf(out.buffer(), hx, hw, b, n, in, outF)
	} else {
		p.linearOf(out.buffer(), hx, hw, b, n, in, outF)
	}
	if recastX {
		hx.release()
		hx = operand{f: x.buffer()} // the products cast it again
	}
	record(out, "linear", func(g *Tensor, e *engine) {
		pb := p.inScope(e.scopeFor(x))
		hxb := hx
		if remake != nil {
			hxb = operand{h: remake.half(pb)}
		}
		defer hxb.release()
		defer hw.release()
		dx, accX := e.sink(x)
		dw, accW := e.sink(w)
		linearGradsOf(pb, g, x, w, hxb, hw, dx, dw, accX, accW)
		if b != nil {
			if db, accB := e.sink(b); !db.Empty() {
				Complete(be).BiasGrad(db, g.buffer(), n, outF, 1, accB)
			}
		}
	}, x, w, b)
	saveFor(out, hx.owned(), hw.h) // freed at once when no backward pass will read them
	if p.lowp() && !xItself && (!recastX || remake != nil) {
		readsNot(out, true, x) // the bfloat16 copy is what it reads
	} else {
		readsNot(out, true)
	}
	return out
}

// ActivationLinear is Linear(act(x), w, b) for act an activation of no
// parameters (OpGELU, OpGELUTanh, OpSiLU, OpTanh or OpSigmoid): nn's
// fusion of an activation layer with the linear layer that takes its
// output. Under autocast the activation's output is only the product's
// bfloat16 operand, so it is written once, rounded (UnaryCastBackend's
// pass), instead of in float32 and then cast: the same bits each way as
// the two operations, with a float32 tensor of the activation's size
// neither written nor read, and, as for the two, the backward pass makes
// the operand again from x rather than keeping it. Otherwise it is the
// two operations.
func ActivationLinear(act UnaryOp, x, w, b *Tensor) *Tensor {
	name, ok := linearActivations[act]
	if !ok {
		panic(fmt.Sprintf("tensor: ActivationLinear of unary op %d; want GELU (either form), SiLU, tanh or sigmoid", act))
	}
	var h *Tensor
	if AutocastOf(x, w, b) == BFloat16 && x.DType() == Float32 && x.IsContiguous() && !heldChannelsLast(x) {
		h = unaryHalf(name, act, x)
	} else {
		h = unary(name, act, x, 0, 0)
	}
	y := Linear(h, w, b)
	ReleaseInput(h, y)
	return y
}

// heldChannelsLast reports whether x's memory is held channels-last.
func heldChannelsLast(x *Tensor) bool {
	_, ok := x.channelsLast()
	return ok
}

// linearActivations names the activations ActivationLinear takes.
var linearActivations = map[UnaryOp]string{OpGELU: "gelu", OpGELUTanh: "gelu_tanh", OpSiLU: "silu", OpTanh: "tanh", OpSigmoid: "sigmoid"}

// recastHeld lets Linear make again, in its backward pass, the bfloat16
// copy of an input that its maker keeps (heldByMaker) or that a unary
// function made (unaryMaker), instead of keeping it; off only in tests
// that compare the two.
var recastHeld = true

// recastMin is the fewest elements of an input whose copy Linear makes
// again rather than keeps (1 MiB of bfloat16): below it the extra launch
// costs a step more than the memory is worth (an MLP at batch 64 took 4%
// longer an epoch making its 128 KiB copies again). A variable for tests.
var recastMin = 1 << 19

// heldByMaker reports whether the operation that made x's memory (seen
// through reshapes) reads that memory in its backward pass. That pass
// runs after those of the operations that took x, so the memory outlives
// theirs unchanged.
func heldByMaker(x *Tensor) bool {
	m := makerOf(x)
	return m.node != nil && !m.node.outputUnread
}

// unaryMaker is the recipe of the unary function that made x's memory
// (seen through reshapes), or nil. Its input is read by the function's
// backward pass, which runs after those of the operations that took x.
func unaryMaker(x *Tensor) *unaryRecipe {
	if m := makerOf(x); m.node != nil && m.node.unary != nil && m.Len() == x.Len() {
		return m.node.unary
	}
	return nil
}

// makerOf is x seen through reshapes: the tensor whose node made x's
// memory.
func makerOf(x *Tensor) *Tensor {
	t := x
	for t.node != nil && t.node.op == "reshape" && len(t.node.inputs) == 1 && t.node.inputs[0].st == t.st {
		t = t.node.inputs[0]
	}
	return t
}

// LinearReLU is ReLU(Linear(x, w, b)). On a backend that implements
// LinearBackend it is one operation each way (the CUDA backend, up to 256
// rows: one launch for the product, bias and activation, one for the mask
// and the three gradients). On one that implements BiasReLUBackend the bias and the
// activation are one pass over the output, and in the backward pass the
// activation's mask and the bias gradient are one pass over the incoming
// gradient. Under autocast it is ReLU(Linear(x, w, b)) with Linear's
// bfloat16 products.
func LinearReLU(x, w, b *Tensor) *Tensor {
	be := x.st.b
	if AutocastOf(x, w, b) != Float32 {
		return linearThenReLU(x, w, b)
	}
	if lb, ok := be.(LinearBackend); ok {
		return linearFused(lb, x, w, b, true)
	}
	fb, ok := be.(BiasReLUBackend)
	if !ok || b == nil {
		return linearThenReLU(x, w, b)
	}
	x, w = linearOperands("LinearReLU", x, w, b)
	n, in, outF := x.shape[0], x.shape[1], w.shape[0]
	out := Empty(be, scopeOf(x, w, b), n, outF)
	be.MatMul(out.buffer(), x.buffer(), w.buffer(), n, outF, in, false, true, 1, 0)
	fb.AddBiasReLU(out.buffer(), b.buffer(), n, outF)
	record(out, "linear_relu", func(dy *Tensor, e *engine) {
		dx, accX := e.sink(x)
		dw, accW := e.sink(w)
		db, accB := e.sink(b)
		if dx.Empty() && dw.Empty() && db.Empty() {
			return
		}
		g := Empty(be, e.scopeFor(x), n, outF) // dy through the ReLU
		defer g.Release()
		fb.BiasReLUBackward(g.buffer(), db, dy.buffer(), out.buffer(), n, outF, accB)
		linearGrads(products{be: be}, g, x, w, dx, dw, accX, accW)
	}, x, w, b)
	return out
}

// linearThenReLU is ReLU(Linear(x, w, b)), the product given back once read
// where the scope releases early and no backward pass reads it
// (evaluation; under autocast in training too, ReleaseInput).
func linearThenReLU(x, w, b *Tensor) *Tensor {
	h := Linear(x, w, b)
	y := ReLU(h)
	ReleaseInput(h, y)
	return y
}

// linearFused is Linear (or LinearReLU, with relu) on a LinearBackend: one
// backend call each way; with relu the output masks the gradient.
func linearFused(lb LinearBackend, x, w, b *Tensor, relu bool) *Tensor {
	op, name := "Linear", "linear"
	if relu {
		op, name = "LinearReLU", "linear_relu"
	}
	x, w = linearOperands(op, x, w, b)
	n, in, outF := x.shape[0], x.shape[1], w.shape[0]
	out := Empty(x.st.b, scopeOf(x, w, b), n, outF)
	var bias Buffer
	if b != nil {
		bias = b.buffer()
	}
	lb.Linear(out.buffer(), x.buffer(), w.buffer(), bias, n, in, outF, relu)
	var mask Buffer
	if relu {
		mask = out.buffer()
	}
	record(out, name, func(g *Tensor, e *engine) {
		dx, accX := e.sink(x)
		dw, accW := e.sink(w)
		var db Buffer
		var accB bool
		if b != nil {
			db, accB = e.sink(b)
		}
		y := mask
		if e.gradMasked {
			y = Buffer{} // g came through the mask (node.reluOut)
		}
		lb.LinearGrads(dx, dw, db, g.buffer(), y, x.buffer(), w.buffer(), n, in, outF, accX, accW, accB)
	}, x, w, b)
	if relu && out.node != nil {
		out.node.reluOut = true
	}
	return out
}

// linearOperands checks the operands of a linear layer (b may be nil) and
// returns x and w contiguous.
func linearOperands(op string, x, w, b *Tensor) (*Tensor, *Tensor) {
	if len(x.shape) != 2 || len(w.shape) != 2 || x.shape[1] != w.shape[1] {
		panic(fmt.Sprintf("tensor: %s of input %v with weight %v", op, x.shape, w.shape))
	}
	if b != nil && (len(b.shape) != 1 || b.shape[0] != w.shape[0]) {
		panic(fmt.Sprintf("tensor: %s bias %v for weight %v", op, b.shape, w.shape))
	}
	sameBackend(nonNil(x, w, b)...)
	return x.Contiguous(), w.Contiguous()
}

// linearGrads queues dx = g·w and dw = gᵀ·x for a linear layer with output
// gradient g through p, each skipped when its buffer is empty and added
// when acc.
func linearGrads(p products, g, x, w *Tensor, dx, dw Buffer, accX, accW bool) {
	linearGradsOf(p, g, x, w, operand{f: x.buffer()}, operand{f: w.buffer()}, dx, dw, accX, accW)
}

// linearGradsOf is linearGrads with x and w as operands whose bfloat16
// copies the forward pass may have kept; under autocast g is cast once for
// both products.
func linearGradsOf(p products, g, x, w *Tensor, hx, hw operand, dx, dw Buffer, accX, accW bool) {
	n, in, outF := x.shape[0], x.shape[1], w.shape[0]
	if dx.Empty() && dw.Empty() {
		return
	}
	hg := operand{f: g.buffer()}
	if !dx.Empty() && !dw.Empty() {
		hg = p.keep(hg.f)
		defer hg.release()
	}
	if !dx.Empty() {
		p.matMulOf(dx, hg, hw, n, in, outF, false, false, 1, beta(accX))
	}
	if !dw.Empty() {
		p.matMulOf(dw, hg, hx, outF, in, n, true, false, 1, beta(accW))
	}
}

// ReLU returns max(x, 0).
func ReLU(x *Tensor) *Tensor {
	if out := unaryChannelsLast(x, OpReLU); out != nil {
		return out
	}
	x = x.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	Complete(be).ReLU(out.buffer(), x.buffer())
	record(out, "relu", func(dy *Tensor, e *engine) {
		dx, acc := e.sink(x)
		Complete(be).ReLUBackward(dx, dy.buffer(), out.buffer(), acc)
	}, x)
	readsNot(out, false, x) // its output is what it reads
	return out
}

// CrossEntropy returns the mean over the batch of -log softmax(logits)[label]
// for logits [n, classes] and int32 labels [n], as nn.CrossEntropyLoss with
// mean reduction. Its gradient is computed in the same pass.
func CrossEntropy(logits, labels *Tensor) *Tensor {
	if len(logits.shape) != 2 || labels.DType() != Int32 || labels.Len() != logits.shape[0] {
		panic(fmt.Sprintf("tensor: CrossEntropy of logits %v with %s labels %v", logits.shape, labels.DType(), labels.shape))
	}
	sameBackend(logits, labels)
	logits = logits.Contiguous()
	n, classes := logits.shape[0], logits.shape[1]
	be := logits.st.b
	s := scopeOf(logits, labels)
	loss := Empty(be, s, 1)
	var dlogits *Tensor
	var dbuf Buffer
	if logits.requiresGrad && s.GradEnabled() {
		dlogits = Empty(be, s, n, classes)
		dbuf = dlogits.buffer()
	}
	Complete(be).CrossEntropy(loss.buffer(), dbuf, logits.buffer(), labels.buffer(), n, classes)
	record(loss, "cross_entropy", func(g *Tensor, e *engine) {
		if g.isOne {
			e.give(logits, dlogits)
			return
		}
		dst, acc := e.sink(logits)
		Complete(be).ScaleBy(dst, dlogits.buffer(), g.buffer(), acc)
	}, logits)
	saveFor(loss, dlogits)
	return loss
}

// LinearCrossEntropy is CrossEntropy(Linear(x, w, b), labels): the mean
// cross entropy of a last linear layer's logits against int32 labels [n],
// for x [n, in], w [classes, in] and b [classes] (may be nil). On a backend
// that implements LinearCrossEntropyBackend it is one operation each way:
// the forward pass also computes the gradients of the logits and of x, and
// the backward pass those of w and b. Otherwise it is the two operations.
func LinearCrossEntropy(x, w, b, labels *Tensor) *Tensor {
	return linearCrossEntropy(x, w, b, labels, nil)
}

// LinearCrossEntropySum is LinearCrossEntropy that also adds the loss into
// sum, a float32 tensor of one element outside the graph (a running total
// on the device, such as a training epoch's), in the same operation where
// the backend fuses them.
func LinearCrossEntropySum(x, w, b, labels, sum *Tensor) *Tensor {
	if sum.DType() != Float32 || sum.Len() != 1 {
		panic(fmt.Sprintf("tensor: LinearCrossEntropySum into %s %v; want one float32", sum.DType(), sum.shape))
	}
	sameBackend(x, sum)
	return linearCrossEntropy(x, w, b, labels, sum)
}

func linearCrossEntropy(x, w, b, labels, sum *Tensor) *Tensor {
	lb, ok := x.st.b.(LinearCrossEntropyBackend)
	if !ok || AutocastOf(x, w, b, labels) != Float32 { // autocast: a bfloat16 Linear, a float32 loss
		return addedInto(sum, CrossEntropy(Linear(x, w, b), labels))
	}
	x, w = linearOperands("LinearCrossEntropy", x, w, b)
	n, in, classes := x.shape[0], x.shape[1], w.shape[0]
	if labels.DType() != Int32 || labels.Len() != n {
		panic(fmt.Sprintf("tensor: LinearCrossEntropy of input %v with %s labels %v", x.shape, labels.DType(), labels.shape))
	}
	sameBackend(x, labels)
	be := x.st.b
	s := scopeOf(x, w, b, labels)
	loss := Empty(be, s, 1)
	var dlogits, dx *Tensor
	var dlBuf, dxBuf, bias Buffer
	if s.GradEnabled() && anyRequiresGrad(x, w, b) {
		dlogits = Empty(be, s, n, classes)
		dlBuf = dlogits.buffer()
		if x.requiresGrad {
			dx = Empty(be, s, n, in)
			dxBuf = dx.buffer()
		}
	}
	var sumBuf Buffer
	if b != nil {
		bias = b.buffer()
	}
	if sum != nil {
		sumBuf = sum.buffer()
	}
	// When x is a ReLU's output (LinearReLU's), dx comes through its mask
	// at no cost here, and x's backward pass skips its own pass over it.
	reluX := dx != nil && x.node != nil && x.node.reluOut
	if !lb.LinearCrossEntropy(loss.buffer(), sumBuf, dlBuf, dxBuf, x.buffer(), w.buffer(), bias, labels.buffer(), n, in, classes, reluX) {
		for _, t := range nonNil(loss, dlogits, dx) {
			t.Release()
		}
		return addedInto(sum, CrossEntropy(Linear(x, w, b), labels))
	}
	record(loss, "linear_cross_entropy", func(g *Tensor, e *engine) {
		d := dlogits
		switch {
		case !g.isOne:
			if dx != nil {
				dst, acc := e.sinkMasked(x, reluX)
				Complete(be).ScaleBy(dst, dx.buffer(), g.buffer(), acc)
			}
			if !anyRequiresGrad(w, b) {
				return
			}
			d = Empty(be, e.scopeFor(w), n, classes)
			defer d.Release()
			Complete(be).ScaleBy(d.buffer(), dlogits.buffer(), g.buffer(), false)
		case dx != nil:
			e.giveMasked(x, dx, reluX)
		}
		dw, accW := e.sink(w)
		var db Buffer
		var accB bool
		if b != nil {
			db, accB = e.sink(b)
		}
		lastLayerGrads(be, dw, db, d, x, w, accW, accB)
	}, x, w, b)
	saveFor(loss, dlogits, dx)
	return loss
}

// addedInto adds loss into sum (when not nil) and returns loss.
func addedInto(sum, loss *Tensor) *Tensor {
	if sum != nil {
		Complete(loss.st.b).Axpy(sum.buffer(), 1, loss.buffer())
	}
	return loss
}

// lastLayerGrads queues dw = dᵀ·x and db = the sums of d's rows for a
// linear layer whose output gradient d is already known, each skipped when
// its buffer is empty and added when acc.
func lastLayerGrads(be Backend, dw, db Buffer, d, x, w *Tensor, accW, accB bool) {
	if dw.Empty() && db.Empty() {
		return
	}
	n, in, classes := x.shape[0], x.shape[1], w.shape[0]
	if lb, ok := be.(LinearBackend); ok {
		lb.LinearGrads(Buffer{}, dw, db, d.buffer(), Buffer{}, x.buffer(), w.buffer(), n, in, classes, false, accW, accB)
		return
	}
	if !dw.Empty() {
		be.MatMul(dw, d.buffer(), x.buffer(), classes, in, n, true, false, 1, beta(accW))
	}
	if !db.Empty() {
		Complete(be).BiasGrad(db, d.buffer(), n, classes, 1, accB)
	}
}

// anyRequiresGrad says whether any of ts (nil entries aside) needs a
// gradient.
func anyRequiresGrad(ts ...*Tensor) bool {
	for _, t := range ts {
		if t != nil && t.requiresGrad {
			return true
		}
	}
	return false
}

// Argmax returns, for each row of a 2-D tensor, the column of its maximum
// as an int32 tensor.
func Argmax(x *Tensor) *Tensor {
	if len(x.shape) != 2 {
		panic(fmt.Sprintf("tensor: Argmax of %v; want 2-D", x.shape))
	}
	x = x.Contiguous()
	out := EmptyOf(x.st.b, x.scope, Int32, x.shape[0])
	Complete(x.st.b).Argmax(out.buffer(), x.buffer(), x.shape[0], x.shape[1])
	return out
}

// GatherNormalize builds a float32 batch from uint8 rows: row i of the
// result is images[idx[i]]*scale + shift, shaped [len(idx), rowShape...].
// images is uint8 [N, rowShape...], idx int32 [B]. It keeps a whole dataset
// on the device as bytes and forms each batch there.
func GatherNormalize(s *Scope, images, idx *Tensor, scale, shift float32) *Tensor {
	if images.DType() != Uint8 || idx.DType() != Int32 || len(images.shape) < 2 {
		panic(fmt.Sprintf("tensor: GatherNormalize of %s %v by %s %v", images.DType(), images.shape, idx.DType(), idx.shape))
	}
	sameBackend(images, idx)
	rowShape := images.shape[1:]
	rowLen := numel(rowShape)
	shape := append([]int{idx.Len()}, rowShape...)
	out := Empty(images.st.b, s, shape...)
	Complete(images.st.b).GatherNormalize(out.buffer(), images.buffer(), idx.buffer(), rowLen, scale, shift)
	return out
}
