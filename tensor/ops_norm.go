package tensor

import (
	"fmt"
	"slices"
)

// BatchNorm normalises x [N, C, ...] (BatchNorm1d on [N, C] or [N, C, L],
// BatchNorm2d on [N, C, H, W]) per channel, as torch's functional
// batch_norm. weight and bias [C] are the optional affine transform (nil
// for none). In training it normalises by the batch's statistics (biased
// variance) and, when runningMean and runningVar [C] are given, updates
// them in place: running = (1-momentum)·running + momentum·batch, the
// variance unbiased. torch's momentum=None (a cumulative average) is
// momentum = 1/k on the k-th batch. Out of training it normalises by the
// running statistics, which must be given. The backward pass is one
// operation (the fused formula of NormBackend.BatchNormBackward).
func BatchNorm(x, weight, bias, runningMean, runningVar *Tensor, training bool, momentum, eps float32) *Tensor {
	return batchNorm(x, weight, bias, runningMean, runningVar, training, momentum, eps, OpIdentity)
}

// BatchNormAct is act(BatchNorm(x, ...)) for act OpReLU, OpGELU or
// OpGELUTanh (OpIdentity is BatchNorm): one operation each way on a
// backend with BatchNormActBackend (the activation in the pass that
// writes the output; its gradient folded into batch norm's backward pass,
// which recomputes the normalised value from x instead of keeping it),
// else BatchNorm and the activation's operation. The results are those of
// the two operations, bit for bit on the CPU and CUDA backends. Batch norm
// runs in float32 under autocast, as BatchNorm does.
func BatchNormAct(x, weight, bias, runningMean, runningVar *Tensor, training bool, momentum, eps float32, act UnaryOp) *Tensor {
	if !BatchNormActivation(act) {
		panic(fmt.Sprintf("tensor: BatchNormAct with activation op %d; want OpIdentity, OpReLU, OpGELU or OpGELUTanh", act))
	}
	if _, ok := x.st.b.(BatchNormActBackend); !ok && act != OpIdentity {
		y := BatchNorm(x, weight, bias, runningMean, runningVar, training, momentum, eps)
		switch act {
		case OpReLU:
			return ReLU(y)
		case OpGELU:
			return GELU(y, false)
		default:
			return GELU(y, true)
		}
	}
	return batchNorm(x, weight, bias, runningMean, runningVar, training, momentum, eps, act)
}

// MaxPoolBatchNormAct is BatchNormAct(MaxPool2d(x, k, k), ...): batch
// norm, and its activation, of x [N, C, H, W] max-pooled over disjoint
// k×k windows. Where x is held channels-last on a backend with
// ChannelsLastPoolNormBackend its backward pass takes batch norm's input
// gradient straight into the pooling's, without writing the pooled
// gradient; elsewhere it is the two operations. Either way the results
// are the two operations', bit for bit.
func MaxPoolBatchNormAct(x *Tensor, k int, weight, bias, runningMean, runningVar *Tensor, training bool, momentum, eps float32, act UnaryOp) *Tensor {
	if !BatchNormActivation(act) {
		panic(fmt.Sprintf("tensor: MaxPoolBatchNormAct with activation op %d; want OpIdentity, OpReLU, OpGELU or OpGELUTanh", act))
	}
	if y := maxPoolBatchNormChannelsLast(x, k, weight, bias, runningMean, runningVar, training, momentum, eps, act); y != nil {
		return y
	}
	p := MaxPool2d(x, k, k)
	y := BatchNormAct(p, weight, bias, runningMean, runningVar, training, momentum, eps, act)
	ReleaseInput(p, y)
	return y
}

