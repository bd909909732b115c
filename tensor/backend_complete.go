package tensor

import (
	"fmt"
	"math"
)

// CompleteBackend is a Backend with every optional interface whose
// operations the core can also express: what the tensor layer, package
// optim and package nn call for these operations, through Complete.
type CompleteBackend interface {
	Backend
	ArithmeticBackend
	BiasBackend
	ChannelReduceBackend
	MaxPoolBackend
	CrossEntropyBackend
	SGDBackend
	GatherBackend
}

// Complete returns b itself when it implements CompleteBackend (the CPU
// and CUDA backends: their own kernels, unchanged), else b behind a
// wrapper that runs each operation with b's own implementation where b has
// that interface and with a fallback composed from the core otherwise.
// The fallbacks give the results of the CPU's kernels up to the order of
// sums; each type's doc comment says how it is composed.
func Complete(b Backend) CompleteBackend {
	if c, ok := b.(CompleteBackend); ok {
		return c
	}
	return composed{b}
}

// composed is Complete's wrapper: the core of a Backend, and the optional
// interfaces composed from it.
type composed struct{ Backend }

// scratch returns n float32 elements of b for a fallback's intermediate;
// an allocation failure is a device failure (a panic, as the operations').
func scratch(b Backend, n int) Buffer {
	buf, err := b.Alloc(n, Float32)
	if err != nil {
		panic(err)
	}
	return buf
}

// flat is the one-dimensional view of a dense buffer; scalar repeats
// element 0 of s over a one-dimensional shape.
func flat(b Buffer) View   { return View{Buf: b, Strides: []int{1}} }
func scalar(s Buffer) View { return View{Buf: s, Strides: []int{0}} }

func (c composed) Add(dst, a, b Buffer) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.Add(dst, a, b)
		return
	}
	c.Binary(OpAdd, dst, flat(a), flat(b), []int{dst.Len})
}

func (c composed) Mul(dst, a, b Buffer) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.Mul(dst, a, b)
		return
	}
	c.Binary(OpMul, dst, flat(a), flat(b), []int{dst.Len})
}

func (c composed) Axpy(dst Buffer, alpha float32, x Buffer) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.Axpy(dst, alpha, x)
		return
	}
	shape := []int{dst.Len}
	if alpha == 1 { // gradient accumulation: no product to round
		c.CopyView(flat(dst), flat(x), shape, true)
		return
	}
	t := scratch(c.Backend, dst.Len)
	defer c.Free(t)
	c.Unary(OpMulScalar, t, flat(x), shape, alpha, 0)
	c.CopyView(flat(dst), flat(t), shape, true)
}

func (c composed) ScaleBy(dst, x, s Buffer, accumulate bool) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.ScaleBy(dst, x, s, accumulate)
		return
	}
	shape := []int{dst.Len}
	if !accumulate {
		c.Binary(OpMul, dst, flat(x), scalar(s), shape)
		return
	}
	t := scratch(c.Backend, dst.Len)
	defer c.Free(t)
	c.Binary(OpMul, t, flat(x), scalar(s), shape)
	c.CopyView(flat(dst), flat(t), shape, true)
}

func (c composed) Sum(dst, x Buffer) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.Sum(dst, x)
		return
	}
	c.Reduce(ReduceSum, dst, x, 1, x.Len, 1, false)
}

func (c composed) Broadcast(dst, s Buffer, accumulate bool) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.Broadcast(dst, s, accumulate)
		return
	}
	c.CopyView(flat(dst), scalar(s), []int{dst.Len}, accumulate)
}

func (c composed) ReLU(y, x Buffer) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.ReLU(y, x)
		return
	}
	c.Unary(OpReLU, y, flat(x), []int{y.Len}, 0, 0)
}

// ReLUBackward is OpReLU's UnaryBackward at y instead of x: y > 0 exactly
// where x > 0, and the gradient is a selection, not a product, so an
// infinite dy where y = 0 still gives 0.
func (c composed) ReLUBackward(dx, dy, y Buffer, accumulate bool) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.ReLUBackward(dx, dy, y, accumulate)
		return
	}
	c.UnaryBackward(OpReLU, dx, dy, y, dx.Len, 0, 0, accumulate)
}

