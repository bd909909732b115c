package tensor

import (
	"fmt"
	"slices"
)

// Pointwise operations with NumPy broadcasting and autograd, on the
// backend's strided core (Unary, Binary, Where): operands are read through
// their strides, so transposed, sliced and broadcast inputs are not copied.
// The gradient of a broadcast operand is summed back to its shape with
// Reduce.

// BroadcastShape returns the shape that a and b broadcast to under NumPy's
// rules (aligned on the right, a dimension of 1 stretches), or an error
// naming both shapes.
func BroadcastShape(a, b []int) ([]int, error) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for k := range n {
		da, db := 1, 1
		if i := k - (n - len(a)); i >= 0 {
			da = a[i]
		}
		if i := k - (n - len(b)); i >= 0 {
			db = b[i]
		}
		switch {
		case da == db || db == 1:
			out[k] = da
		case da == 1:
			out[k] = db
		default:
			return nil, fmt.Errorf("shapes %v and %v do not broadcast (dimension %d: %d against %d)", a, b, k-n, da, db)
		}
	}
	return out, nil
}

// broadcastAll is the broadcast shape of ts, panicking with the op's name.
func broadcastAll(op string, ts ...*Tensor) []int {
	shape := ts[0].Shape()
	for _, t := range ts[1:] {
		s, err := BroadcastShape(shape, t.shape)
		if err != nil {
			panic(fmt.Sprintf("tensor: %s: %v", op, err))
		}
		shape = s
	}
	return shape
}

// viewOf is t's memory as a View, its strides stretched to shape (which t
// broadcasts to): zero strides on the new leading axes and on axes where t
// has size 1.
func viewOf(t *Tensor, shape []int) View {
	t.mustBeLive()
	t.fillPendingOnes()
	strides := make([]int, len(shape))
	lead := len(shape) - len(t.shape)
	for k := range t.shape {
		if t.shape[k] != 1 {
			strides[lead+k] = t.strides[k]
		}
	}
	return View{Buf: t.st.buf.Slice(t.off, t.st.buf.Len-t.off), Strides: strides}
}

// sumTo returns g (dense, of a shape that shape broadcasts to) summed over
// the broadcast axes down to shape, as a new tensor; g itself when nothing
// is summed.
func sumTo(g *Tensor, shape []int, s *Scope) *Tensor {
	if sameShape(g.shape, shape) {
		return g
	}
	be := g.st.b
	lead := len(g.shape) - len(shape)
	want := make([]int, len(g.shape)) // shape padded with leading ones
	for k := range want {
		want[k] = 1
		if k >= lead {
			want[k] = shape[k-lead]
		}
	}
	if outer, c, inner, ok := channelForm(g.shape, want); ok {
		// A bias's gradient (NCHW over 0, 2, 3): one pass, not two Reduces.
		r := Empty(be, s, shape...)
		Complete(be).ReduceChannels(ReduceSum, r.buffer(), g.buffer(), outer, c, inner, false)
		return r
	}
	cur, curShape := g, g.Shape()
	for k := 0; k < len(curShape); {
		if want[k] != 1 || curShape[k] == 1 {
			k++
			continue
		}
		j := k // reduce the run [k, j) of adjacent broadcast axes in one call
		for j < len(curShape) && want[j] == 1 {
			j++
		}
		outer, n, inner := numel(curShape[:k]), numel(curShape[k:j]), numel(curShape[j:])
		next := slices.Clone(curShape)
		for i := k; i < j; i++ {
			next[i] = 1
		}
		r := Empty(be, s, next...)
		be.Reduce(ReduceSum, r.buffer(), cur.buffer(), outer, n, inner, false)
		if cur != g {
			cur.Release()
		}
		cur, curShape = r, next
		k = j
	}
	return cur.rawView(cur.off, slices.Clone(shape), contiguousStrides(shape))
}

// channelForm says whether summing dims down to want (the same rank, each
// axis kept or 1) keeps one run of axes and sums all those before and
// after it, both sides more than one element: [outer, c, inner] to [c].
func channelForm(dims, want []int) (outer, c, inner int, ok bool) {
	first, last := -1, -1
	for k, w := range want {
		if w != 1 {
			if first < 0 {
				first = k
			}
			last = k
		}
	}
	if first < 0 {
		return 0, 0, 0, false
	}
	for k := first; k <= last; k++ {
		if want[k] != dims[k] {
			return 0, 0, 0, false
		}
	}
	outer, c, inner = numel(dims[:first]), numel(dims[first:last+1]), numel(dims[last+1:])
	return outer, c, inner, outer > 1 && inner > 1
}