// batchNorm is BatchNorm followed by act through BatchNormActBackend, or
// BatchNorm alone for OpIdentity.
func batchNorm(x, weight, bias, runningMean, runningVar *Tensor, training bool, momentum, eps float32, act UnaryOp) *Tensor {
	if len(x.shape) < 2 {
		panic(fmt.Sprintf("tensor: BatchNorm of %v; want [N, C, ...]", x.shape))
	}
	n, c := x.shape[0], x.shape[1]
	inner := numel(x.shape[2:])
	checkBatchNorm(x.shape, x, weight, bias, runningMean, runningVar, training)
	x = x.Contiguous()
	if weight != nil {
		weight = weight.Contiguous()
	}
	if bias != nil {
		bias = bias.Contiguous()
	}
	be := x.st.b
	s := scopeOf(x, weight, bias)
	if training && s.replaying() {
		// Recompute's second run: the first updated the statistics.
		runningMean, runningVar = nil, nil
	}
	if cl, ok := channelsLastOf(be, s); ok && x.IsChannelsLast() {
		return batchNormChannelsLast(cl, s, x, weight, bias, runningMean, runningVar, training, momentum, eps, act)
	}
	out := Empty(be, s, x.shape...)
	mean, inv := Empty(be, s, c), Empty(be, s, c)
	if act == OpIdentity {
		nb := normOf(be)
		nb.BatchNorm(out.buffer(), mean.buffer(), inv.buffer(), optBuffer(runningMean), optBuffer(runningVar),
			x.buffer(), optBuffer(weight), optBuffer(bias), n, c, inner, training, momentum, eps)
		record(out, "batch_norm", func(g *Tensor, e *engine) {
			dx, accX := e.sink(x)
			dw, db, accW, accB := affineSinks(e, weight, bias)
			nb.BatchNormBackward(dx, dw, db, g.buffer(), x.buffer(), optBuffer(weight), mean.buffer(), inv.buffer(),
				n, c, inner, training, accX, accW, accB)
		}, x, weight, bias)
	} else {
		ab := be.(BatchNormActBackend)
		ab.BatchNormAct(out.buffer(), mean.buffer(), inv.buffer(), optBuffer(runningMean), optBuffer(runningVar),
			x.buffer(), optBuffer(weight), optBuffer(bias), n, c, inner, training, momentum, eps, act)
		record(out, "batch_norm_act", func(g *Tensor, e *engine) {
			dx, accX := e.sink(x)
			dw, db, accW, accB := affineSinks(e, weight, bias)
			ab.BatchNormActBackward(dx, dw, db, g.buffer(), x.buffer(), optBuffer(weight), optBuffer(bias), mean.buffer(), inv.buffer(),
				n, c, inner, training, act, accX, accW, accB)
		}, x, weight, bias)
	}
	saveFor(out, mean, inv)
	readsNot(out, true) // x and the statistics are what it reads
	return out
}

// LayerNorm normalises x over its last len(normalizedShape) dimensions,
// which must equal normalizedShape, as torch's layer_norm: each of the
// outer rows by its own mean and biased variance. weight and bias (shape
// normalizedShape, either may be nil) are the elementwise affine
// transform. The backward pass is one operation.
func LayerNorm(x *Tensor, normalizedShape []int, weight, bias *Tensor, eps float32) *Tensor {
	return layerNorm(x, normalizedShape, weight, bias, eps, false)
}

// LayerNormHalf is LayerNorm for a result that only autocast's products
// read (a transformer block's projections): under autocast its result is
// bfloat16, rounded as it is written (LayerNormCastBackend; elsewhere
// LayerNorm then Cast), where those products would round a float32 result
// themselves: the same bits reach them, and no float32 result is written
// and read again. Linear takes it as its bfloat16 operand and keeps it for
// its backward pass instead of a copy. Its gradient is float32, as every
// gradient is, and its backward pass is LayerNorm's. Without autocast it
// is LayerNorm.
func LayerNormHalf(x *Tensor, normalizedShape []int, weight, bias *Tensor, eps float32) *Tensor {
	return layerNorm(x, normalizedShape, weight, bias, eps, AutocastOf(x, weight, bias) == BFloat16)
}