func (c composed) Argmax(dst, x Buffer, rows, cols int) {
	if f, ok := c.Backend.(ArithmeticBackend); ok {
		f.Argmax(dst, x, rows, cols)
		return
	}
	c.Reduce(ReduceArgmax, dst, x, rows, cols, 1, false)
}

// AddBias adds the bias through a view that repeats it over the outer and
// inner axes, in place (Binary reads each element before writing it).
func (c composed) AddBias(y, bias Buffer, outer, channels, inner int) {
	if f, ok := c.Backend.(BiasBackend); ok {
		f.AddBias(y, bias, outer, channels, inner)
		return
	}
	shape := []int{outer, channels, inner}
	c.Binary(OpAdd, y, Dense(y, shape), View{Buf: bias, Strides: []int{0, 1, 0}}, shape)
}

// BiasGrad sums the inner axis, then the outer one (Reduce takes one run
// of adjacent axes at a time).
func (c composed) BiasGrad(db, dy Buffer, outer, channels, inner int, accumulate bool) {
	if f, ok := c.Backend.(BiasBackend); ok {
		f.BiasGrad(db, dy, outer, channels, inner, accumulate)
		return
	}
	switch {
	case inner == 1:
		c.Reduce(ReduceSum, db, dy, 1, outer, channels, accumulate)
	case outer == 1:
		c.Reduce(ReduceSum, db, dy, channels, inner, 1, accumulate)
	default:
		t := scratch(c.Backend, outer*channels)
		defer c.Free(t)
		c.Reduce(ReduceSum, t, dy, outer*channels, inner, 1, false)
		c.Reduce(ReduceSum, db, t, 1, outer, channels, accumulate)
	}
}

// ReduceChannels without a ChannelReduceBackend reduces the inner rows,
// then the outer columns of their results (for a mean, the mean of
// equal-sized means: two roundings instead of one).
func (c composed) ReduceChannels(op ReduceOp, dst, x Buffer, outer, channels, inner int, accumulate bool) {
	if f, ok := c.Backend.(ChannelReduceBackend); ok {
		f.ReduceChannels(op, dst, x, outer, channels, inner, accumulate)
		return
	}
	if op != ReduceSum && op != ReduceMean {
		panic(fmt.Sprintf("tensor: ReduceChannels: op %d (sums and means only)", op))
	}
	switch {
	case inner == 1:
		c.Reduce(op, dst, x, 1, outer, channels, accumulate)
	case outer == 1:
		c.Reduce(op, dst, x, channels, inner, 1, accumulate)
	default:
		t := scratch(c.Backend, outer*channels)
		defer c.Free(t)
		c.Reduce(op, t, x, outer*channels, inner, 1, false)
		c.Reduce(op, dst, t, 1, outer, channels, accumulate)
	}
}

