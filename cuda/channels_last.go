package cuda

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// The backend's tensor.ChannelsLastBackend: autocast's activations held as
// bfloat16 [rows, C], the layout cuDNN's tensor-core convolutions read and
// write, so that convolutions take and give them with no cast
// (conv_cudnn.go) and batch norm, the activations, sums and max pooling
// run on them directly (kernels/channels_last.cu).

var _ tensor.ChannelsLastBackend = (*Backend)(nil)

// The modes of kernels/channels_last.cu's kernels.
const (
	clStats  = 0 // ember_cl_channel_sums / finalize: batch norm's statistics
	clBNGrad = 1 // batch norm's gradient sums
	clSum    = 2 // a bias gradient: Σ dy
	clEval   = 3 // finalize: statistics from the running ones

	clBN      = 0 // ember_cl_apply: batch norm and its activation
	clAct     = 1 // an activation
	clBias    = 2 // a convolution's bias and ReLU
	clActGrad = 3 // an activation's gradient
	clBNDX    = 4 // batch norm's input gradient
	clAdd     = 5 // a sum
)

// clMaxChannels is the widest row the kernels take: ember_cl_channel_sums
// keeps a block's rows of sums, 2,048 floats each, in shared memory.
const clMaxChannels = 2048

// clPtr is the address of a channels-last buffer of at least n elements:
// bfloat16 and 16-byte aligned, as the kernels move eight elements at a
// time.
func (b *Backend) clPtr(op, what string, buf tensor.Buffer, n int) uintptr {
	need(op, what, buf, n)
	p := b.ptr(op, buf, tensor.BFloat16)
	if p%16 != 0 {
		panic(fmt.Sprintf("cuda: %s: %s at %#x is not 16-byte aligned", op, what, p))
	}
	return p
}

// clChannels panics for a channel count the kernels do not take.
func clChannels(op string, c int) {
	if c <= 0 || c%8 != 0 || c > clMaxChannels {
		panic(fmt.Sprintf("cuda: %s: %d channels; want a positive multiple of 8 up to %d", op, c, clMaxChannels))
	}
}

// ConvChannelsLast reports whether g's convolution runs on cuDNN with
// channels-last bfloat16 tensors and an output the kernels take.
func (b *Backend) ConvChannelsLast(g tensor.ConvGeom) bool {
	if g.K%8 != 0 || g.K > clMaxChannels || !b.ConvLowp(g) {
		return false
	}
	dg, ok := b.lowpGeom(convShapeOf("conv2d_channels_last", g))
	return ok && dg.nhwc
}

func (b *Backend) ToChannelsLast(dst, src tensor.Buffer, n, c, inner int) {
	const op = "to_channels_last"
	need(op, "src", src, n*c*inner)
	need(op, "dst", dst, n*c*inner)
	b.toLowp(op, b.ptr(op, dst, tensor.BFloat16), b.f32(op, src), 0, n, c, inner, true)
}

func (b *Backend) FromChannelsLast(dst, src tensor.Buffer, n, c, inner int, accumulate bool) {
	const op = "from_channels_last"
	need(op, "src", src, n*c*inner)
	need(op, "dst", dst, n*c*inner)
	b.fromLowp(op, b.f32(op, dst), b.ptr(op, src, tensor.BFloat16), 0, n, c, inner, false, accumulate, true)
}

// clApply queues a pass of kernels/channels_last.cu over n elements of
// rows of c channels: batch norm's two passes have a kernel each
// (ember_cl_bn_rows: a thread's eight channels fixed, two rows at a time,
// a wave of blocks: clRowsGrid), the others share
// ember_cl_pointwise.
func (b *Backend) clApply(op string, y, x, dy, tab, bias uintptr, act tensor.UnaryOp, mode int, training bool, n, c int) {
	if n == 0 {
		return
	}
	n8 := n / 8
	rows := n / c
	r := blockSize / (c / 8)
	block := Dim3{X: blockSize, Y: 1, Z: 1}
	switch mode {
	case clBN:
		const name = "ember_cl_bn_apply"
		grid := b.clRowsGrid(name, rows, 2*r)
		devCheck(op, b.x.launch(b.kernel(name), grid, block, []any{y, x, tab, int32(act), int64(rows), i32arg(op, c)}))
	case clBNDX:
		const name = "ember_cl_bn_dx"
		grid := b.clRowsGrid(name, rows, 2*r)
		devCheck(op, b.x.launch(b.kernel(name), grid, block, []any{y, x, dy, tab, int32(act), flag(training), int64(rows), i32arg(op, c)}))
	case clAct, clActGrad:
		if act == tensor.OpGELU {
			// GELU's own passes (kernels/channels_last.cu's
			// ember_cl_gelu_pass): the same bits, fewer instructions.
			if mode == clAct {
				b.launch(op, b.kernel("ember_cl_gelu_fwd"), n8, y, x, int64(n8))
			} else {
				b.launch(op, b.kernel("ember_cl_gelu_bwd"), n8, y, x, dy, int64(n8))
			}
			return
		}
		fallthrough
	default:
		b.launch(op, b.kernel("ember_cl_pointwise"), n8, y, x, dy, bias, int32(act), int32(mode), int64(n8), i32arg(op, c))
	}
}

