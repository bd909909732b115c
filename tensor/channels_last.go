package tensor

import "fmt"

// Channels-last bfloat16 activations, autocast's form for convolution nets.
//
// Under bfloat16 autocast, on a backend with ChannelsLastBackend, a
// convolution that the backend runs channels-last (cuDNN's tensor-core
// layout) gives its output as bfloat16 laid out [N, H, W, C] instead of
// float32 [N, C, H, W]: the next convolution then reads it as it is, with
// no cast and no change of layout, and the memory the step keeps for the
// backward pass halves. To every user the tensor is still float32 [N, C,
// H, W]; its values are bfloat16 ones, which autocast's convolution gives
// anyway (ConvLowp rounds its output).
//
// The operations a convolution net puts between its convolutions keep the
// form: batch norm (with its activation), ReLU and GELU, max pooling over
// disjoint windows, and the sum of two such tensors. Their results are
// rounded to bfloat16, as torch's autocast gives bfloat16 results for
// bfloat16 operands, and so are the gradients of such tensors, which
// their backward passes hold in the same form. Any other reader (a view,
// Flatten, a loss, Float32s, an elementwise chain) turns the memory into
// plain float32 [N, C, H, W] first, with one cast (materialize), so that
// every operation takes such tensors; the operations that know the form
// then read a plain one as before.

// ChannelsLastBackend is implemented by backends that hold autocast's
// activations as bfloat16 [N, H, W, C] (channels_last.go). A buffer
// called channels-last below is bfloat16 with rows of C channels (rows n·H·W
// for an activation); every result is rounded to bfloat16. The CPU
// implements it as the float32 operation on the widened operands with the
// result rounded: the reference the GPU's kernels are tested against.
type ChannelsLastBackend interface {
	LowPrecisionConvBackend
	// ConvChannelsLast reports whether Conv2dChannelsLast and its backward
	// take g (under autocast).
	ConvChannelsLast(g ConvGeom) bool
	// ToChannelsLast sets dst (channels-last [n, inner, c]) from src
	// float32 [n, c, inner], rounding.
	ToChannelsLast(dst, src Buffer, n, c, inner int)
	// FromChannelsLast sets dst float32 [n, c, inner] to src
	// (channels-last [n, inner, c]) exactly, or adds src to it when
	// accumulate.
	FromChannelsLast(dst, src Buffer, n, c, inner int, accumulate bool)
	// Conv2dChannelsLast is Conv2dLowp with x and y channels-last: y is
	// the float32 result of Conv2dLowp (the convolution rounded, then the
	// bias and g.ReLU's ReLU) rounded to bfloat16.
	Conv2dChannelsLast(y, x, w, bias Buffer, g ConvGeom)
	// Conv2dBackwardChannelsLast is Conv2dBackwardLowp with dy, x and dx
	// channels-last and g.ReLU false (the caller masks dy): dx is
	// overwritten, dw and db (float32, either may be empty, as dx may)
	// are added to; db sums dy.
	Conv2dBackwardChannelsLast(dx, dw, db, dy, x, w Buffer, g ConvGeom)
	// BatchNormChannelsLast is BatchNormAct over the rows of x and y
	// (channels-last [rows, c]); the statistics and parameters are
	// float32 as there.
	BatchNormChannelsLast(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, rows, c int, training bool, momentum, eps float32, act UnaryOp)
	// BatchNormBackwardChannelsLast is BatchNormActBackward with dx, dy
	// and x channels-last: dx is overwritten, dweight and dbias are
	// overwritten or added to (accW, accB).
	BatchNormBackwardChannelsLast(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd Buffer, rows, c int, training bool, act UnaryOp, accW, accB bool)
	// UnaryChannelsLast sets y = act(x) elementwise for act one of
	// BatchNormActivation's (not OpIdentity); n is the element count.
	UnaryChannelsLast(y, x Buffer, act UnaryOp, n int)
	// UnaryBackwardChannelsLast sets dx = dy·act'(x).
	UnaryBackwardChannelsLast(dx, dy, x Buffer, act UnaryOp, n int)
	// AddChannelsLast sets y = a + b elementwise (y may be a or b).
	AddChannelsLast(y, a, b Buffer, n int)
	// MaxPoolChannelsLast is MaxPool2d of x [N, H, W, C] into y [N, OH,
	// OW, C] for windows that do not overlap (stride = kernel, no
	// padding; ceil mode allowed; at most 256 elements): the first
	// maximum of each window (the last NaN, if the window holds one), and
	// its position in the window (row·KW + column) into idx, Uint8 [N,
	// OH, OW, C].
	MaxPoolChannelsLast(y, idx, x Buffer, p PoolGeom)
	// MaxPoolBackwardChannelsLast sets dx: dy at the position idx names
	// in each window, zero elsewhere.
	MaxPoolBackwardChannelsLast(dx, dy, idx Buffer, p PoolGeom)
}