// giveSummed hands x the gradient g of a broadcast result, summed to x's
// shape; owned says whether g may be adopted (a temporary of the backward
// pass rather than the incoming gradient).
func giveSummed(e *engine, x, g *Tensor, owned bool) {
	if x == nil || !x.requiresGrad {
		if owned {
			g.Release()
		}
		return
	}
	if g.isUniform() && !owned {
		// A uniform gradient summed is uniform: its one value times the
		// elements each of x's takes (float32 rounds that product once, as
		// the float64 sums of the reductions round theirs).
		one := g.rawView(g.off, []int{1}, []int{1}) // giveUniform's view of it is what stays
		if count := g.Len() / max(x.Len(), 1); count != 1 {
			one = rawUnary(e.scopeFor(x), g.st.b, OpMulScalar, denseView(one), []int{1}, float32(count), 0)
		}
		if !giveUniform(e, x, one) && one.st != g.st {
			one.Release()
		}
		return
	}
	r := sumTo(g, x.shape, e.scopeFor(x))
	if r == g && !owned {
		e.pass(x, g)
		return
	}
	if r != g && owned {
		g.Release()
	}
	e.give(x, r)
}

// rawBinary computes op over shape from two views into a new tensor,
// recording nothing (for backward passes).
func rawBinary(s *Scope, be Backend, op BinaryOp, x, y View, shape []int) *Tensor {
	out := Empty(be, s, shape...)
	be.Binary(op, out.buffer(), x, y, shape)
	return out
}

func rawUnary(s *Scope, be Backend, op UnaryOp, x View, shape []int, a, b float32) *Tensor {
	out := Empty(be, s, shape...)
	be.Unary(op, out.buffer(), x, shape, a, b)
	return out
}

func denseView(t *Tensor) View { return viewOf(t, t.shape) }

// binary is the forward pass of a broadcasting binary operation.
func binary(name string, op BinaryOp, a, b *Tensor) (*Tensor, []int) {
	sameBackend(a, b)
	if a.DType() != Float32 || b.DType() != Float32 {
		panic(fmt.Sprintf("tensor: %s of %s %v and %s %v; want float32", name, a.DType(), a.shape, b.DType(), b.shape))
	}
	shape := broadcastAll(name, a, b)
	be := a.st.b
	out := Empty(be, scopeOf(a, b), shape...)
	be.Binary(op, out.buffer(), viewOf(a, shape), viewOf(b, shape), shape)
	return out, shape
}

// plainOperands reports whether a and b have one shape and are dense, the
// case of the backend's own Add and Mul (LeNet's path, kept bit for bit).
func plainOperands(a, b *Tensor) bool {
	return sameShape(a.shape, b.shape) && a.IsContiguous() && b.IsContiguous()
}

// addBroadcast is Add of operands of different shapes or layouts.
func addBroadcast(a, b *Tensor) *Tensor {
	out, _ := binary("Add", OpAdd, a, b)
	record(out, "add", func(g *Tensor, e *engine) {
		giveSummed(e, a, g, false)
		giveSummed(e, b, g, false)
	}, a, b)
	takesUniform(out)
	readsNot(out, true, a, b)
	return out
}

// Sub returns a - b with broadcasting.
func Sub(a, b *Tensor) *Tensor {
	out, shape := binary("Sub", OpSub, a, b)
	record(out, "sub", func(g *Tensor, e *engine) {
		giveSummed(e, a, g, false)
		if b.requiresGrad {
			giveSummed(e, b, rawUnary(e.scopeFor(b), g.st.b, OpNeg, denseView(g), shape, 0, 0), true)
		}
	}, a, b)
	return out
}

// mulBroadcast is Mul of operands of different shapes or layouts.
func mulBroadcast(a, b *Tensor) *Tensor {
	out, shape := binary("Mul", OpMul, a, b)
	record(out, "mul", func(g *Tensor, e *engine) {
		be := g.st.b
		if a.requiresGrad {
			giveSummed(e, a, rawBinary(e.scopeFor(a), be, OpMul, denseView(g), viewOf(b, shape), shape), true)
		}
		if b.requiresGrad {
			giveSummed(e, b, rawBinary(e.scopeFor(b), be, OpMul, denseView(g), viewOf(a, shape), shape), true)
		}
	}, a, b)
	return out
}