// layerNorm is LayerNorm, with a bfloat16 result when half.
func layerNorm(x *Tensor, normalizedShape []int, weight, bias *Tensor, eps float32, half bool) *Tensor {
	k := len(normalizedShape)
	if k == 0 || k > len(x.shape) || !slices.Equal(x.shape[len(x.shape)-k:], normalizedShape) || numel(normalizedShape) == 0 {
		panic(fmt.Sprintf("tensor: LayerNorm of %v over %v", x.shape, normalizedShape))
	}
	for _, p := range []struct {
		name string
		t    *Tensor
	}{{"weight", weight}, {"bias", bias}} {
		if p.t != nil && !slices.Equal(p.t.shape, normalizedShape) {
			panic(fmt.Sprintf("tensor: LayerNorm %s %v for normalized shape %v", p.name, p.t.shape, normalizedShape))
		}
	}
	sameBackend(nonNil(x, weight, bias)...)
	x = x.Contiguous()
	if weight != nil {
		weight = weight.Contiguous()
	}
	if bias != nil {
		bias = bias.Contiguous()
	}
	cols := numel(normalizedShape)
	rows := x.Len() / cols
	be := x.st.b
	nb := normOf(be)
	s := scopeOf(x, weight, bias)
	mean, inv := Empty(be, s, rows), Empty(be, s, rows)
	var out *Tensor
	if cb, ok := be.(LayerNormCastBackend); half && ok {
		out = newTensor(be, BFloat16, s, x.shape...)
		cb.LayerNormCast(out.buffer(), mean.buffer(), inv.buffer(), x.buffer(), optBuffer(weight), optBuffer(bias), rows, cols, eps)
	} else {
		out = Empty(be, s, x.shape...)
		nb.LayerNorm(out.buffer(), mean.buffer(), inv.buffer(), x.buffer(), optBuffer(weight), optBuffer(bias), rows, cols, eps)
		if half {
			f := out
			out = newTensor(be, BFloat16, s, x.shape...)
			productsFor(be, s).lp.Cast(out.buffer(), f.buffer())
			f.Release()
		}
	}
	record(out, "layer_norm", func(g *Tensor, e *engine) {
		dx, accX := e.sink(x)
		dw, db, accW, accB := affineSinks(e, weight, bias)
		nb.LayerNormBackward(dx, dw, db, g.buffer(), x.buffer(), optBuffer(weight), mean.buffer(), inv.buffer(),
			rows, cols, accX, accW, accB)
	}, x, weight, bias)
	saveFor(out, mean, inv)
	readsNot(out, true) // x and the statistics are what it reads
	return out
}

// optBuffer is t's buffer, or the empty Buffer for nil.
func optBuffer(t *Tensor) Buffer {
	if t == nil {
		return Buffer{}
	}
	return t.buffer()
}

// normOf is b's NormBackend, or the host fallback.
func normOf(b Backend) NormBackend {
	if nb, ok := b.(NormBackend); ok {
		return nb
	}
	return hostNorm{b}
}

// hostNorm runs the CPU's normalisation on host copies of a backend's
// buffers: every operand is downloaded, the outputs uploaded back.
type hostNorm struct{ b Backend }

// host returns a CPU copy of buf (empty for empty).
func (h hostNorm) host(buf Buffer) Buffer {
	if buf.Empty() {
		return Buffer{}
	}
	c, _ := CPU.Alloc(buf.Len, Float32)
	h.b.Download(f32(c), buf)
	return c
}

// back uploads the CPU copies of the outputs.
func (h hostNorm) back(pairs ...Buffer) {
	for i := 0; i < len(pairs); i += 2 {
		if !pairs[i].Empty() {
			h.b.Upload(pairs[i], f32(pairs[i+1]))
		}
	}
}

