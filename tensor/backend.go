package tensor

import "fmt"

// DType is the element type of a buffer. Tensors that carry gradients are
// always Float32; Int32 holds labels and max-pool indices, Uint8 raw images.
// BFloat16 (the upper half of a float32: 8 exponent bits, 7 mantissa bits)
// holds the operands of mixed-precision matrix products (autocast.go); only
// Cast and the low-precision products (backend_lowp.go) read or write it.
type DType uint8

const (
	Float32 DType = iota
	Int32
	Uint8
	BFloat16
)

// Size is the width of one element in bytes.
func (d DType) Size() int {
	switch d {
	case Uint8:
		return 1
	case BFloat16:
		return 2
	}
	return 4
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Int32:
		return "int32"
	case Uint8:
		return "uint8"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Memory is one allocation owned by a Backend: host memory for the CPU, a
// block of the caching allocator for CUDA. Only its Backend looks inside.
type Memory interface {
	Bytes() int
}

// Buffer is a window of Len elements of type DType, starting Off elements
// into Mem. Buffers are how the tensor layer hands memory to a Backend; a
// zero Buffer (Len 0, Mem nil) means "not wanted" where a doc says so.
type Buffer struct {
	Mem   Memory
	Off   int
	Len   int
	DType DType
}

// Empty reports whether b is the zero Buffer ("not wanted").
func (b Buffer) Empty() bool { return b.Mem == nil }

// Slice returns the window [off, off+n) of b.
func (b Buffer) Slice(off, n int) Buffer {
	if off < 0 || n < 0 || off+n > b.Len {
		panic(fmt.Sprintf("tensor: buffer slice [%d:%d] out of range (len %d)", off, off+n, b.Len))
	}
	return Buffer{Mem: b.Mem, Off: b.Off + off, Len: n, DType: b.DType}
}

// ConvGeom describes a 2-D convolution over NCHW input with an OIHW weight
// [K, C/Groups, R, S]. Dilation and groups take their zero values as 1, so
// that geometries written before they existed keep their meaning.
type ConvGeom struct {
	N, C, H, W       int // input batch, channels, height, width
	K, R, S          int // output channels, kernel height, kernel width
	StrideH, StrideW int
	PadH, PadW       int
	// DilationH and DilationW space the kernel's taps (0 or 1: adjacent).
	DilationH, DilationW int
	// Groups splits the channels into groups convolved separately (0 or
	// 1: one group; C: depthwise). C and K are multiples of it.
	Groups int
	// ReLU asks Conv2d for max(conv + bias, 0), saving a pass over the
	// output and the memory of the pre-activation (Conv2dReLU).
	ReLU bool
}

// Dilation is the spacing of the kernel's taps along each axis (at least 1).
func (g ConvGeom) Dilation() (h, w int) { return max(g.DilationH, 1), max(g.DilationW, 1) }

// GroupCount is the number of channel groups (at least 1).
func (g ConvGeom) GroupCount() int { return max(g.Groups, 1) }

// Plain reports whether g has no dilation and one group: the geometries
// the fused and register-tiled fast paths were written for.
func (g ConvGeom) Plain() bool {
	dh, dw := g.Dilation()
	return dh == 1 && dw == 1 && g.GroupCount() == 1
}

// WeightLen is the number of weight elements, K·(C/Groups)·R·S.
func (g ConvGeom) WeightLen() int { return g.K * g.C / g.GroupCount() * g.R * g.S }

// OutH is the output height.
func (g ConvGeom) OutH() int {
	dh, _ := g.Dilation()
	return (g.H+2*g.PadH-dh*(g.R-1)-1)/g.StrideH + 1
}

// OutW is the output width.
func (g ConvGeom) OutW() int {
	_, dw := g.Dilation()
	return (g.W+2*g.PadW-dw*(g.S-1)-1)/g.StrideW + 1
}

// ConvPoolBackend is implemented by backends that fuse a convolution, its
// bias, ReLU and a max pooling over disjoint windows into one operation
// (Conv2dReLUMaxPool). Without it the tensor layer runs Conv2d (with the
// ReLU fused) and MaxPool2d.
type ConvPoolBackend interface {
	// Conv2dReLUMaxPool sets y [N, K, p.OutH(), p.OutW()] to the maxima over
	// p's windows of max(conv(x, w) + bias, 0) (bias may be empty), and
	// argmax to their positions oh*OutW+ow in the convolution's output
	// plane, as Conv2d with g.ReLU followed by MaxPool2d would. p pools
	// the convolution's output (p.N = g.N, p.C = g.K, p.H = g.OutH(), p.W
	// = g.OutW()) with strides no smaller than its window.
	Conv2dReLUMaxPool(y, argmax, x, w, bias Buffer, g ConvGeom, p PoolGeom)
	// Conv2dReLUMaxPoolBackward takes dy, the gradient of y, and y and
	// argmax from the forward pass: it overwrites dx with the input
	// gradient (skipped when dx is empty) and adds the weight and bias
	// gradients into dw and db (each skipped when empty).
	Conv2dReLUMaxPoolBackward(dx, dw, db, dy, x, w, y, argmax Buffer, g ConvGeom, p PoolGeom)
}

// BiasReLUBackend is implemented by backends that fuse a bias with ReLU
// (LinearReLU). Without it the tensor layer runs AddBias and ReLU, and
// ReLUBackward and BiasGrad.
type BiasReLUBackend interface {
	// AddBiasReLU sets y = ReLU(y + bias[c]) for y viewed as [outer,
	// channels], as AddBias followed by ReLU.
	AddBiasReLU(y, bias Buffer, outer, channels int)
	// BiasReLUBackward sets g = dy where y > 0, else 0 (as ReLUBackward),
	// and db[c] to the sum of g over the outer rows (+ db when
	// accumulating; skipped when db is empty), as BiasGrad.
	BiasReLUBackward(g, db, dy, y Buffer, outer, channels int, accumulate bool)
}

// BiasBackend is implemented by backends with dense kernels for a
// per-channel bias and its gradient. Without it (Complete) AddBias is the
// core's Binary add of the bias through a broadcasting view and BiasGrad is
// one or two Reduce sums.
type BiasBackend interface {
	// AddBias adds bias[c] to y viewed as [outer, channels, inner].
	AddBias(y, bias Buffer, outer, channels, inner int)
	// BiasGrad sets db[c] = sum of dy over outer and inner (+ db if
	// accumulate), dy viewed as [outer, channels, inner].
	BiasGrad(db, dy Buffer, outer, channels, inner int, accumulate bool)
}

// ChannelReduceBackend is implemented by backends with a one-pass
// per-channel reduction: x viewed as [outer, channels, inner] to
// [channels] (SumAxes or MeanAxes over every axis but one run, as of NCHW
// over (0, 2, 3)). Without it (Complete) it is two Reduce stages: the
// inner rows, then the outer columns of their results.
type ChannelReduceBackend interface {
	// ReduceChannels sets dst[c] to the sum (ReduceSum, + dst when
	// accumulate) or mean (ReduceMean) of x[o, c, i] over o and i,
	// accumulated in float64 and rounded once (a mean divided first).
	ReduceChannels(op ReduceOp, dst, x Buffer, outer, channels, inner int, accumulate bool)
}

// LinearBackend is implemented by backends that run a linear layer's
// product, bias and ReLU, and its gradients, as fewer operations than
// MatMul, AddBias, ReLU and their backward passes (the CUDA backend: one
// launch each way for batches of up to 256 rows). Linear and LinearReLU use
// it when the backend has it;
// the results are those of the composed operations up to the order of the
// sums.
type LinearBackend interface {
	// Linear sets y [n, out] = x [n, in] · wᵀ (w [out, in]) + bias[o] on
	// every row (no bias when bias is empty), then max(y, 0) when relu
	// (NaN stays NaN, as ReLU).
	Linear(y, x, w, bias Buffer, n, in, out int, relu bool)
	// LinearGrads takes g [n, out], the gradient of the layer's output y.
	// When y is not empty (a layer with relu), g counts only where y > 0.
	// It sets, or adds to when the flag is set, dx [n, in] = g·w, dw [out,
	// in] = gᵀ·x and db [out] = the sums of g's rows; each is skipped when
	// its buffer is empty.
	LinearGrads(dx, dw, db, g, y, x, w Buffer, n, in, out int, accX, accW, accB bool)
}

// LinearCrossEntropyBackend is implemented by backends that compute a
// classifier's last linear layer and the cross entropy of its output as one
// operation (the CUDA backend, for up to 32 classes: one launch for the
// logits, the loss and the gradients of the logits and of the input).
// LinearCrossEntropy uses it when the backend has it.
type LinearCrossEntropyBackend interface {
	// LinearCrossEntropy forms the logits z = x·wᵀ + bias (x [n, in], w
	// [classes, in], no bias when bias is empty) and sets loss[0] to the mean
	// over the rows of -log softmax(z)[label] (labels int32 [n]), as
	// CrossEntropy, and adds it to lossSum[0] when lossSum is not empty. When
	// dlogits is not empty it sets dlogits [n, classes] to the loss's
	// gradient with respect to z, and then, when dx is not empty, dx [n, in]
	// = dlogits·w, counted only where x > 0 when reluX (x is a ReLU's
	// output, whose gradient then goes on already through the ReLU's
	// mask). It reports false, and does nothing, for sizes it does not
	// take.
	LinearCrossEntropy(loss, lossSum, dlogits, dx, x, w, bias, labels Buffer, n, in, classes int, reluX bool) bool
}

// PoolGeom describes a 2-D max pooling over NCHW input. Padding is
// implicit: -inf for the maximum (it never wins), and for average pooling
// zeros that AvgPoolGeom decides whether to count. The zero values (no
// padding, floor mode) are the geometry of LeNet's pooling.
type PoolGeom struct {
	N, C, H, W       int
	KH, KW           int
	StrideH, StrideW int
	PadH, PadW       int
	// CeilMode rounds the output size up, as torch's ceil_mode: a last
	// window that hangs off the far edge is kept when it starts inside the
	// input or its left padding.
	CeilMode bool
}

// OutH is the output height.
func (g PoolGeom) OutH() int { return poolOut(g.H, g.KH, g.StrideH, g.PadH, g.CeilMode) }

// OutW is the output width.
func (g PoolGeom) OutW() int { return poolOut(g.W, g.KW, g.StrideW, g.PadW, g.CeilMode) }

// poolOut is torch's pooling output size along one axis.
func poolOut(in, k, stride, pad int, ceil bool) int {
	span := in + 2*pad - k
	if !ceil || span < 0 {
		return span/stride + 1
	}
	out := (span+stride-1)/stride + 1
	if (out-1)*stride >= in+pad { // the last window would start in the right padding
		out--
	}
	return out
}

// SGDStep holds the hyper-parameters of one torch.optim.SGD update.
// FirstStep is true on the first update of a parameter, when PyTorch
// initialises the momentum buffer to the gradient itself (no dampening).
// ZeroGrad sets each gradient to zero once the update has read it, so that
// the next backward pass adds into zeros without a separate fill.
type SGDStep struct {
	LR, Momentum, Dampening, WeightDecay float32
	Nesterov                             bool
	FirstStep                            bool
	ZeroGrad                             bool
}

// Backend is what a device must implement for tensors to live on it: a
// small core of memory, copies, strided elementwise operations by op code,
// reductions, gathers, matrix products, convolution and random numbers.
// Everything else a backend may add is an optional interface, found by a
// type assertion where it is used; all but a few have a fallback:
//
//   - CompleteBackend's parts (ArithmeticBackend, BiasBackend,
//     MaxPoolBackend, CrossEntropyBackend, SGDBackend, GatherBackend) are
//     dense-buffer forms of operations the core also expresses. Complete(b)
//     returns b when it has them all, else b with the missing ones composed
//     from the core (backend_complete.go); the tensor layer and packages
//     optim and nn call them through it.
//   - The layer-level and fused interfaces (LinearBackend,
//     BiasReLUBackend, ConvPoolBackend, LinearCrossEntropyBackend,
//     FusedBackend, NormBackend, BatchNormActBackend, PoolBackend, ClassLossBackend,
//     CausalSoftmaxBackend, OptimBackend, RandomStateBackend,
//     DropoutBackend, DropoutRedrawBackend, AugmentBackend, LowPrecisionBackend,
//     LowPrecisionConvBackend, AttentionBackend): the operation that looks
//     for one says what it runs without it (composed core operations, or
//     the CPU backend's kernel on host copies; average and adaptive
//     pooling, augmentation and autocast refuse a backend without theirs
//     by name).
//
// So a new backend implements this interface, passes tensortest.RunBackend
// and tensortest.RunAutograd, and then runs every model; the optional
// interfaces are where it gets its speed. The CPU backend (this package)
// and the CUDA backend (package cuda) implement everything (but the CPU
// composes attention: AttentionBackend is the CUDA backend's);
// tensortest.CoreOnly hides all but the core, which is how the fallbacks
// are tested.
//
// Conventions: outputs come first; all buffers are dense row-major unless a
// stride argument says otherwise; float32 unless named otherwise. Operations
// may run asynchronously (CUDA enqueues them on a stream) and are ordered
// with respect to each other; Download waits for them. An operation panics
// with an error value if the device fails; Guard turns that into an error.
// Where an argument is named "accumulate", true means add into the output
// (gradient accumulation), false means overwrite it.
type Backend interface {
	// Name names the device in messages: "cpu", "cuda:N".
	Name() string

	// The general core: strided pointwise operations by op code
	// (backend_elementwise.go), reductions and softmax over an axis
	// (backend_reduce.go), gathers, scatters and batched matrix products
	// (backend_index.go), and counter-based random numbers
	// (backend_random.go).
	Elementwise
	Reductions
	Indexing
	Random

	// Alloc returns n uninitialised elements.
	Alloc(n int, dt DType) (Buffer, error)
	// Free returns b.Mem to the backend. The buffer must not be used after.
	Free(b Buffer)
	// Upload copies src ([]float32, []int32, []uint8, or []uint16 bit
	// patterns for BFloat16, of length dst.Len) into dst.
	Upload(dst Buffer, src any)
	// Download copies src into dst (a slice of matching type and length),
	// waiting for pending work.
	Download(dst any, src Buffer)

	// Fill sets every element of dst (float32 or int32) to v.
	Fill(dst Buffer, v float32)
	// Copy copies src to dst (same length and type).
	Copy(dst, src Buffer)
	// CopyStrided gathers a strided view into dense dst: element
	// (i0, i1, ...) of shape is read at src.Off + sum(ik*strides[k]).
	CopyStrided(dst, src Buffer, shape, strides []int)

	// MatMul sets c = alpha*op(a)*op(b) + beta*c, c m×n, op(a) m×k,
	// op(b) k×n, where op transposes when asked; dense row-major operands
	// (a is k×m when transA, b is n×k when transB).
	MatMul(c, a, b Buffer, m, n, k int, transA, transB bool, alpha, beta float32)
	// Conv2d sets y = conv(x, w) + bias (then max(·, 0) when g.ReLU); bias
	// may be empty.
	Conv2d(y, x, w, bias Buffer, g ConvGeom)
	// Conv2dBackward computes the input gradient into dx (overwrite, or
	// skipped when dx is empty) and ADDS the weight and bias gradients into
	// dw and db (either may be empty). When g.ReLU, y is the output of the
	// fused Conv2d and dy is taken as 0 where y is not positive (the
	// gradient through the ReLU), in the same pass; otherwise y is unused.
	Conv2dBackward(dx, dw, db, dy, x, w, y Buffer, g ConvGeom)

	// Synchronize waits for all queued work and reports a deferred device
	// error, if any.
	Synchronize() error
}