// ChannelsLastPoolNormBackend is a ChannelsLastBackend that runs a max
// pooling and the batch norm after it as one operation each way
// (MaxPoolBatchNormAct): forward, the statistics may be gathered as the
// pooling writes its output; backward, batch norm's input gradient goes
// straight to the pooling's windows, and the pooled gradient is never
// written.
type ChannelsLastPoolNormBackend interface {
	ChannelsLastBackend
	// MaxPoolBatchNormChannelsLast is MaxPoolChannelsLast of x into p and
	// idx followed by BatchNormChannelsLast of p into y, with the same
	// results (a backend may gather the statistics as it pools).
	MaxPoolBatchNormChannelsLast(y, p, idx, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, pool PoolGeom, training bool, momentum, eps float32, act UnaryOp)
	// BatchNormMaxPoolBackwardChannelsLast is BatchNormBackwardChannelsLast
	// over p, the pooled rows [N·OH·OW, C] of pool, followed by
	// MaxPoolBackwardChannelsLast of its input gradient through idx into
	// dx [N, H, W, C] (skipped where dx is empty), with the same results.
	BatchNormMaxPoolBackwardChannelsLast(dx, dweight, dbias, dy, p, idx, weight, bias, saveMean, saveInvStd Buffer, pool PoolGeom, training bool, act UnaryOp, accW, accB bool)
}

// channelsLastForm is the shape of a storage held channels-last: its
// memory is bfloat16 [n, h, w, c] for a float32 tensor [n, c, h, w].
type channelsLastForm struct{ n, c, h, w int }

// channelsLastAlign is what a channel count must be a multiple of for the
// form: the GPU's kernels move eight bfloat16 channels at a time, and
// cuDNN's tensor-core kernels want the same.
const channelsLastAlign = 8

// SetChannelsLast sets whether this scope's autocast holds convolution
// activations channels-last where the backend can (the default), or
// keeps them float32 [N, C, H, W] (off: the convolutions cast their
// operands each way, as before the form). Like SetAutocast it is read when
// an operation runs, and Reset keeps it.
func (s *Scope) SetChannelsLast(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.planar = !on
}

// channelsLastOf is be as a ChannelsLastBackend when it has the form and
// scope s runs bfloat16 autocast with the form on (it lives in scopes
// only, whose release frees whichever memory the storage holds by then).
func channelsLastOf(be Backend, s *Scope) (ChannelsLastBackend, bool) {
	if s == nil || s.Autocast() != BFloat16 {
		return nil, false
	}
	s.mu.Lock()
	planar := s.planar
	s.mu.Unlock()
	if planar {
		return nil, false
	}
	cl, ok := be.(ChannelsLastBackend)
	return cl, ok
}

// newChannelsLast is an uninitialised tensor [n, c, h, w] held
// channels-last, in scope s.
func newChannelsLast(b Backend, s *Scope, n, c, h, w int) *Tensor {
	t := newTensor(b, BFloat16, s, n, c, h, w)
	t.st.cl = &channelsLastForm{n, c, h, w}
	return t
}

// channelsLast is t's memory channels-last ([n·h·w, c] bfloat16) when t
// is a whole tensor held that way (not a view of one part of it, nor one
// reshaped).
func (t *Tensor) channelsLast() (Buffer, bool) {
	if !t.heldChannelsLast() {
		return Buffer{}, false
	}
	t.mustBeLive()
	return t.st.buf, true
}

// heldChannelsLast is channelsLast's test of the form alone, for a tensor
// whose memory may be gone (an input a backward pass does not read).
func (t *Tensor) heldChannelsLast() bool {
	f := t.st.cl
	return f != nil && t.off == 0 && len(t.shape) == 4 && t.shape[0] == f.n && t.shape[1] == f.c &&
		t.shape[2] == f.h && t.shape[3] == f.w && t.IsContiguous()
}

// IsChannelsLast reports whether t is held as bfloat16 [N, H, W, C]
// (channels_last.go); reading it in any other way converts it.
func (t *Tensor) IsChannelsLast() bool { return t.heldChannelsLast() && !t.Released() }