// Div returns a / b with broadcasting: da = g/b, db = -(g/b)·(a/b).
func Div(a, b *Tensor) *Tensor {
	out, shape := binary("Div", OpDiv, a, b)
	record(out, "div", func(g *Tensor, e *engine) {
		if !a.requiresGrad && !b.requiresGrad {
			return
		}
		be := g.st.b
		s := e.scopeFor(a)
		gb := rawBinary(s, be, OpDiv, denseView(g), viewOf(b, shape), shape)
		if b.requiresGrad {
			q := rawBinary(s, be, OpMul, denseView(gb), denseView(out), shape)
			be.Unary(OpNeg, q.buffer(), denseView(q), shape, 0, 0)
			giveSummed(e, b, q, true)
		}
		giveSummed(e, a, gb, true)
	}, a, b)
	return out
}

// Pow returns a^b with broadcasting: da = g·b·a^(b-1), db = g·a^b·ln a
// (NaN for a ≤ 0 where torch gives 0 at a = 0; keep a positive to
// differentiate by b).
func Pow(a, b *Tensor) *Tensor {
	out, shape := binary("Pow", OpPow, a, b)
	record(out, "pow", func(g *Tensor, e *engine) {
		be := g.st.b
		if a.requiresGrad {
			s := e.scopeFor(a)
			bm1 := rawUnary(s, be, OpAddScalar, viewOf(b, shape), shape, -1, 0)
			p := rawBinary(s, be, OpPow, viewOf(a, shape), denseView(bm1), shape)
			be.Binary(OpMul, p.buffer(), denseView(p), viewOf(b, shape), shape)
			be.Binary(OpMul, p.buffer(), denseView(p), denseView(g), shape)
			bm1.Release()
			giveSummed(e, a, p, true)
		}
		if b.requiresGrad {
			s := e.scopeFor(b)
			l := rawUnary(s, be, OpLog, viewOf(a, shape), shape, 0, 0)
			be.Binary(OpMul, l.buffer(), denseView(l), denseView(out), shape)
			be.Binary(OpMul, l.buffer(), denseView(l), denseView(g), shape)
			giveSummed(e, b, l, true)
		}
	}, a, b)
	return out
}

// Maximum returns max(a, b) elementwise with broadcasting, NaN where either
// is NaN (torch.maximum). The gradient goes to the larger operand and is
// split evenly at ties, as torch does; where a NaN is involved it is 0.
func Maximum(a, b *Tensor) *Tensor { return extremum("Maximum", OpMaximum, OpGt, OpLt, a, b) }

// Minimum returns min(a, b) elementwise, as Maximum.
func Minimum(a, b *Tensor) *Tensor { return extremum("Minimum", OpMinimum, OpLt, OpGt, a, b) }

func extremum(name string, op, wins, loses BinaryOp, a, b *Tensor) *Tensor {
	out, shape := binary(name, op, a, b)
	record(out, name, func(g *Tensor, e *engine) {
		be := g.st.b
		s := e.scopeFor(a)
		eq := rawBinary(s, be, OpEq, viewOf(a, shape), viewOf(b, shape), shape)
		be.Unary(OpMulScalar, eq.buffer(), denseView(eq), shape, 0.5, 0)
		defer eq.Release()
		for _, p := range []struct {
			x  *Tensor
			op BinaryOp
		}{{a, wins}, {b, loses}} {
			if !p.x.requiresGrad {
				continue
			}
			w := rawBinary(s, be, p.op, viewOf(a, shape), viewOf(b, shape), shape)
			be.Binary(OpAdd, w.buffer(), denseView(w), denseView(eq), shape)
			be.Binary(OpMul, w.buffer(), denseView(w), denseView(g), shape)
			giveSummed(e, p.x, w, true)
		}
	}, a, b)
	return out
}

// compare is a comparison's float32 mask (1 where true); no gradient.
func compare(name string, op BinaryOp, a, b *Tensor) *Tensor {
	out, _ := binary(name, op, a, b)
	return out
}

// Eq returns 1 where a == b, else 0 (broadcasting; no gradient).
func Eq(a, b *Tensor) *Tensor { return compare("Eq", OpEq, a, b) }

// Ne returns 1 where a != b (NaN != anything).
func Ne(a, b *Tensor) *Tensor { return compare("Ne", OpNe, a, b) }

// Lt returns 1 where a < b.
func Lt(a, b *Tensor) *Tensor { return compare("Lt", OpLt, a, b) }

// Le returns 1 where a <= b.
func Le(a, b *Tensor) *Tensor { return compare("Le", OpLe, a, b) }

// Gt returns 1 where a > b.
func Gt(a, b *Tensor) *Tensor { return compare("Gt", OpGt, a, b) }

// Ge returns 1 where a >= b.
func Ge(a, b *Tensor) *Tensor { return compare("Ge", OpGe, a, b) }