// clRowsGrid is the grid of a channels-last pass (kernel name, blocks of
// blockSize threads) whose blocks take perBlock rows at a time, striding
// over the grid: enough blocks for the rows, at most one wave of them
// (Backend.wave), so that every block runs from the start and none waits
// for a second round (airbench's gradient sums, two rounds of 2 blocks an
// SM before: 10% faster; docs/performance.md, round 35).
func (b *Backend) clRowsGrid(name string, rows, perBlock int) Dim3 {
	return Dim3{X: max(1, min((rows+perBlock-1)/perBlock, b.wave(name, blockSize))), Y: 1, Z: 1}
}

// clSums queues kernels/channels_last.cu's sums of the mode (a kernel
// each) over rows of c channels into a new workspace of partial sums,
// and returns it with its block count: four blocks an SM at most (the
// gradient sums' one wave), so that ember_cl_bn_finalize adds few
// partials. Batch norm's gradient sums also
// write g = dy·act'(z) to gout where it is not 0.
func (b *Backend) clSums(op string, gout, x, dy, mean, inv, w, bias uintptr, act tensor.UnaryOp, rows, c, mode int) (Block, int) {
	part, nb := b.clPartials(op, rows, c)
	if mode == clBNGrad {
		// Its registers leave room for fewer blocks an SM than the others'
		// (and its partials need not match the pooling's, as the
		// statistics' must).
		nb = min(nb, b.clRowsGrid("ember_cl_grad_sums", rows, blockSize/(c/8)).X)
	}
	grid, block := Dim3{X: nb, Y: 1, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1}
	var err error
	switch mode {
	case clStats:
		err = b.x.launch(b.kernel("ember_cl_stats"), grid, block, []any{part.Ptr(), x, int64(rows), i32arg(op, c)})
	case clBNGrad:
		err = b.x.launch(b.kernel("ember_cl_grad_sums"), grid, block,
			[]any{part.Ptr(), gout, x, dy, mean, inv, w, bias, int32(act), int64(rows), i32arg(op, c)})
	default:
		err = b.x.launch(b.kernel("ember_cl_dy_sums"), grid, block, []any{part.Ptr(), dy, int64(rows), i32arg(op, c)})
	}
	devCheck(op, err)
	return part, nb
}

// clPartials is the grid of ember_cl_channel_sums's kernels (and of
// ember_cl_maxpool_stats, which must match them) over rows of c channels
// and a new workspace for its partial sums.
func (b *Backend) clPartials(op string, rows, c int) (Block, int) {
	r := blockSize / (c / 8)
	nb := max(1, min((rows+r-1)/r, 4*b.dev.MultiprocessorCount()))
	return b.workspace(op, 4*2*nb*c), nb
}

// clTab is ember_cl_bn_finalize's table of c channels (six rows).
func (b *Backend) clTab(op string, c int) Block { return b.workspace(op, 4*6*c) }

// clFinalizeThreads is ember_cl_bn_finalize's block (EMBER_CL_FIN_THREADS):
// 128 threads a channel, so that each has a few of the partials' loads.
const clFinalizeThreads = 1024

// clFinalize queues ember_cl_bn_finalize over c channels (a block each
// eight).
func (b *Backend) clFinalize(op string, part uintptr, nb, c, rows, mode int, x, saveMean, saveInvStd, runMean, runVar uintptr,
	momentum, eps float32, w, bias, dweight, dbias uintptr, accW, accB bool, tab uintptr) {
	devCheck(op, b.x.launch(b.kernel("ember_cl_bn_finalize"), Dim3{X: c / 8, Y: 1, Z: 1}, Dim3{X: clFinalizeThreads, Y: 1, Z: 1}, []any{part, i32arg(op, nb), i32arg(op, c), int64(rows), int32(mode),
		x, saveMean, saveInvStd, runMean, runVar, momentum, eps, w, bias, dweight, dbias, flag(accW), flag(accB), tab}))
}

// clStatsParams checks batch norm's saved statistics and optional affine
// parameters of c channels and returns their addresses (0: no parameter).
func (b *Backend) clStatsParams(op string, saveMean, saveInvStd, weight, bias tensor.Buffer, c int) (pm, pi, pw, pb uintptr) {
	need(op, "saveMean", saveMean, c)
	need(op, "saveInvStd", saveInvStd, c)
	return b.f32(op, saveMean), b.f32(op, saveInvStd), b.f32Opt(op, "weight", weight, c), b.f32Opt(op, "bias", bias, c)
}

