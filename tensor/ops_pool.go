package tensor

import "fmt"

// Pooling with autograd: max and average pooling over sliding windows (with
// padding and ceil mode), and adaptive pooling to a given output size, as
// torch.nn's MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and AdaptiveMaxPool2d.

// MaxPool2d takes the maximum over k×k windows moved by stride, as
// nn.MaxPool2d without padding. The positions of the maxima are kept for
// the backward pass.
func MaxPool2d(x *Tensor, k, stride int) *Tensor {
	if k < 1 || stride < 1 {
		panic(fmt.Sprintf("tensor: MaxPool2d window %d stride %d on %v", k, stride, x.shape))
	}
	return MaxPool2dWith(x, PoolOptions{Kernel: [2]int{k, k}, Stride: [2]int{stride, stride}})
}

// PoolOptions are the window settings of a pooling, each pair (height,
// width) as torch's.
type PoolOptions struct {
	Kernel [2]int
	// Stride zero is the kernel size (torch's default: disjoint windows).
	Stride [2]int
	// Padding is implicit: -inf for the maximum, zeros for the average. At
	// most half the kernel, as torch requires, so that every window holds
	// an input element.
	Padding [2]int
	// CeilMode rounds the output size up (torch's ceil_mode).
	CeilMode bool
}

// poolGeomOf checks x and o for pooling op and returns x contiguous with
// the geometry.
func poolGeomOf(op string, x *Tensor, o PoolOptions) (*Tensor, PoolGeom) {
	if len(x.shape) != 4 {
		panic(fmt.Sprintf("tensor: %s of %v; want [N,C,H,W]", op, x.shape))
	}
	stride := o.Stride
	if stride == [2]int{} {
		stride = o.Kernel
	}
	k, p := o.Kernel, o.Padding
	if k[0] < 1 || k[1] < 1 || stride[0] < 1 || stride[1] < 1 || p[0] < 0 || p[1] < 0 || 2*p[0] > k[0] || 2*p[1] > k[1] {
		panic(fmt.Sprintf("tensor: %s window %v stride %v padding %v on %v (padding at most half the window)", op, k, stride, p, x.shape))
	}
	g := PoolGeom{N: x.shape[0], C: x.shape[1], H: x.shape[2], W: x.shape[3], KH: k[0], KW: k[1],
		StrideH: stride[0], StrideW: stride[1], PadH: p[0], PadW: p[1], CeilMode: o.CeilMode}
	if g.OutH() < 1 || g.OutW() < 1 {
		panic(fmt.Sprintf("tensor: %s window %v stride %v padding %v larger than the input %v", op, k, stride, p, x.shape))
	}
	return x.Contiguous(), g
}

// MaxPool2dWith is nn.MaxPool2d with the options o. The positions of the
// maxima are kept for the backward pass.
func MaxPool2dWith(x *Tensor, o PoolOptions) *Tensor {
	x, g := poolGeomOf("MaxPool2d", x, o)
	if out := maxPoolChannelsLast(x, g); out != nil {
		return out
	}
	be := x.st.b
	out := Empty(be, x.scope, g.N, g.C, g.OutH(), g.OutW())
	argmax := EmptyOf(be, x.scope, Int32, out.shape...)
	Complete(be).MaxPool2d(out.buffer(), argmax.buffer(), x.buffer(), g)
	record(out, "maxpool2d", func(dy *Tensor, e *engine) {
		dx, acc := e.sink(x)
		Complete(be).MaxPool2dBackward(dx, dy.buffer(), argmax.buffer(), g, acc)
	}, x)
	saveFor(out, argmax)
	readsNot(out, true, x) // the positions of the maxima are what it reads
	return out
}

// AvgPoolOptions are PoolOptions with torch's divisor settings of
// nn.AvgPool2d.
type AvgPoolOptions struct {
	PoolOptions
	// ExcludePad leaves the padding out of each window's count (torch's
	// count_include_pad=False); by default it is counted.
	ExcludePad bool
	// Divisor, when positive, divides every window's sum instead of its
	// count (torch's divisor_override).
	Divisor int
}

// poolBackend is x's backend as a PoolBackend, or a panic naming op.
func poolBackend(op string, x *Tensor) PoolBackend {
	pb, ok := x.st.b.(PoolBackend)
	if !ok {
		panic(fmt.Sprintf("tensor: %s on backend %s, which does not implement tensor.PoolBackend", op, x.st.b.Name()))
	}
	return pb
}

