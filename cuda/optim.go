package cuda

import "github.com/ember-ml/ember/tensor"

// The optimiser family (tensor.OptimBackend): kernels/optim.cu.

var _ tensor.OptimBackend = (*Backend)(nil)

// Adam applies one Adam/AdamW update with the per-step scalars read from s
// on the device (see tensor.AdamStep), one launch for the whole buffer.
func (b *Backend) Adam(p, g, m, v, vmax, s tensor.Buffer, h tensor.AdamStep) {
	const op = "adam"
	n := p.Len
	need(op, "g", g, n)
	need(op, "m", m, n)
	need(op, "v", v, n)
	need(op, "s", s, tensor.NumAdamScalars)
	var px uintptr
	if h.AMSGrad {
		need(op, "vmax", vmax, n)
		px = b.f32(op, vmax)
	}
	b.launch(op, b.kernel("ember_adam"), n, b.f32(op, p), b.f32(op, g), b.f32(op, m), b.f32(op, v), px, b.f32(op, s),
		int64(n), h.Beta2, h.OneMinusBeta2, h.Eps, h.WeightDecay, flag(h.AMSGrad), flag(h.ZeroGrad))
}

// SGDDevice is SGD with the learning rate, momentum, dampening and weight
// decay read from s on the device (tensor.SGDLR, ...). Without a momentum
// buffer v the kernel gets a null pointer: the momentum in s must then be
// 0, which the kernel cannot check (package optim keeps it so).
func (b *Backend) SGDDevice(p, g, v, s tensor.Buffer, h tensor.SGDStep) {
	const op = "sgd_device"
	n := p.Len
	need(op, "g", g, n)
	need(op, "s", s, tensor.NumSGDScalars)
	var pv uintptr
	if !v.Empty() {
		need(op, "v", v, n)
		pv = b.f32(op, v)
	}
	b.launch(op, b.kernel("ember_sgd_device"), n, b.f32(op, p), b.f32(op, g), pv, b.f32(op, s), int64(n),
		flag(h.Nesterov), flag(h.FirstStep), flag(h.ZeroGrad))
}

// ClipCoef sets norm[0] = ‖g‖ and coef[0] = min(maxNorm/(norm+1e-6), 1) in
// two launches (per-block double partials, then one block), with no wait
// for the device. The block count is sumBlocks(n), a function of n alone,
// so the norm does not depend on the device.
func (b *Backend) ClipCoef(norm, coef, g tensor.Buffer, maxNorm float32) {
	const op = "clip_coef"
	need(op, "norm", norm, 1)
	need(op, "coef", coef, 1)
	pn, pc, pg := b.f32(op, norm), b.f32(op, coef), b.f32(op, g)
	if g.Len == 0 { // the norm of nothing is 0: no partial sums to add
		b.launchGrid(op, b.kernel("ember_clip_coef"), 1, blockSize, pn, pc, uintptr(0), int32(0), maxNorm)
		return
	}
	nb := sumBlocks(g.Len)
	ws := b.workspace(op, nb*8)
	defer b.release(ws)
	b.launchGrid(op, b.kernel("ember_sumsq_partial"), nb, blockSize, pg, int64(g.Len), ws.Ptr())
	b.launchGrid(op, b.kernel("ember_clip_coef"), 1, blockSize, pn, pc, ws.Ptr(), int32(nb), maxNorm)
}