func (b *Backend) BatchNormChannelsLast(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias tensor.Buffer, rows, c int, training bool, momentum, eps float32, act tensor.UnaryOp) {
	const op = "batch_norm_channels_last"
	clChannels(op, c)
	n := rows * c
	py, px := b.clPtr(op, "y", y, n), b.clPtr(op, "x", x, n)
	pm, pi, pw, pb := b.clStatsParams(op, saveMean, saveInvStd, weight, bias, c)
	prm, prv := b.f32Opt(op, "runMean", runMean, c), b.f32Opt(op, "runVar", runVar, c)
	if training && rows < 2 {
		panic(fmt.Sprintf("cuda: %s: %d rows in training", op, rows))
	}
	var part Block
	nb := 0
	if training {
		part, nb = b.clSums(op, 0, px, 0, 0, 0, 0, 0, 0, rows, c, clStats)
	}
	b.clNormalize(op, part, nb, py, px, pm, pi, prm, prv, pw, pb, rows, c, training, momentum, eps, act)
}

// clNormalize finishes batch norm's forward pass over x's rows: the
// statistics from the partial sums part of nb blocks (training; the
// workspace is released) or the running statistics, then y = act(z).
func (b *Backend) clNormalize(op string, part Block, nb int, py, px, pm, pi, prm, prv, pw, pb uintptr, rows, c int, training bool, momentum, eps float32, act tensor.UnaryOp) {
	tab := b.clTab(op, c)
	defer b.release(tab)
	if training {
		b.clFinalize(op, part.Ptr(), nb, c, rows, clStats, px, pm, pi, prm, prv, momentum, eps, pw, pb, 0, 0, false, false, tab.Ptr())
		b.release(part)
	} else {
		if prm == 0 || prv == 0 {
			panic(fmt.Sprintf("cuda: %s: evaluation without running statistics", op))
		}
		b.clFinalize(op, 0, 0, c, rows, clEval, 0, pm, pi, prm, prv, momentum, eps, pw, pb, 0, 0, false, false, tab.Ptr())
	}
	b.clApply(op, py, px, 0, tab.Ptr(), 0, act, clBN, training, rows*c, c)
}

// MaxPoolBatchNormChannelsLast implements
// tensor.ChannelsLastPoolNormBackend: in training the pooling writes
// batch norm's partial sums of its output as it goes
// (ember_cl_maxpool_stats), so that the statistics need no pass over p;
// the results are those of MaxPoolChannelsLast then
// BatchNormChannelsLast, bit for bit.
func (b *Backend) MaxPoolBatchNormChannelsLast(y, p, idx, saveMean, saveInvStd, runMean, runVar, x, weight, bias tensor.Buffer, pool tensor.PoolGeom, training bool, momentum, eps float32, act tensor.UnaryOp) {
	const op = "maxpool_batch_norm_channels_last"
	rows := pool.N * pool.OutH() * pool.OutW()
	if !training || rows < 2 {
		b.MaxPoolChannelsLast(p, idx, x, pool)
		b.BatchNormChannelsLast(y, saveMean, saveInvStd, runMean, runVar, p, weight, bias, rows, pool.C, training, momentum, eps, act)
		return
	}
	clPool(op, pool)
	c := pool.C
	n := rows * c
	py, pp, px := b.clPtr(op, "y", y, n), b.clPtr(op, "p", p, n), b.clPtr(op, "x", x, pool.N*pool.H*pool.W*c)
	pi := b.clIdx(op, idx, n)
	pm, pinv, pw, pb := b.clStatsParams(op, saveMean, saveInvStd, weight, bias, c)
	prm, prv := b.f32Opt(op, "runMean", runMean, c), b.f32Opt(op, "runVar", runVar, c)
	kernel := "ember_cl_maxpool_stats"
	if pool.KH == 2 && pool.KW == 2 {
		kernel = "ember_cl_maxpool2_stats"
	}
	part, nb := b.clPartials(op, rows, c)
	devCheck(op, b.x.launch(b.kernel(kernel), Dim3{X: nb, Y: 1, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1},
		[]any{part.Ptr(), pp, pi, px, i32arg(op, pool.H), i32arg(op, pool.W), i32arg(op, c), i32arg(op, pool.OutH()),
			i32arg(op, pool.OutW()), i32arg(op, pool.KH), i32arg(op, pool.KW), int64(rows)}))
	b.clNormalize(op, part, nb, py, pp, pm, pinv, prm, prv, pw, pb, rows, c, true, momentum, eps, act)
}