// Where returns x where cond != 0, else y (cond a float32 mask, all three
// broadcast). The gradient goes to x where cond holds and to y elsewhere;
// cond gets none.
func Where(cond, x, y *Tensor) *Tensor {
	sameBackend(cond, x, y)
	shape := broadcastAll("Where", cond, x, y)
	be := x.st.b
	out := Empty(be, scopeOf(cond, x, y), shape...)
	be.Where(out.buffer(), viewOf(cond, shape), viewOf(x, shape), viewOf(y, shape), shape)
	record(out, "where", func(g *Tensor, e *engine) {
		s := e.scopeFor(x)
		zero := Zeros(be, s, 1)
		defer zero.Release()
		z := viewOf(zero, shape)
		if x.requiresGrad {
			gx := Empty(be, s, shape...)
			be.Where(gx.buffer(), viewOf(cond, shape), denseView(g), z, shape)
			giveSummed(e, x, gx, true)
		}
		if y.requiresGrad {
			gy := Empty(be, s, shape...)
			be.Where(gy.buffer(), viewOf(cond, shape), z, denseView(g), shape)
			giveSummed(e, y, gy, true)
		}
	}, x, y)
	alsoReads(out, cond)
	return out
}

// unary applies op (parameters a, b) to x of any layout; the backward pass
// is UnaryBackward on x (a dense copy of it when x is a strided view).
func unary(name string, op UnaryOp, x *Tensor, a, b float32) *Tensor {
	if x.DType() != Float32 {
		panic(fmt.Sprintf("tensor: %s of %s %v; want float32", name, x.DType(), x.shape))
	}
	if out := unaryChannelsLast(x, op); out != nil {
		return out
	}
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	be.Unary(op, out.buffer(), denseView(x), x.shape, a, b)
	record(out, name, func(g *Tensor, e *engine) {
		xd := x.Detach()
		if !xd.IsContiguous() {
			xd = xd.copyDense(e.scopeFor(x))
			defer xd.Release()
		}
		dst, acc := e.sink(x)
		be.UnaryBackward(op, dst, g.buffer(), xd.buffer(), x.Len(), a, b, acc)
	}, x)
	readsNot(out, true) // x is what it reads
	if out.node != nil && x.IsContiguous() {
		out.node.unary = &unaryRecipe{op: op, in: x, a: a, b: b}
	}
	return out
}

// unaryHalf is unary's op(x) written once, rounded to bfloat16, as the
// operand of autocast's products (ActivationLinear): the bits of Unary
// then Cast. Its backward pass is unary's, with the incoming gradient as
// it comes (float32, not rounded: what unary's would get from the product
// that read its cast), and it has unary's recipe, so that the product
// makes its operand again instead of keeping it. x is dense float32.
func unaryHalf(name string, op UnaryOp, x *Tensor) *Tensor {
	be := x.st.b
	r := &unaryRecipe{op: op, in: x}
	out := newTensor(be, BFloat16, x.scope, x.shape...)
	r.halfInto(productsFor(be, x.scope), out)
	record(out, name, func(g *Tensor, e *engine) {
		dst, acc := e.sink(x)
		be.UnaryBackward(op, dst, g.buffer(), x.buffer(), x.Len(), 0, 0, acc)
	}, x)
	readsNot(out, true) // x is what it reads
	if out.node != nil {
		out.node.unary = r
	}
	return out
}

// unaryRecipe makes a unary function's output again from its input.
type unaryRecipe struct {
	op   UnaryOp
	in   *Tensor // dense
	a, b float32
}

// half is the function's output made again, rounded to bfloat16, in p's
// scope: one pass on a UnaryCastBackend, else Unary and then Cast, which
// give the same bits.
func (r *unaryRecipe) half(p products) *Tensor {
	h := newTensor(p.be, BFloat16, p.s, r.in.Len())
	r.halfInto(p, h)
	return h
}

// halfInto writes half's values into h (BFloat16, r.in's length).
func (r *unaryRecipe) halfInto(p products, h *Tensor) {
	n := r.in.Len()
	if ub, ok := p.be.(UnaryCastBackend); ok {
		ub.UnaryCast(r.op, h.buffer(), r.in.buffer(), n, r.a, r.b)
		return
	}
	f := Empty(p.be, p.s, n)
	defer f.Release()
	p.be.Unary(r.op, f.buffer(), denseView(r.in), r.in.shape, r.a, r.b)
	p.lp.Cast(h.buffer(), f.buffer())
}