// MaxPool2d without a MaxPoolBackend gathers the window's KH·KW taps of
// every output into taps [KH·KW, outputs] (one strided CopyView per tap,
// padding left at -Inf), so that the maxima are one Reduce over the first
// axis and the first of them in row-major order is its ReduceArgmax. The
// argmax pass reads the inputs clamped to -MaxFloat32, so that a window of
// -Inf inputs does not pick a padding tap before them (-Inf then ties with
// -MaxFloat32: the one case where the position may differ from the
// kernel's). The core has no integer arithmetic, so the taps' indices are
// turned into positions in the plane on the host: one small download and
// upload, which wait for the device.
func (c composed) MaxPool2d(y, argmax, x Buffer, g PoolGeom) {
	if f, ok := c.Backend.(MaxPoolBackend); ok {
		f.MaxPool2d(y, argmax, x, g)
		return
	}
	planes, oh, ow := g.N*g.C, g.OutH(), g.OutW()
	outs, taps := planes*oh*ow, g.KH*g.KW
	if outs == 0 {
		return
	}
	if taps <= 0 || g.StrideH <= 0 || g.StrideW <= 0 {
		panic(fmt.Sprintf("tensor: MaxPool2d with a %dx%d window, strides %d,%d", g.KH, g.KW, g.StrideH, g.StrideW))
	}
	t := scratch(c.Backend, taps*outs)
	defer c.Free(t)
	gather := func(src Buffer) {
		c.Fill(t, float32(math.Inf(-1)))
		for r := range g.KH {
			i0, i1 := tapRange(r, g.PadH, g.StrideH, g.H, oh)
			for s := range g.KW {
				j0, j1 := tapRange(s, g.PadW, g.StrideW, g.W, ow)
				if i0 >= i1 || j0 >= j1 {
					continue
				}
				k := r*g.KW + s
				dst := View{Buf: t.Slice(k*outs+i0*ow+j0, outs-i0*ow-j0), Strides: []int{oh * ow, ow, 1}}
				at := (i0*g.StrideH-g.PadH+r)*g.W + j0*g.StrideW - g.PadW + s
				from := View{Buf: src.Slice(at, src.Len-at), Strides: []int{g.H * g.W, g.StrideH * g.W, g.StrideW}}
				c.CopyView(dst, from, []int{planes, i1 - i0, j1 - j0}, false)
			}
		}
	}
	gather(x)
	c.Reduce(ReduceMax, y, t, 1, taps, outs, false)
	clamped := scratch(c.Backend, x.Len)
	defer c.Free(clamped)
	c.Unary(OpClamp, clamped, flat(x), []int{x.Len}, -math.MaxFloat32, float32(math.Inf(1)))
	gather(clamped)
	c.Reduce(ReduceArgmax, argmax, t, 1, taps, outs, false)
	pos := make([]int32, outs)
	c.Download(pos, argmax)
	for o, k := range pos {
		i, j := o/ow%oh, o%ow
		r, s := int(k)/g.KW, int(k)%g.KW
		pos[o] = int32((i*g.StrideH-g.PadH+r)*g.W + j*g.StrideW - g.PadW + s)
	}
	c.Upload(argmax, pos)
}

// tapRange is the range [lo, hi) of output rows (or columns) whose tap r
// of the window falls inside the input's n rows: lo·stride - pad + r >= 0
// and (hi-1)·stride - pad + r < n.
func tapRange(r, pad, stride, n, out int) (lo, hi int) {
	lo = max(0, (pad-r+stride-1)/stride)
	if pad-r <= 0 {
		lo = 0
	}
	hi = min(out, (n-1+pad-r)/stride+1)
	if n-1+pad-r < 0 {
		hi = 0
	}
	return lo, max(lo, hi)
}

// MaxPool2dBackward without a MaxPoolBackend: one IndexAdd per plane (the
// argmax positions are relative to their plane, and IndexAdd's indices are
// shared by its outer rows).
func (c composed) MaxPool2dBackward(dx, dy, argmax Buffer, g PoolGeom, accumulate bool) {
	if f, ok := c.Backend.(MaxPoolBackend); ok {
		f.MaxPool2dBackward(dx, dy, argmax, g, accumulate)
		return
	}
	if !accumulate {
		c.Fill(dx, 0)
	}
	planes, hw, ohw := g.N*g.C, g.H*g.W, g.OutH()*g.OutW()
	if ohw == 0 {
		return
	}
	for p := range planes {
		c.IndexAdd(dx.Slice(p*hw, hw), dy.Slice(p*ohw, ohw), argmax.Slice(p*ohw, ohw), 1, hw, 1)
	}
}