func (b *Backend) BatchNormBackwardChannelsLast(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd tensor.Buffer, rows, c int, training bool, act tensor.UnaryOp, accW, accB bool) {
	const op = "batch_norm_backward_channels_last"
	if dx.Empty() && dweight.Empty() && dbias.Empty() {
		return
	}
	clChannels(op, c)
	n := rows * c
	pdy, px := b.clPtr(op, "dy", dy, n), b.clPtr(op, "x", x, n)
	pm, pi, pw, pb := b.clStatsParams(op, saveMean, saveInvStd, weight, bias, c)
	pdw, pdb := b.f32Opt(op, "dweight", dweight, c), b.f32Opt(op, "dbias", dbias, c)
	var pdx uintptr
	if !dx.Empty() {
		pdx = b.clPtr(op, "dx", dx, n)
	}
	if rows == 0 {
		return
	}
	// The sums pass leaves g = dy·act'(z) in dx's memory (rounded to
	// bfloat16, as a separate activation's backward pass would write it),
	// and the dx pass reads it there: the activation's derivative is
	// computed once, not in both passes. Not where dx shares memory with x
	// or dy, which the sums pass is still reading.
	var gout uintptr
	dxAct := act
	if pdx != 0 && act != tensor.OpIdentity && !overlaps(pdx, 2*n, px, 2*n) && !overlaps(pdx, 2*n, pdy, 2*n) {
		gout, dxAct = pdx, tensor.OpIdentity
	}
	part, nb := b.clSums(op, gout, px, pdy, pm, pi, pw, pb, act, rows, c, clBNGrad)
	tab := b.clTab(op, c)
	b.clFinalize(op, part.Ptr(), nb, c, rows, clBNGrad, 0, pm, pi, 0, 0, 0, 0, pw, pb, pdw, pdb, accW, accB, tab.Ptr())
	b.release(part)
	if pdx != 0 {
		gin := pdy
		if gout != 0 {
			gin = gout
		}
		b.clApply(op, pdx, px, gin, tab.Ptr(), 0, dxAct, clBNDX, training, n, c)
	}
	b.release(tab)
}

// BatchNormMaxPoolBackwardChannelsLast implements
// tensor.ChannelsLastPoolNormBackend: BatchNormBackwardChannelsLast's sums
// and finish over the pooled rows p, then one pass
// (ember_cl_bn_dx_maxpool_backward) that computes each pooled row's input
// gradient and writes it, and the zeros around it, into dx's windows.
// The gradient of the activation, g, goes to a workspace the size of p.
func (b *Backend) BatchNormMaxPoolBackwardChannelsLast(dx, dweight, dbias, dy, p, idx, weight, bias, saveMean, saveInvStd tensor.Buffer, pool tensor.PoolGeom, training bool, act tensor.UnaryOp, accW, accB bool) {
	const op = "batch_norm_maxpool_backward_channels_last"
	if dx.Empty() {
		rows := pool.N * pool.OutH() * pool.OutW()
		b.BatchNormBackwardChannelsLast(tensor.Buffer{}, dweight, dbias, dy, p, weight, bias, saveMean, saveInvStd, rows, pool.C, training, act, accW, accB)
		return
	}
	clPool(op, pool)
	c := pool.C
	rows := pool.N * pool.OutH() * pool.OutW()
	n := rows * c
	pdx := b.clPtr(op, "dx", dx, pool.N*pool.H*pool.W*c)
	pdy, pp, pi := b.clPtr(op, "dy", dy, n), b.clPtr(op, "p", p, n), b.clIdx(op, idx, n)
	pm, pinv, pw, pb := b.clStatsParams(op, saveMean, saveInvStd, weight, bias, c)
	pdw, pdb := b.f32Opt(op, "dweight", dweight, c), b.f32Opt(op, "dbias", dbias, c)
	if n == 0 {
		return
	}
	gin := pdy
	var gw Block
	if act != tensor.OpIdentity {
		gw = b.workspace(op, 2*n)
		defer b.release(gw)
		gin = gw.Ptr()
	}
	part, nb := b.clSums(op, gw.Ptr(), pp, pdy, pm, pinv, pw, pb, act, rows, c, clBNGrad)
	tab := b.clTab(op, c)
	defer b.release(tab)
	b.clFinalize(op, part.Ptr(), nb, c, rows, clBNGrad, 0, pm, pinv, 0, 0, 0, 0, pw, pb, pdw, pdb, accW, accB, tab.Ptr())
	b.release(part)
	const name = "ember_cl_bn_dx_maxpool_backward"
	grid := b.clRowsGrid(name, rows, blockSize/(c/8))
	devCheck(op, b.x.launch(b.kernel(name), grid, Dim3{X: blockSize, Y: 1, Z: 1},
		[]any{pdx, pp, gin, pi, tab.Ptr(), flag(training), i32arg(op, pool.H), i32arg(op, pool.W), i32arg(op, c),
			i32arg(op, pool.OutH()), i32arg(op, pool.OutW()), i32arg(op, pool.KH), i32arg(op, pool.KW), int64(rows)}))
}

var _ tensor.ChannelsLastPoolNormBackend = (*Backend)(nil)

// clActivation checks an activation of the form.
func clActivation(op string, act tensor.UnaryOp) {
	if act != tensor.OpReLU && act != tensor.OpGELU && act != tensor.OpGELUTanh {
		panic(fmt.Sprintf("cuda: %s: activation op %d; want ReLU, GELU or GELU (tanh)", op, act))
	}
}

// clLen checks an elementwise pass's element count (whole groups of 8).
func clLen(op string, n int) {
	if n < 0 || n%8 != 0 {
		panic(fmt.Sprintf("cuda: %s: %d elements; want a multiple of 8", op, n))
	}
}