func (h hostNorm) BatchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, n, c, inner int, training bool, momentum, eps float32) {
	hy, hm, hi, hrm, hrv := h.host(y), h.host(saveMean), h.host(saveInvStd), h.host(runMean), h.host(runVar)
	CPU.(NormBackend).BatchNorm(hy, hm, hi, hrm, hrv, h.host(x), h.host(weight), h.host(bias), n, c, inner, training, momentum, eps)
	h.back(y, hy, saveMean, hm, saveInvStd, hi, runMean, hrm, runVar, hrv)
}

func (h hostNorm) BatchNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd Buffer, n, c, inner int, training, accX, accW, accB bool) {
	hdx, hdw, hdb := h.host(dx), h.host(dweight), h.host(dbias)
	CPU.(NormBackend).BatchNormBackward(hdx, hdw, hdb, h.host(dy), h.host(x), h.host(weight), h.host(saveMean), h.host(saveInvStd), n, c, inner, training, accX, accW, accB)
	h.back(dx, hdx, dweight, hdw, dbias, hdb)
}

func (h hostNorm) LayerNorm(y, saveMean, saveInvStd, x, weight, bias Buffer, rows, cols int, eps float32) {
	hy, hm, hi := h.host(y), h.host(saveMean), h.host(saveInvStd)
	CPU.(NormBackend).LayerNorm(hy, hm, hi, h.host(x), h.host(weight), h.host(bias), rows, cols, eps)
	h.back(y, hy, saveMean, hm, saveInvStd, hi)
}

func (h hostNorm) LayerNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd Buffer, rows, cols int, accX, accW, accB bool) {
	hdx, hdw, hdb := h.host(dx), h.host(dweight), h.host(dbias)
	CPU.(NormBackend).LayerNormBackward(hdx, hdw, hdb, h.host(dy), h.host(x), h.host(weight), h.host(saveMean), h.host(saveInvStd), rows, cols, accX, accW, accB)
	h.back(dx, hdx, dweight, hdw, dbias, hdb)
}

// affineSinks are the gradient buffers of a normalisation's optional
// weight and bias (empty for a missing one) and whether each accumulates.
func affineSinks(e *engine, weight, bias *Tensor) (dw, db Buffer, accW, accB bool) {
	if weight != nil {
		dw, accW = e.sink(weight)
	}
	if bias != nil {
		db, accB = e.sink(bias)
	}
	return dw, db, accW, accB
}

// checkBatchNorm panics where batch norm of an input of shape ([N, C,
// ...]; x's own, or what pooling x gives) cannot take its parameters and
// statistics.
func checkBatchNorm(shape []int, x, weight, bias, runningMean, runningVar *Tensor, training bool) {
	n, c := shape[0], shape[1]
	inner := numel(shape[2:])
	for _, p := range []struct {
		name string
		t    *Tensor
	}{{"weight", weight}, {"bias", bias}, {"running mean", runningMean}, {"running var", runningVar}} {
		if p.t != nil && (len(p.t.shape) != 1 || p.t.shape[0] != c) {
			panic(fmt.Sprintf("tensor: BatchNorm %s %v for input %v; want [%d]", p.name, p.t.shape, shape, c))
		}
	}
	if (runningMean == nil) != (runningVar == nil) {
		panic("tensor: BatchNorm needs both running statistics or neither")
	}
	if !training && runningMean == nil {
		panic(fmt.Sprintf("tensor: BatchNorm of %v in evaluation mode without running statistics", shape))
	}
	if training && n*inner < 2 {
		panic(fmt.Sprintf("tensor: BatchNorm in training of %v: more than one value per channel needed", shape))
	}
	sameBackend(nonNil(x, weight, bias, runningMean, runningVar)...)
	for _, r := range nonNil(runningMean, runningVar) {
		if !r.IsContiguous() {
			panic("tensor: BatchNorm running statistics must be contiguous (they are updated in place)")
		}
	}
}
