package tensor

import "fmt"

// Convolutions with autograd: the LeNet forms (one stride and padding,
// fused ReLU and pooling) and the general Conv2dWith.

// Conv2d convolves x [N,C,H,W] with w [K,C,R,S] and adds b [K] (may be nil),
// as nn.Conv2d with the given stride and zero padding.
func Conv2d(x, w, b *Tensor, stride, pad int) *Tensor { return conv2d(x, w, b, stride, pad, false) }

// Conv2dReLU is ReLU(Conv2d(x, w, b, stride, pad)) computed in one pass:
// the backend applies the activation as it writes the convolution's output,
// so the pre-activation is never stored.
func Conv2dReLU(x, w, b *Tensor, stride, pad int) *Tensor { return conv2d(x, w, b, stride, pad, true) }

func conv2d(x, w, b *Tensor, stride, pad int, relu bool) *Tensor {
	x, w, g := convGeomOf(x, w, b, stride, pad, relu)
	return convolve(x, w, b, g)
}

// ConvOptions are the settings of a general convolution, each pair
// (height, width) as nn.Conv2d's. Zero values are PyTorch's defaults:
// stride 1, no padding, dilation 1, one group.
type ConvOptions struct {
	Stride   [2]int
	Padding  [2]int
	Dilation [2]int
	// Groups splits the C input and K output channels into groups
	// convolved separately; the weight is then [K, C/Groups, R, S]. C for
	// a depthwise convolution.
	Groups int
}

// Conv2dWith convolves x [N,C,H,W] with w [K,C/Groups,R,S] and adds b [K]
// (may be nil), as nn.Conv2d with the options o (rectangular kernels,
// strides, zero paddings and dilations per axis, and groups).
func Conv2dWith(x, w, b *Tensor, o ConvOptions) *Tensor {
	x, w, g := convGeomWith("Conv2dWith", x, w, b, o, false)
	return convolve(x, w, b, g)
}

// Conv2dWithReLU is ReLU(Conv2dWith(x, w, b, o)) in one pass, as
// Conv2dReLU is for the one-stride form: the pre-activation is never
// stored.
func Conv2dWithReLU(x, w, b *Tensor, o ConvOptions) *Tensor {
	x, w, g := convGeomWith("Conv2dWithReLU", x, w, b, o, true)
	return convolve(x, w, b, g)
}

// convolve records Conv2d's forward and backward for a checked geometry.
func convolve(x, w, b *Tensor, g ConvGeom) *Tensor {
	be := x.st.b
	s := scopeOf(x, w, b)
	if lb, ok := be.(LowPrecisionConvBackend); ok && s.Autocast() == BFloat16 && lb.ConvLowp(g) {
		return convolveLowp(lb, s, x, w, b, g)
	}
	out := Empty(be, s, g.N, g.K, g.OutH(), g.OutW())
	var bias Buffer
	if b != nil {
		bias = b.buffer()
	}
	be.Conv2d(out.buffer(), x.buffer(), w.buffer(), bias, g)
	record(out, "conv2d", func(dy *Tensor, e *engine) {
		var y Buffer
		if g.ReLU { // the backend masks dy by the output itself
			y = out.buffer()
		}
		dxBuf, dx := convInputSink(e, x, w)
		var db Buffer
		if b != nil {
			db = e.sinkZeroed(b)
		}
		be.Conv2dBackward(dxBuf, e.sinkZeroed(w), db, dy.buffer(), x.buffer(), w.buffer(), y, g)
		if dx != nil {
			e.pass(x, dx)
			dx.Release() // the addition is queued
		}
	}, x, w, b)
	if !g.ReLU {
		readsNot(out, true) // x and w are what it reads
	}
	return out
}

// convolveLowp is convolve under autocast: the backend rounds x, w and the
// incoming gradient to bfloat16 as it convolves (nothing bfloat16 is kept
// between the passes, as for the matrix products); the output and the
// gradients are float32.
func convolveLowp(lb LowPrecisionConvBackend, s *Scope, x, w, b *Tensor, g ConvGeom) *Tensor {
	be := x.st.b
	if cl, ok := channelsLastOf(be, s); ok && channelsLastChannels(g.K) && cl.ConvChannelsLast(g) {
		return convolveChannelsLast(cl, s, x, w, b, g)
	}
	out := Empty(be, s, g.N, g.K, g.OutH(), g.OutW())
	var bias Buffer
	if b != nil {
		bias = b.buffer()
	}
	lb.Conv2dLowp(out.buffer(), x.buffer(), w.buffer(), bias, g)
	record(out, "conv2d_lowp", func(dy *Tensor, e *engine) {
		var y Buffer
		if g.ReLU {
			y = out.buffer()
		}
		dxBuf, dx := convInputSink(e, x, w)
		var db Buffer
		if b != nil {
			db = e.sinkZeroed(b)
		}
		lb.Conv2dBackwardLowp(dxBuf, e.sinkZeroed(w), db, dy.buffer(), x.buffer(), w.buffer(), y, g)
		if dx != nil {
			e.pass(x, dx)
			dx.Release() // the addition is queued
		}
	}, x, w, b)
	if !g.ReLU {
		readsNot(out, true) // x and w are what it reads
	}
	return out
}

// convInputSink is where a convolution's backward writes the input
// gradient: x's own gradient buffer, or, when that one accumulates (the
// backends overwrite dx), a fresh tensor dx to pass on afterwards.
func convInputSink(e *engine, x, w *Tensor) (Buffer, *Tensor) {
	if x == w && x.requiresGrad {
		// One tensor as input and weight: the weight's gradient is added
		// into its sink, so the input's goes through a temporary.
		dx := Empty(x.st.b, e.scopeFor(x), x.shape...)
		return dx.buffer(), dx
	}
	dxBuf, acc := e.sink(x)
	if !acc {
		return dxBuf, nil
	}
	dx := Empty(x.st.b, e.scopeFor(x), x.shape...)
	return dx.buffer(), dx
}