// AvgPool2d averages over windows, as nn.AvgPool2d with the options o. It
// needs a backend that implements PoolBackend.
func AvgPool2d(x *Tensor, o AvgPoolOptions) *Tensor {
	if o.Divisor < 0 {
		panic(fmt.Sprintf("tensor: AvgPool2d divisor %d", o.Divisor))
	}
	pb := poolBackend("AvgPool2d", x)
	x, pg := poolGeomOf("AvgPool2d", x, o.PoolOptions)
	g := AvgPoolGeom{PoolGeom: pg, ExcludePad: o.ExcludePad, Divisor: o.Divisor}
	out := Empty(x.st.b, x.scope, g.N, g.C, g.OutH(), g.OutW())
	pb.AvgPool2d(out.buffer(), x.buffer(), g)
	record(out, "avgpool2d", func(dy *Tensor, e *engine) {
		dx, acc := e.sink(x)
		pb.AvgPool2dBackward(dx, dy.buffer(), g, acc)
	}, x)
	return out
}

// adaptiveGeomOf checks an adaptive pooling of x to outH×outW.
func adaptiveGeomOf(op string, x *Tensor, outH, outW int) (*Tensor, AdaptivePoolGeom) {
	if len(x.shape) != 4 || outH < 1 || outW < 1 || x.shape[2] < 1 || x.shape[3] < 1 {
		panic(fmt.Sprintf("tensor: %s of %v to %dx%d; want [N,C,H,W] with H, W >= 1 and a positive size", op, x.shape, outH, outW))
	}
	return x.Contiguous(), AdaptivePoolGeom{N: x.shape[0], C: x.shape[1], H: x.shape[2], W: x.shape[3], OutH: outH, OutW: outW}
}

// AdaptiveAvgPool2d averages x [N,C,H,W] over the windows of torch's
// adaptive rule to an outH×outW output, as nn.AdaptiveAvgPool2d. On a
// backend without PoolBackend only the 1×1 output (global average pooling)
// is available: a sum over each plane scaled by 1/(H·W).
func AdaptiveAvgPool2d(x *Tensor, outH, outW int) *Tensor {
	x, g := adaptiveGeomOf("AdaptiveAvgPool2d", x, outH, outW)
	pb, ok := x.st.b.(PoolBackend)
	if !ok && outH == 1 && outW == 1 {
		return globalAvgPool(x, g)
	}
	if !ok {
		pb = poolBackend("AdaptiveAvgPool2d", x)
	}
	out := Empty(x.st.b, x.scope, g.N, g.C, outH, outW)
	pb.AdaptiveAvgPool2d(out.buffer(), x.buffer(), g)
	record(out, "adaptive_avgpool2d", func(dy *Tensor, e *engine) {
		dx, acc := e.sink(x)
		pb.AdaptiveAvgPool2dBackward(dx, dy.buffer(), g, acc)
	}, x)
	return out
}

// globalAvgPool is AdaptiveAvgPool2d to 1×1 from the Backend core alone:
// forward the core's Reduce (a sum over each plane) scaled by 1/(H·W);
// backward dy scaled by 1/(H·W) and added as a per-plane bias to zeros.
func globalAvgPool(x *Tensor, g AdaptivePoolGeom) *Tensor {
	be := x.st.b
	planes, hw := g.N*g.C, g.H*g.W
	inv := 1 / float32(hw)
	sum := Empty(be, x.scope, planes)
	defer sum.Release()
	be.Reduce(ReduceSum, sum.buffer(), x.buffer(), planes, hw, 1, false)
	out := Zeros(be, x.scope, g.N, g.C, 1, 1)
	Complete(be).Axpy(out.buffer(), inv, sum.buffer())
	record(out, "global_avgpool2d", func(dy *Tensor, e *engine) {
		if !x.requiresGrad {
			return
		}
		share := Zeros(be, e.scopeFor(x), planes)
		defer share.Release()
		Complete(be).Axpy(share.buffer(), inv, dy.buffer())
		dx := Zeros(be, e.scopeFor(x), x.shape...)
		Complete(be).AddBias(dx.buffer(), share.buffer(), 1, planes, hw)
		e.give(x, dx)
	}, x)
	return out
}

// AdaptiveMaxPool2d takes the maxima of x [N,C,H,W] over the windows of
// torch's adaptive rule to an outH×outW output, as nn.AdaptiveMaxPool2d.
// It needs a backend that implements PoolBackend.
func AdaptiveMaxPool2d(x *Tensor, outH, outW int) *Tensor {
	pb := poolBackend("AdaptiveMaxPool2d", x)
	x, g := adaptiveGeomOf("AdaptiveMaxPool2d", x, outH, outW)
	be := x.st.b
	out := Empty(be, x.scope, g.N, g.C, outH, outW)
	argmax := EmptyOf(be, x.scope, Int32, out.shape...)
	pb.AdaptiveMaxPool2d(out.buffer(), argmax.buffer(), x.buffer(), g)
	record(out, "adaptive_maxpool2d", func(dy *Tensor, e *engine) {
		dx, acc := e.sink(x)
		pb.AdaptiveMaxPool2dBackward(dx, dy.buffer(), argmax.buffer(), g, acc)
	}, x)
	saveFor(out, argmax)
	return out
}