func (b *Backend) UnaryChannelsLast(y, x tensor.Buffer, act tensor.UnaryOp, n int) {
	const op = "unary_channels_last"
	clActivation(op, act)
	clLen(op, n)
	b.clApply(op, b.clPtr(op, "y", y, n), b.clPtr(op, "x", x, n), 0, 0, 0, act, clAct, false, n, 8)
}

func (b *Backend) UnaryBackwardChannelsLast(dx, dy, x tensor.Buffer, act tensor.UnaryOp, n int) {
	const op = "unary_backward_channels_last"
	clActivation(op, act)
	clLen(op, n)
	b.clApply(op, b.clPtr(op, "dx", dx, n), b.clPtr(op, "x", x, n), b.clPtr(op, "dy", dy, n), 0, 0, act, clActGrad, false, n, 8)
}

func (b *Backend) AddChannelsLast(y, a, c tensor.Buffer, n int) {
	const op = "add_channels_last"
	clLen(op, n)
	b.clApply(op, b.clPtr(op, "y", y, n), b.clPtr(op, "a", a, n), b.clPtr(op, "b", c, n), 0, 0, 0, clAdd, false, n, 8)
}

// clPool checks a pooling of the form: disjoint windows, no padding.
func clPool(op string, p tensor.PoolGeom) {
	clChannels(op, p.C)
	if p.StrideH != p.KH || p.StrideW != p.KW || p.PadH != 0 || p.PadW != 0 || p.OutH() < 1 || p.OutW() < 1 || p.KH*p.KW > 256 {
		panic(fmt.Sprintf("cuda: %s: window %dx%d stride %dx%d padding %dx%d; want disjoint windows without padding",
			op, p.KH, p.KW, p.StrideH, p.StrideW, p.PadH, p.PadW))
	}
}

// clIdx is the address of max pooling's window positions (uint8, [N, OH,
// OW, C]; 8-byte aligned, as the kernels move eight at a time).
func (b *Backend) clIdx(op string, buf tensor.Buffer, n int) uintptr {
	need(op, "idx", buf, n)
	p := b.ptr(op, buf, tensor.Uint8)
	if p%8 != 0 {
		panic(fmt.Sprintf("cuda: %s: idx at %#x is not 8-byte aligned", op, p))
	}
	return p
}

func (b *Backend) MaxPoolChannelsLast(y, idx, x tensor.Buffer, p tensor.PoolGeom) {
	const op = "maxpool2d_channels_last"
	clPool(op, p)
	oh, ow := p.OutH(), p.OutW()
	n8 := p.N * oh * ow * p.C / 8
	py, px := b.clPtr(op, "y", y, 8*n8), b.clPtr(op, "x", x, p.N*p.H*p.W*p.C)
	pi := b.clIdx(op, idx, 8*n8)
	kernel := "ember_cl_maxpool"
	if p.KH == 2 && p.KW == 2 {
		kernel = "ember_cl_maxpool2" // the window's loads issued together
	}
	b.launch(op, b.kernel(kernel), n8, py, pi, px, i32arg(op, p.H), i32arg(op, p.W), i32arg(op, p.C),
		i32arg(op, oh), i32arg(op, ow), i32arg(op, p.KH), i32arg(op, p.KW), int64(n8))
}

func (b *Backend) MaxPoolBackwardChannelsLast(dx, dy, idx tensor.Buffer, p tensor.PoolGeom) {
	const op = "maxpool2d_backward_channels_last"
	clPool(op, p)
	oh, ow := p.OutH(), p.OutW()
	n8 := p.N * oh * ow * p.C / 8
	pdx := b.clPtr(op, "dx", dx, p.N*p.H*p.W*p.C)
	pdy, pi := b.clPtr(op, "dy", dy, 8*n8), b.clIdx(op, idx, 8*n8)
	b.launch(op, b.kernel("ember_cl_maxpool_backward"), n8, pdx, pdy, pi, i32arg(op, p.H), i32arg(op, p.W), i32arg(op, p.C),
		i32arg(op, oh), i32arg(op, ow), i32arg(op, p.KH), i32arg(op, p.KW), int64(n8))
}

// Conv2dChannelsLast runs the convolution on cuDNN from and into the
// form, with the bias and ReLU after it in one pass over y; where cuDNN
// refuses, it is Conv2dLowp on float32 copies.
func (b *Backend) Conv2dChannelsLast(y, x, w, bias tensor.Buffer, g tensor.ConvGeom) {
	b.conv2dChannelsLast(y, x, w, tensor.Buffer{}, bias, g)
}

// Conv2dChannelsLastFilter implements tensor.ChannelsLastFilterBackend:
// Conv2dChannelsLast with the filter's cast already made (wf, from
// ToFilterForm).
func (b *Backend) Conv2dChannelsLastFilter(y, x, w, wf, bias tensor.Buffer, g tensor.ConvGeom) {
	b.conv2dChannelsLast(y, x, w, wf, bias, g)
}