// Conv2dReLUMaxPool is MaxPool2d(Conv2dReLU(x, w, b, stride, pad), k, k):
// convolution, bias, ReLU and max pooling over disjoint k×k windows. On a
// backend that implements ConvPoolBackend it is one operation that stores
// only the pooled output and the positions of the maxima; elsewhere it is
// the two operations. Under bf16 autocast, where the backend runs the
// convolution in bf16, it is the two operations too, so that the fused
// float32 kernel does not silently keep the convolution in float32.
func Conv2dReLUMaxPool(x, w, b *Tensor, stride, pad, k int) *Tensor {
	fb, ok := x.st.b.(ConvPoolBackend)
	if !ok {
		return MaxPool2d(Conv2dReLU(x, w, b, stride, pad), k, k)
	}
	x, w, g := convGeomOf(x, w, b, stride, pad, true)
	if lb, low := x.st.b.(LowPrecisionConvBackend); low && scopeOf(x, w, b).Autocast() == BFloat16 && lb.ConvLowp(g) {
		return MaxPool2d(convolve(x, w, b, g), k, k)
	}
	p := PoolGeom{N: g.N, C: g.K, H: g.OutH(), W: g.OutW(), KH: k, KW: k, StrideH: k, StrideW: k}
	if k < 1 || p.OutH() < 1 || p.OutW() < 1 {
		panic(fmt.Sprintf("tensor: MaxPool2d window %d stride %d on %v", k, k, []int{p.N, p.C, p.H, p.W}))
	}
	be := x.st.b
	s := scopeOf(x, w, b)
	out := Empty(be, s, p.N, p.C, p.OutH(), p.OutW())
	argmax := EmptyOf(be, s, Int32, out.shape...)
	var bias Buffer
	if b != nil {
		bias = b.buffer()
	}
	fb.Conv2dReLUMaxPool(out.buffer(), argmax.buffer(), x.buffer(), w.buffer(), bias, g, p)
	record(out, "conv2d_relu_maxpool", func(dy *Tensor, e *engine) {
		dxBuf, dx := convInputSink(e, x, w)
		var db Buffer
		if b != nil {
			db = e.sinkZeroed(b)
		}
		fb.Conv2dReLUMaxPoolBackward(dxBuf, e.sinkZeroed(w), db, dy.buffer(), x.buffer(), w.buffer(), out.buffer(), argmax.buffer(), g, p)
		if dx != nil {
			e.pass(x, dx)
			dx.Release() // the addition is queued
		}
	}, x, w, b)
	saveFor(out, argmax)
	return out
}

// convGeomOf checks the operands of a convolution with one stride and
// padding for both axes and returns them contiguous with the geometry.
func convGeomOf(x, w, b *Tensor, stride, pad int, relu bool) (*Tensor, *Tensor, ConvGeom) {
	if stride < 1 || pad < 0 {
		panic(fmt.Sprintf("tensor: Conv2d stride %d, padding %d", stride, pad))
	}
	return convGeomWith("Conv2d", x, w, b, ConvOptions{Stride: [2]int{stride, stride}, Padding: [2]int{pad, pad}}, relu)
}

// convGeomWith checks the operands and options of convolution op and
// returns x and w contiguous with the geometry.
func convGeomWith(op string, x, w, b *Tensor, o ConvOptions, relu bool) (*Tensor, *Tensor, ConvGeom) {
	groups := max(o.Groups, 1)
	if len(x.shape) != 4 || len(w.shape) != 4 || o.Groups < 0 || x.shape[1] != w.shape[1]*groups || w.shape[0]%groups != 0 {
		panic(fmt.Sprintf("tensor: %s of input %v with weight %v in %d groups", op, x.shape, w.shape, groups))
	}
	if b != nil && (len(b.shape) != 1 || b.shape[0] != w.shape[0]) {
		panic(fmt.Sprintf("tensor: %s bias %v for weight %v", op, b.shape, w.shape))
	}
	stride, dil := o.Stride, o.Dilation
	for i := range 2 {
		if stride[i] == 0 {
			stride[i] = 1
		}
		if dil[i] == 0 {
			dil[i] = 1
		}
	}
	if stride[0] < 1 || stride[1] < 1 || o.Padding[0] < 0 || o.Padding[1] < 0 || dil[0] < 1 || dil[1] < 1 {
		panic(fmt.Sprintf("tensor: %s stride %v, padding %v, dilation %v", op, o.Stride, o.Padding, o.Dilation))
	}
	sameBackend(nonNil(x, w, b)...)
	x, w = x.Contiguous(), w.Contiguous()
	g := ConvGeom{N: x.shape[0], C: x.shape[1], H: x.shape[2], W: x.shape[3],
		K: w.shape[0], R: w.shape[2], S: w.shape[3], StrideH: stride[0], StrideW: stride[1],
		PadH: o.Padding[0], PadW: o.Padding[1], ReLU: relu}
	if !(dil == [2]int{1, 1} && groups == 1) { // plain geometries keep their zero values
		g.DilationH, g.DilationW, g.Groups = dil[0], dil[1], groups
	}
	if g.OutH() < 1 || g.OutW() < 1 {
		panic(fmt.Sprintf("tensor: %s kernel %dx%d (dilation %v) larger than padded input %dx%d",
			op, g.R, g.S, dil, g.H+2*g.PadH, g.W+2*g.PadW))
	}
	return x, w, g
}