// materialize turns a storage held channels-last into plain float32 (one
// cast); the bfloat16 memory goes back at once (its readers are queued
// before it). Other operations that wanted the form read the plain one
// from then on.
func (st *storage) materialize() {
	f := st.cl
	if f == nil || st.h.released.Load() {
		return
	}
	n := f.n * f.c * f.h * f.w
	buf, err := st.b.Alloc(n, Float32)
	if err != nil {
		panic(&Error{Op: "alloc", Err: err})
	}
	st.b.(ChannelsLastBackend).FromChannelsLast(buf, st.buf, f.n, f.c, f.h*f.w, false)
	st.b.Free(st.buf)
	st.buf, st.cl = buf, nil
}

// channelsLastInput is x channels-last for an operation that takes the
// form: its own memory (tmp nil), or a rounded copy of a plain x that the
// caller releases after queueing its reads (tmp).
func channelsLastInput(cl ChannelsLastBackend, s *Scope, x *Tensor) (buf Buffer, tmp *Tensor) {
	if b, ok := x.channelsLast(); ok {
		return b, nil
	}
	n, c, h, w := x.shape[0], x.shape[1], x.shape[2], x.shape[3]
	tmp = newTensor(x.st.b, BFloat16, s, n*h*w*c)
	cl.ToChannelsLast(tmp.buffer(), x.Contiguous().buffer(), n, c, h*w)
	return tmp.buffer(), tmp
}

// ChannelsLastFilterBackend is a ChannelsLastBackend whose channels-last
// convolutions can read a filter cast once into the form they take, so
// that a training step casts each filter once, in the forward pass, and
// the backward pass's input gradient reads that copy (as torch's autocast
// keeps a weight's cast for the step) instead of casting it again.
type ChannelsLastFilterBackend interface {
	ChannelsLastBackend
	// FilterFormLen is the number of elements of g's filter in that form,
	// or 0 where g's convolutions do not read one.
	FilterFormLen(g ConvGeom) int
	// ToFilterForm sets wf (FilterFormLen(g) elements) from the float32
	// filter w.
	ToFilterForm(wf, w Buffer, g ConvGeom)
	// Conv2dChannelsLastFilter is Conv2dChannelsLast reading the filter
	// from wf, ToFilterForm's copy of w (w where it falls back).
	Conv2dChannelsLastFilter(y, x, w, wf, bias Buffer, g ConvGeom)
	// Conv2dBackwardChannelsLastFilter is Conv2dBackwardChannelsLast
	// reading the filter for dx from wf as above.
	Conv2dBackwardChannelsLastFilter(dx, dw, db, dy, x, w, wf Buffer, g ConvGeom)
}

// releaseTemp releases t when it is not nil.
func releaseTemp(t *Tensor) {
	if t != nil {
		t.Release()
	}
}

// sinkChannelsLast is where a backward function that writes channels-last
// puts the gradient of t [n, c, h, w]: dst, and finish, to call once the
// write is queued. A computed t held channels-last with no gradient yet
// gets dst as its gradient, in the form; otherwise dst is a temporary that
// finish adds into t's gradient (in the form, or widened into a plain
// one) and releases. dst is empty when t needs no gradient.
func (e *engine) sinkChannelsLast(cl ChannelsLastBackend, t *Tensor) (dst Buffer, finish func()) {
	t = forwarded(t)
	if t == nil || !t.requiresGrad {
		return Buffer{}, func() {}
	}
	n, c, h, w := t.shape[0], t.shape[1], t.shape[2], t.shape[3]
	s := e.scopeFor(t)
	if t.heldChannelsLast() && t.node != nil && e.grads[t] == nil && s != nil {
		g := newChannelsLast(t.st.b, s, n, c, h, w)
		e.grads[t] = g
		e.unmasked(t)
		return g.st.buf, func() {}
	}
	tmp := newTensor(t.st.b, BFloat16, s, n*h*w*c)
	return tmp.buffer(), func() {
		if g := e.grads[t]; g != nil && t.node != nil {
			if gb, ok := g.channelsLast(); ok {
				e.unmasked(t)
				cl.AddChannelsLast(gb, gb, tmp.buffer(), gb.Len)
				tmp.Release()
				return
			}
		}
		dst, acc := e.sink(t)
		cl.FromChannelsLast(dst, tmp.buffer(), n, c, h*w, acc)
		tmp.Release()
	}
}

// channelsLastChannels reports whether a channel count can be held in the
// form.
func channelsLastChannels(c int) bool { return c > 0 && c%channelsLastAlign == 0 }

// checkChannelsLastAct panics for an activation the form does not run.
func checkChannelsLastAct(act UnaryOp) {
	if act != OpReLU && act != OpGELU && act != OpGELUTanh {
		panic(fmt.Sprintf("tensor: channels-last activation op %d; want OpReLU, OpGELU or OpGELUTanh", act))
	}
}