// FilterFormLen implements tensor.ChannelsLastFilterBackend: a filter
// read by cuDNN (not by the first layer's direct kernel) has a form, the
// bfloat16 copy [K][R][S][C/groups] that each pass otherwise casts anew.
func (b *Backend) FilterFormLen(g tensor.ConvGeom) int {
	c := convShapeOf("filter_form", g)
	if clSmallConv(c) || c.crs == 0 {
		return 0
	}
	if dg, ok := b.lowpGeom(c); !ok || !dg.nhwc {
		return 0
	}
	return c.wLen
}

// ToFilterForm implements tensor.ChannelsLastFilterBackend.
func (b *Backend) ToFilterForm(wf, w tensor.Buffer, g tensor.ConvGeom) {
	const op = "to_filter_form"
	c := convShapeOf(op, g)
	need(op, "w", w, c.wLen)
	pf := b.clPtr(op, "wf", wf, c.wLen)
	b.toLowp(op, pf, b.f32(op, w), 0, g.K, g.C/c.groups, g.R*g.S, true)
}

// filterForm is wf's address, checked against g's filter (0: none).
func (b *Backend) filterForm(op string, wf tensor.Buffer, c convShape) uintptr {
	if wf.Empty() {
		return 0
	}
	return b.clPtr(op, "wf", wf, c.wLen)
}

func (b *Backend) conv2dChannelsLast(y, x, w, wf, bias tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d_channels_last"
	c := convShapeOf(op, g)
	clChannels(op, g.K)
	py, px := b.clPtr(op, "y", y, c.yLen), b.clPtr(op, "x", x, c.xLen)
	need(op, "w", w, c.wLen)
	pw := b.f32(op, w)
	pbias := b.f32Opt(op, "bias", bias, g.K)
	if c.yLen == 0 {
		return
	}
	if name := b.clSmallMMA(c); name != "" {
		dh, dw := g.Dilation()
		p := g.N * c.oh * c.ow
		args := []any{py, px, pw, pbias, flag(g.ReLU),
			i32arg(op, g.C), i32arg(op, g.H), i32arg(op, g.W), i32arg(op, g.K), i32arg(op, g.R), i32arg(op, g.S),
			i32arg(op, g.StrideH), i32arg(op, g.StrideW), i32arg(op, g.PadH), i32arg(op, g.PadW),
			i32arg(op, dh), i32arg(op, dw), i32arg(op, c.oh), i32arg(op, c.ow), i32arg(op, p)}
		// A warp a tile of 16 positions, eight warps a block.
		grid := b.clRowsGrid(name, (p+15)/16, blockSize/32)
		devCheck(op, b.x.launch(b.kernel(name), grid, Dim3{X: blockSize, Y: 1, Z: 1}, append(args, dividerArgs(c.p, c.ow)...)))
		return
	}
	if clSmallConv(c) {
		dh, dw := g.Dilation()
		gb := clSmallGroups(g.K / 8)
		items := c.yLen / (8 * gb)
		args := []any{py, px, pw, pbias, flag(g.ReLU),
			i32arg(op, g.C), i32arg(op, g.H), i32arg(op, g.W), i32arg(op, g.K), i32arg(op, g.R), i32arg(op, g.S),
			i32arg(op, g.StrideH), i32arg(op, g.StrideW), i32arg(op, g.PadH), i32arg(op, g.PadW),
			i32arg(op, dh), i32arg(op, dw), i32arg(op, c.oh), i32arg(op, c.ow), i32arg(op, items), int32(gb)}
		b.launch(op, b.kernel(clSmallKernel(g, false)), items, append(args, dividerArgs(g.K/(8*gb), c.ow, c.oh)...)...)
		return
	}
	if dg, ok := b.lowpGeom(c); ok && dg.nhwc && c.crs > 0 && b.conv2dChannelsLastCuDNN(op, dg, py, px, pw, b.filterForm(op, wf, c), c) {
		if pbias != 0 || g.ReLU {
			var act tensor.UnaryOp
			if g.ReLU {
				act = tensor.OpReLU
			}
			b.clApply(op, py, py, 0, 0, pbias, act, clBias, false, c.yLen, g.K)
		}
		return
	}
	xf, yf := b.mustAlloc(op, c.xLen), b.mustAlloc(op, c.yLen)
	defer b.Free(xf)
	defer b.Free(yf)
	b.FromChannelsLast(xf, x, g.N, g.C, g.H*g.W, false)
	b.Conv2dLowp(yf, xf, w, bias, g)
	b.ToChannelsLast(y, yf, g.N, g.K, c.p)
}

// clSmallGroups is how many of g eight-channel groups a thread of
// ember_cl_conv_small takes: the most that divides g, up to four
// (EMBER_CL_SMALL_GROUPS).
func clSmallGroups(g int) int {
	for gb := 4; gb > 1; gb-- {
		if g%gb == 0 {
			return gb
		}
	}
	return 1
}