// Neg returns -x.
func Neg(x *Tensor) *Tensor { return unary("neg", OpNeg, x, 0, 0) }

// Abs returns |x|; its gradient is 0 at 0, as torch's.
func Abs(x *Tensor) *Tensor { return unary("abs", OpAbs, x, 0, 0) }

// Exp returns e^x.
func Exp(x *Tensor) *Tensor { return unary("exp", OpExp, x, 0, 0) }

// Log returns ln x.
func Log(x *Tensor) *Tensor { return unary("log", OpLog, x, 0, 0) }

// Sqrt returns √x.
func Sqrt(x *Tensor) *Tensor { return unary("sqrt", OpSqrt, x, 0, 0) }

// Rsqrt returns 1/√x (divided, not approximated, on every backend).
func Rsqrt(x *Tensor) *Tensor { return unary("rsqrt", OpRsqrt, x, 0, 0) }

// Reciprocal returns 1/x.
func Reciprocal(x *Tensor) *Tensor { return unary("reciprocal", OpRecip, x, 0, 0) }

// Square returns x².
func Square(x *Tensor) *Tensor { return unary("square", OpSquare, x, 0, 0) }

// Tanh returns tanh x.
func Tanh(x *Tensor) *Tensor { return unary("tanh", OpTanh, x, 0, 0) }

// Sigmoid returns 1/(1+e^-x).
func Sigmoid(x *Tensor) *Tensor { return unary("sigmoid", OpSigmoid, x, 0, 0) }

// LeakyReLU returns x where x > 0, else slope·x (nn.LeakyReLU; torch's
// default slope is 0.01).
func LeakyReLU(x *Tensor, slope float32) *Tensor {
	return unary("leaky_relu", OpLeakyReLU, x, slope, 0)
}

// GELU returns x·Φ(x) (Φ the standard normal CDF, by erf), or its tanh
// approximation when approximateTanh (nn.GELU(approximate="tanh")).
func GELU(x *Tensor, approximateTanh bool) *Tensor {
	if approximateTanh {
		return unary("gelu_tanh", OpGELUTanh, x, 0, 0)
	}
	return unary("gelu", OpGELU, x, 0, 0)
}

// SiLU returns x·sigmoid(x).
func SiLU(x *Tensor) *Tensor { return unary("silu", OpSiLU, x, 0, 0) }

// Clamp returns min(max(x, lo), hi) (NaN stays NaN); the gradient passes
// on the closed interval [lo, hi], as torch.clamp's.
func Clamp(x *Tensor, lo, hi float32) *Tensor {
	if lo > hi {
		panic(fmt.Sprintf("tensor: Clamp of %v to [%g, %g]: empty interval", x.shape, lo, hi))
	}
	return unary("clamp", OpClamp, x, lo, hi)
}

// PowScalar returns x^p.
func PowScalar(x *Tensor, p float32) *Tensor { return unary("pow_scalar", OpPowScalar, x, p, 0) }

// AddScalar returns x + c.
func AddScalar(x *Tensor, c float32) *Tensor { return unary("add_scalar", OpAddScalar, x, c, 0) }

// AddScalarInPlace adds c to each element of x, a contiguous float32
// tensor outside autograd (a counter, running statistics): one pass over
// x's memory, where CopyTensor(x, AddScalar(x, c)) writes a new tensor
// and copies it back. It panics where x takes part in autograd.
func AddScalarInPlace(x *Tensor, c float32) {
	if x.DType() != Float32 || !x.IsContiguous() || x.requiresGrad || x.node != nil {
		panic(fmt.Sprintf("tensor: AddScalarInPlace of %s %v (requires grad %v, contiguous %v); want a contiguous float32 tensor outside autograd",
			x.DType(), x.shape, x.requiresGrad || x.node != nil, x.IsContiguous()))
	}
	x.st.b.Unary(OpAddScalar, x.buffer(), denseView(x), x.shape, c, 0)
}

// MulScalar returns x·c.
func MulScalar(x *Tensor, c float32) *Tensor { return unary("mul_scalar", OpMulScalar, x, c, 0) }

// Scale is MulScalar.
func Scale(x *Tensor, c float32) *Tensor { return MulScalar(x, c) }

// Affine returns x·a + b (two roundings).
func Affine(x *Tensor, a, b float32) *Tensor { return unary("affine", OpAffine, x, a, b) }

// Sin returns sin x.
func Sin(x *Tensor) *Tensor { return unary("sin", OpSin, x, 0, 0) }

// Cos returns cos x.
func Cos(x *Tensor) *Tensor { return unary("cos", OpCos, x, 0, 0) }