// CrossEntropy without a CrossEntropyBackend: ClassLoss when the backend
// has it (the same loss), else log-softmax and a one-hot matrix gathered
// from the identity by the labels (so that no label is read on the host).
func (c composed) CrossEntropy(loss, dlogits, logits, labels Buffer, n, classes int) {
	if f, ok := c.Backend.(CrossEntropyBackend); ok {
		f.CrossEntropy(loss, dlogits, logits, labels, n, classes)
		return
	}
	if f, ok := c.Backend.(ClassLossBackend); ok {
		f.ClassLoss(loss, dlogits, logits, labels, ClassLossSpec{Outer: n, Classes: classes, Inner: 1})
		return
	}
	if n <= 0 || classes <= 0 {
		panic(fmt.Sprintf("tensor: CrossEntropy of %d rows of %d classes", n, classes))
	}
	eye := make([]float32, classes*classes)
	for k := range classes {
		eye[k*classes+k] = 1
	}
	id := scratch(c.Backend, classes*classes)
	defer c.Free(id)
	c.Upload(id, eye)
	onehot := scratch(c.Backend, n*classes)
	defer c.Free(onehot)
	c.IndexSelect(onehot, id, labels, 1, classes, classes)
	logp := scratch(c.Backend, n*classes)
	defer c.Free(logp)
	c.Softmax(logp, logits, n, classes, 1, true)
	shape := []int{n * classes}
	picked := scratch(c.Backend, n*classes)
	defer c.Free(picked)
	// Selected, not multiplied: a -Inf logit of another class would make
	// 0·(-Inf) = NaN where the kernel's loss is finite.
	zero := scratch(c.Backend, 1)
	defer c.Free(zero)
	c.Fill(zero, 0)
	c.Where(picked, flat(onehot), flat(logp), View{Buf: zero, Strides: []int{0}}, shape)
	c.Reduce(ReduceSum, loss, picked, 1, n*classes, 1, false)
	c.Unary(OpMulScalar, loss, flat(loss), []int{1}, -1/float32(n), 0)
	if dlogits.Empty() {
		return
	}
	c.Unary(OpExp, dlogits, flat(logp), shape, 0, 0)
	c.Binary(OpSub, dlogits, flat(dlogits), flat(onehot), shape)
	c.Unary(OpMulScalar, dlogits, flat(dlogits), shape, 1/float32(n), 0)
}

// SGD without an SGDBackend: the CPU kernel's operations in its order, one
// elementwise pass each, so that every rounding is the kernel's.
func (c composed) SGD(p, g, v Buffer, h SGDStep) {
	if f, ok := c.Backend.(SGDBackend); ok {
		f.SGD(p, g, v, h)
		return
	}
	n := p.Len
	shape := []int{n}
	t := scratch(c.Backend, n)
	defer c.Free(t)
	d := g // the step direction; it becomes t once g must not change
	if h.WeightDecay != 0 {
		c.Unary(OpMulScalar, t, flat(p), shape, h.WeightDecay, 0)
		c.Binary(OpAdd, t, flat(g), flat(t), shape)
		d = t
	}
	if h.Momentum != 0 {
		switch {
		case h.FirstStep:
			c.Copy(v, d)
		case h.Dampening == 0:
			c.Unary(OpMulScalar, v, flat(v), shape, h.Momentum, 0)
			c.Binary(OpAdd, v, flat(v), flat(d), shape)
		default:
			u := scratch(c.Backend, n)
			defer c.Free(u)
			c.Unary(OpMulScalar, u, flat(d), shape, 1-h.Dampening, 0)
			c.Unary(OpMulScalar, v, flat(v), shape, h.Momentum, 0)
			c.Binary(OpAdd, v, flat(v), flat(u), shape)
		}
		if h.Nesterov { // d + momentum·v, into t (d is g or t)
			u := scratch(c.Backend, n)
			defer c.Free(u)
			c.Unary(OpMulScalar, u, flat(v), shape, h.Momentum, 0)
			c.Binary(OpAdd, t, flat(d), flat(u), shape)
			d = t
		} else {
			d = v
		}
	}
	c.Unary(OpMulScalar, t, flat(d), shape, h.LR, 0)
	c.Binary(OpSub, p, flat(p), flat(t), shape)
	if h.ZeroGrad {
		c.Fill(g, 0)
	}
}

// GatherNormalize without a GatherBackend: on the host, as GatherBackend
// says.
func (c composed) GatherNormalize(dst, src, idx Buffer, rowLen int, scale, shift float32) {
	if f, ok := c.Backend.(GatherBackend); ok {
		f.GatherNormalize(dst, src, idx, rowLen, scale, shift)
		return
	}
	ix := make([]int32, idx.Len)
	c.Download(ix, idx)
	rows := 0
	if rowLen > 0 {
		rows = src.Len / rowLen
	}
	out := make([]float32, len(ix)*rowLen)
	row := make([]uint8, rowLen)
	for i, r := range ix {
		if r < 0 || int(r) >= rows {
			panic(fmt.Sprintf("tensor: GatherNormalize: index %d at %d outside [0, %d)", r, i, rows))
		}
		c.Download(row, src.Slice(int(r)*rowLen, rowLen))
		for j, v := range row {
			out[i*rowLen+j] = float32(v)*scale + shift
		}
	}
	c.Upload(dst, out)
}