// clSmallKernels are the entry points of ember_cl_conv_small and
// ember_cl_conv_dw_small compiled for a C, R and S (common first layers:
// their taps unroll); clSmallKernel picks.
var clSmallKernels = map[[3]int][2]string{
	{3, 2, 2}: {"ember_cl_conv_small_c3r2s2", "ember_cl_conv_dw_small_c3r2s2"},
	{1, 3, 3}: {"ember_cl_conv_small_c1r3s3", "ember_cl_conv_dw_small_c1r3s3"},
	{3, 3, 3}: {"ember_cl_conv_small_c3r3s3", "ember_cl_conv_dw_small_c3r3s3"},
}

// clSmallKernel is g's entry point of ember_cl_conv_small (filterGrad
// false) or ember_cl_conv_dw_small: one compiled for its C, R and S where
// there is one, else the one that takes any.
func clSmallKernel(g tensor.ConvGeom, filterGrad bool) string {
	i := 0
	if filterGrad {
		i = 1
	}
	if k, ok := clSmallKernels[[3]int{g.C, g.R, g.S}]; ok {
		return k[i]
	}
	return [2]string{"ember_cl_conv_small", "ember_cl_conv_dw_small"}[i]
}

// clSmallConv reports whether c's forward pass takes ember_cl_conv_small:
// few taps per output channel (C·R·S <= 32, a first layer's), whose
// weights fit its shared memory, and x and y indexed in 32 bits.
func clSmallConv(c convShape) bool {
	return c.groups == 1 && c.crs > 0 && c.crs <= 32 && c.g.K*c.crs <= 4096 &&
		c.xLen <= math.MaxInt32 && c.yLen <= math.MaxInt32
}

// clSmallMMA is the tensor-core entry point of ember_cl_conv_small that
// takes c (ember_cl_conv_small_mma{16,32}_n{2,3,4,8}: up to 16 or 32
// taps, up to 16, 24, 32 or 64 output channels), or "" where c takes the
// CUDA-core kernel (more channels), neither, or the device has no
// bfloat16 tensor cores (before sm_80, where the kernels are compiled
// out).
func (b *Backend) clSmallMMA(c convShape) string {
	if !clSmallConv(c) || c.g.K > 64 {
		return ""
	}
	taps := 16
	if c.crs > 16 {
		taps = 32
	}
	name := fmt.Sprintf("ember_cl_conv_small_mma%d_n%d", taps, clMMAChannelTiles(c.g.K))
	if !b.hasKernel(name) {
		return ""
	}
	return name
}

// clMMAChannelTiles is how many tiles of eight output channels the
// tensor-core kernels of a first layer are compiled for that k (<= 64)
// channels fit: 2, 3, 4 or 8.
func clMMAChannelTiles(k int) int {
	for _, n := range []int{2, 3, 4} {
		if k <= 8*n {
			return n
		}
	}
	return 8
}

// mustAlloc is a float32 buffer of n elements, or a panic with the
// device's error.
func (b *Backend) mustAlloc(op string, n int) tensor.Buffer {
	buf, err := b.Alloc(n, tensor.Float32)
	if err != nil {
		panic(&tensor.Error{Op: "cuda: " + op, Err: err})
	}
	return buf
}

// filterCast is the bfloat16 filter a cuDNN pass reads: pwf, the form made
// once for the step, or a cast of pw into a workspace, which done releases.
func (b *Backend) filterCast(op string, pw, pwf uintptr, c convShape) (ph uintptr, done func()) {
	if pwf != 0 {
		return pwf, func() {}
	}
	g := c.g
	wh := b.workspace(op, 2*c.wLen)
	b.toLowp(op, wh.Ptr(), pw, 0, g.K, g.C/c.groups, g.R*g.S, true)
	return wh.Ptr(), func() { b.release(wh) }
}

func (b *Backend) conv2dChannelsLastCuDNN(op string, dg convDescGeom, py, px, pw, pwf uintptr, c convShape) bool {
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(dg)
	if p.failed[dirForward] != nil {
		return false
	}
	devCheck(op, b.x.settle())
	wh, done := b.filterCast(op, pw, pwf, c)
	defer done()
	a, ok := b.algoFor(op, p, dirForward, px, wh, py, 0)
	if !ok {
		return false
	}
	if pp, pa := b.paddedForward(op, p, a, py, px, wh, c); pp != nil && b.forwardPadded(op, pp, pa, py, px, wh, c) {
		return true
	}
	b.runDNN(op, p, dirForward, a, px, wh, 0, py)
	return true
}

// Conv2dBackwardChannelsLast runs the backward passes on cuDNN from and
// into the form (the bias gradient summed from dy by
// ember_cl_channel_sums); where cuDNN refuses, it is Conv2dBackwardLowp on
// float32 copies.
func (b *Backend) Conv2dBackwardChannelsLast(dx, dw, db, dy, x, w tensor.Buffer, g tensor.ConvGeom) {
	b.conv2dBackwardChannelsLast(dx, dw, db, dy, x, w, tensor.Buffer{}, g)
}

// Conv2dBackwardChannelsLastFilter implements
// tensor.ChannelsLastFilterBackend: Conv2dBackwardChannelsLast with dx's
// filter cast already made (wf).
func (b *Backend) Conv2dBackwardChannelsLastFilter(dx, dw, db, dy, x, w, wf tensor.Buffer, g tensor.ConvGeom) {
	b.conv2dBackwardChannelsLast(dx, dw, db, dy, x, w, wf, g)
}

func (b *Backend) conv2dBackwardChannelsLast(dx, dw, db, dy, x, w, wf tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d_backward_channels_last"
	if g.ReLU {
		panic("cuda: " + op + ": the caller masks dy by the ReLU")
	}
	wantDX, wantDW := !dx.Empty(), !dw.Empty()
	if !wantDX && !wantDW && db.Empty() {
		return
	}
	c := convShapeOf(op, g)
	clChannels(op, g.K)
	pdy := b.clPtr(op, "dy", dy, c.yLen)
	var pdx, pdw, px, pw uintptr
	if wantDX {
		need(op, "w", w, c.wLen)
		pdx, pw = b.clPtr(op, "dx", dx, c.xLen), b.f32(op, w)
	}
	if wantDW {
		need(op, "dw", dw, c.wLen)
		pdw, px = b.f32(op, dw), b.clPtr(op, "x", x, c.xLen)
	}
	pdb := b.f32Opt(op, "db", db, g.K)
	if c.yLen == 0 {
		return
	}
	if pdb != 0 {
		rows := g.N * c.p
		part, nb := b.clSums(op, 0, 0, pdy, 0, 0, 0, 0, 0, rows, g.K, clSum)
		b.clFinalize(op, part.Ptr(), nb, g.K, rows, clSum, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, pdb, false, true, 0)
		b.release(part)
	}
	if wantDW && smallFilterGrad(c) {
		// Few taps (a first layer's): conv_dw_small.go's kernel, as
		// Conv2dBackwardLowp takes them, reading the form.
		b.filterGradSmallChannelsLast(op, pdw, px, pdy, c)
		wantDW, pdw, dw = false, 0, tensor.Buffer{}
	}
	if !wantDX && !wantDW {
		return
	}
	if dg, ok := b.lowpGeom(c); ok && dg.nhwc && c.crs > 0 && b.conv2dBackwardChannelsLastCuDNN(op, dg, pdx, pdw, pdy, px, pw, b.filterForm(op, wf, c), c) {
		return
	}
	dyf := b.mustAlloc(op, c.yLen)
	defer b.Free(dyf)
	b.FromChannelsLast(dyf, dy, g.N, g.K, c.p, false)
	var xf, dxf tensor.Buffer
	if wantDW {
		xf = b.mustAlloc(op, c.xLen)
		defer b.Free(xf)
		b.FromChannelsLast(xf, x, g.N, g.C, g.H*g.W, false)
	}
	if wantDX {
		dxf = b.mustAlloc(op, c.xLen)
		defer b.Free(dxf)
	}
	b.Conv2dBackwardLowp(dxf, dw, tensor.Buffer{}, dyf, xf, w, tensor.Buffer{}, g)
	if wantDX {
		b.ToChannelsLast(dx, dxf, g.N, g.C, g.H*g.W)
	}
}

// conv2dBackwardChannelsLastCuDNN queues the data and filter gradients on
// cuDNN; false, with at most the weight's cast queued, where cuDNN
// refuses a direction.
func (b *Backend) conv2dBackwardChannelsLastCuDNN(op string, dg convDescGeom, pdx, pdw, pdy, px, pw, pwf uintptr, c convShape) bool {
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(dg)
	if (pdx != 0 && p.failed[dirBackwardData] != nil) || (pdw != 0 && p.failed[dirBackwardFilter] != nil) {
		return false
	}
	devCheck(op, b.x.settle())
	g := c.g
	var wh uintptr
	var da, fa convAlgo
	ok := true
	if pdx != 0 {
		var done func()
		wh, done = b.filterCast(op, pw, pwf, c)
		defer done()
		da, ok = b.algoFor(op, p, dirBackwardData, wh, pdy, pdx, 0)
	}
	if ok && pdw != 0 {
		fa, ok = b.algoFor(op, p, dirBackwardFilter, px, pdy, 0, 2*c.wLen)
	}
	if !ok {
		return false
	}
	if pdw != 0 {
		dwh := b.workspace(op, 2*c.wLen)
		b.runDNN(op, p, dirBackwardFilter, fa, px, pdy, 0, dwh.Ptr())
		b.fromLowp(op, pdw, dwh.Ptr(), 0, g.K, g.C/c.groups, g.R*g.S, false, true, dg.nhwc)
		b.release(dwh)
	}
	if pdx != 0 {
		if tp, ta := b.dataGradAsForward(op, p, da, pw, wh, pdy, pdx, c); tp != nil {
			b.dataGradForward(op, tp, ta, pw, pdy, pdx, c)
		} else {
			b.runDNN(op, p, dirBackwardData, da, wh, pdy, 0, pdx)
		}
	}
	return true
}
