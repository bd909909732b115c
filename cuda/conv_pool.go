package cuda

// Convolution + bias + ReLU + max pooling as one operation
// (tensor.ConvPoolBackend; kernels/conv_pool.cu).
//
//	forward, 5x5 or 3x3 kernel, stride 1, 2x2 windows, image in shared memory
//	(LeNet's conv1 and conv2):
//	                       conv_relu_pool_5x5_2x2 x, w       -> y, argmax
//	                       (_c2, _c4: 2 or 4 threads per output for more
//	                       input channels; _3x3_ for 3x3 kernels)
//	forward, C·R·S <= 32:  conv_relu_pool_tiled (conv_relu_pool_direct when
//	                       the image does not fit in shared memory)
//	forward, otherwise:    im2col, Sgemm                     -> yt [K, N·P]
//	                       swap01_relu_pool       yt (+bias)  -> y, argmax
//	backward, C·R·S <= 32 and no dx:
//	                       conv_pool_dw_5x5       dy, y, argmax, x -> partials
//	                       (or _3x3; conv_pool_dw_direct for other sizes)
//	                       conv_pool_dw_finish    partials -> dw, db
//	backward, otherwise:   unpool_t_bias          dy, y, argmax  -> dyt [K, N·P], db
//	                       (unpool_t without db)
//	                       im2col, 2 Sgemms, col2im (as Conv2dBackward)
//
// Against Conv2d + MaxPool2d this saves, for LeNet's first layer at batch
// 64, 4 launches and 3 buffers of 2.9-3.7 MB forward and 5 launches
// backward, among them a split-K GEMM over 36,864 columns; for the second,
// 3 launches and the 8 MB im2col buffer forward. The measurements behind
// each choice are in docs/performance.md.

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// directCRS is the largest C·R·S that the direct kernels take (a register
// per product in the backward; EMBER_DIRECT_CRS in conv_pool.cu).
const directCRS = 32

// convPoolShape is a validated convolution + pooling geometry.
type convPoolShape struct {
	c       convShape
	p       tensor.PoolGeom
	pp      int      // pooled outputs per plane
	yLen    int      // pooled outputs
	poolDim [6]int32 // KH, KW, QH, QW, POH, POW
}

func convPoolShapeOf(op string, g tensor.ConvGeom, p tensor.PoolGeom) convPoolShape {
	c := convShapeOf(op, g)
	// The fused kernels take plain convolutions and unpadded floor-mode
	// pooling only; the tensor layer builds no other (Conv2dReLUMaxPool).
	if !g.Plain() || p.PadH != 0 || p.PadW != 0 || p.CeilMode {
		panic(fmt.Sprintf("cuda: %s: the fused kernels take neither dilation, groups nor pooling padding or ceil mode: %+v, %+v", op, g, p))
	}
	if p.N != g.N || p.C != g.K || p.H != c.oh || p.W != c.ow || p.KH < 1 || p.KW < 1 ||
		p.StrideH < p.KH || p.StrideW < p.KW || p.H < p.KH || p.W < p.KW {
		panic(fmt.Sprintf("cuda: %s: pooling %+v does not pool the %dx%dx%dx%d output of %+v with disjoint windows",
			op, p, g.N, g.K, c.oh, c.ow, g))
	}
	s := convPoolShape{c: c, p: p, pp: p.OutH() * p.OutW()}
	s.yLen = g.N * g.K * s.pp
	for i, v := range []int{p.KH, p.KW, p.StrideH, p.StrideW, p.OutH(), p.OutW()} {
		s.poolDim[i] = i32arg(op, v)
	}
	return s
}

// Conv2dReLUMaxPool implements tensor.ConvPoolBackend.
func (b *Backend) Conv2dReLUMaxPool(y, argmax, x, w, bias tensor.Buffer, g tensor.ConvGeom, p tensor.PoolGeom) {
	const op = "conv2d_relu_maxpool"
	s := convPoolShapeOf(op, g, p)
	c := s.c
	need(op, "y", y, s.yLen)
	need(op, "argmax", argmax, s.yLen)
	need(op, "x", x, c.xLen)
	need(op, "w", w, c.wLen)
	py, pa, px, pw := b.f32(op, y), b.i32(op, argmax), b.f32(op, x), b.f32(op, w)
	var pbias uintptr
	if !bias.Empty() {
		need(op, "bias", bias, g.K)
		pbias = b.f32(op, bias)
	}
	if s.yLen == 0 {
		return
	}
	if f := b.rtForward(c, s); f != nil {
		b.launchRTForward(op, f, py, pa, px, pw, pbias, s)
		return
	}
	d, q := c.dims, s.poolDim
	if f, split := b.fixedForward(c, s); f != nil {
		if kpb := b.tileChannels(c, s, split); kpb > 0 {
			grid := Dim3{X: gridX(op, g.N), Y: i32dim(op, (g.K+kpb-1)/kpb), Z: 1}
			devCheck(op, b.x.launch(f, grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{py, pa, px, pw, pbias,
				d[1], d[2], d[3], i32arg(op, g.K), d[8], d[9], d[11], q[4], q[5], i32arg(op, kpb)}))
			return
		}
	}
	if kpb := b.tileChannels(c, s, 1); kpb > 0 {
		grid := Dim3{X: gridX(op, g.N), Y: i32dim(op, (g.K+kpb-1)/kpb), Z: 1}
		devCheck(op, b.x.launch(b.kernel("ember_conv_relu_pool_tiled"), grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{py, pa, px, pw, pbias,
			d[0], d[1], d[2], d[3], i32arg(op, g.K), d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11],
			q[0], q[1], q[2], q[3], q[4], q[5], i32arg(op, kpb)}))
		return
	}
	if c.crs <= directCRS {
		b.launch(op, b.kernel("ember_conv_relu_pool_direct"), s.yLen, py, pa, px, pw, pbias,
			d[0], d[1], d[2], d[3], i32arg(op, g.K), d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11],
			q[0], q[1], q[2], q[3], q[4], q[5], int64(s.yLen), int64(c.xLen))
		return
	}
	col := b.workspace(op, 4*c.colLen)
	defer b.release(col)
	yt := b.workspace(op, 4*c.yLen)
	defer b.release(yt)
	b.im2col(op, col.Ptr(), px, c)
	b.gemm(op, false, false, g.K, c.np, c.crs, 1, pw, c.crs, col.Ptr(), c.np, 0, yt.Ptr(), c.np)
	b.launch(op, b.kernel("ember_swap01_relu_pool"), s.yLen, py, pa, yt.Ptr(), pbias, d[0], i32arg(op, g.K), d[10], d[11],
		q[0], q[1], q[2], q[3], q[4], q[5], int64(s.yLen), int64(c.yLen))
}

// Conv2dReLUMaxPoolBackward implements tensor.ConvPoolBackend.
func (b *Backend) Conv2dReLUMaxPoolBackward(dx, dw, db, dy, x, w, y, argmax tensor.Buffer, g tensor.ConvGeom, p tensor.PoolGeom) {
	const op = "conv2d_relu_maxpool_backward"
	wantDX, wantDW, wantDB := !dx.Empty(), !dw.Empty(), !db.Empty()
	if !wantDX && !wantDW && !wantDB {
		return
	}
	s := convPoolShapeOf(op, g, p)
	c := s.c
	need(op, "dy", dy, s.yLen)
	need(op, "y", y, s.yLen)
	need(op, "argmax", argmax, s.yLen)
	pdy, py, pa := b.f32(op, dy), b.f32(op, y), b.i32(op, argmax)
	var pdx, pdw, pdb, px, pw uintptr
	if wantDX {
		need(op, "dx", dx, c.xLen)
		need(op, "w", w, c.wLen)
		pdx, pw = b.f32(op, dx), b.f32(op, w)
	}
	if wantDW {
		need(op, "dw", dw, c.wLen)
		pdw = b.f32(op, dw)
	}
	if wantDW || (!wantDX && c.crs <= directCRS) {
		need(op, "x", x, c.xLen)
		px = b.f32(op, x)
	}
	if wantDB {
		need(op, "db", db, g.K)
		pdb = b.f32(op, db)
	}
	if s.yLen == 0 {
		// Nothing pooled: no gradient flows; dx is overwritten with zeros.
		if wantDX && c.xLen > 0 {
			devCheck(op, b.x.memset32(pdx, 0, c.xLen))
		}
		return
	}
	d, q := c.dims, s.poolDim
	if !wantDX && c.crs <= directCRS {
		b.convPoolDWDirect(op, pdw, pdb, pdy, py, pa, px, s)
		return
	}
	if !wantDX && !wantDW {
		b.biasGrad(op, pdb, pdy, 0, py, g.N, g.K, s.pp, true)
		return
	}
	// The register-tiled kernels read the pooled gradient itself: no
	// unpooled dyt, and the bias gradient from the pooled one.
	// The bias gradient beside the weight gradient (on the side stream in
	// a graph), off the input gradient's path.
	var biasGrad func(ex executor)
	if wantDB {
		part := b.biasRowsWorkspace(op, g.N, g.K, s.pp)
		defer b.release(part)
		biasGrad = func(ex executor) { b.biasGradRowsOn(ex, op, pdb, part.Ptr(), 0, pdy, py, g.N, g.K, s.pp, true) }
	}
	if b.convBackwardRT(op, pdx, pdw, px, pw, rtSource{dy: pdy, y: py, argmax: pa, pp: s.pp}, c, biasGrad) {
		return
	}
	dyt := b.workspace(op, 4*c.yLen)
	defer b.release(dyt)
	if wantDB && c.yLen < 1<<30 {
		// The bias gradient in the unpooling pass: about 512 elements per
		// block, so that LeNet's conv2 has enough blocks.
		rpb := max(1, 512/c.p)
		parts := (g.N + rpb - 1) / rpb
		var part uintptr
		if parts > 1 {
			ws := b.workspace(op, 4*parts*g.K)
			defer b.release(ws)
			part = ws.Ptr()
		}
		grid := Dim3{X: parts, Y: i32dim(op, g.K), Z: 1}
		devCheck(op, b.x.launch(b.kernel("ember_unpool_t_bias"), grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{dyt.Ptr(), pdb, part, pdy, py, pa,
			d[0], i32arg(op, g.K), d[10], d[11], q[0], q[1], q[2], q[3], q[4], q[5], i32arg(op, rpb)}))
		if parts > 1 {
			b.biasGradFinish(b.x, op, pdb, part, g.K, parts, true)
		}
	} else {
		if wantDB {
			b.biasGrad(op, pdb, pdy, 0, py, g.N, g.K, s.pp, true)
		}
		b.launch(op, b.kernel("ember_unpool_t"), c.yLen, dyt.Ptr(), pdy, py, pa, d[0], i32arg(op, g.K), d[10], d[11],
			q[0], q[1], q[2], q[3], q[4], q[5], int64(c.yLen))
	}
	b.convBackwardGEMMs(op, pdx, pdw, px, pw, dyt.Ptr(), c)
}

// dwImageFloats is the image buffer of the one-channel weight-gradient
// kernels, in floats (EMBER_DW_IMAGE_FLOATS).
const dwImageFloats = 4096

// tileFloats is the shared memory of the tiled kernels, in floats
// (EMBER_TILE_FLOATS).
const tileFloats = 12288

// tileChannels is how many output channels one block of the tiled forward
// kernels takes when split threads share each pooled output: about two
// rounds of outputs per block (fewer blocks copy the same image; one round
// was slower at LeNet's conv1), as many as fit in shared
// memory next to the padded image. It is 0 when even one does not fit, or
// when C·R·S is large and no kernel specialised for the geometry exists (the
// GEMM path is faster there).
func (b *Backend) tileChannels(c convShape, s convPoolShape, split int) int {
	g := c.g
	if f, _ := b.fixedForward(c, s); s.pp == 0 || (c.crs > directCRS && f == nil) {
		return 0
	}
	img := g.C * (g.H + 2*g.PadH) * (g.W + 2*g.PadW)
	if img+c.crs > tileFloats {
		return 0
	}
	return max(1, min(g.K, 2*blockSize/split/s.pp, (tileFloats-img)/max(c.crs, 1)))
}

// fixedForward is the forward kernel specialised for c's kernel and s's
// windows (stride-1 convolution, 2x2 windows moved by their size), and how
// many threads share a pooled output (more for more input channels), or
// nil.
func (b *Backend) fixedForward(c convShape, s convPoolShape) (*Function, int) {
	g, p := c.g, s.p
	if g.StrideH != 1 || g.StrideW != 1 || p.StrideH != p.KH || p.StrideW != p.KW || p.KH != 2 || p.KW != 2 {
		return nil, 0
	}
	var fs *[3]string
	switch {
	case g.R == 5 && g.S == 5:
		fs = &convReLUPool5x5Kernels
	case g.R == 3 && g.S == 3:
		fs = &convReLUPool3x3Kernels
	default:
		return nil, 0
	}
	switch {
	case g.C >= 8:
		return b.kernel(fs[2]), 4
	case g.C >= 2:
		return b.kernel(fs[1]), 2
	}
	return b.kernel(fs[0]), 1
}

// The fixed forward kernels by threads per pooled output: 1, 2, 4.
var (
	convReLUPool5x5Kernels = [3]string{"ember_conv_relu_pool_5x5_2x2", "ember_conv_relu_pool_5x5_2x2_c2", "ember_conv_relu_pool_5x5_2x2_c4"}
	convReLUPool3x3Kernels = [3]string{"ember_conv_relu_pool_3x3_2x2", "ember_conv_relu_pool_3x3_2x2_c2", "ember_conv_relu_pool_3x3_2x2_c4"}
)

// fixedDW is the weight-gradient kernel specialised for c's kernel (one
// input channel, stride 1, the padded image in shared memory), or nil.
func (b *Backend) fixedDW(c convShape) *Function {
	g := c.g
	if g.C != 1 || g.StrideH != 1 || g.StrideW != 1 || (g.H+2*g.PadH)*(g.W+2*g.PadW) > dwImageFloats {
		return nil
	}
	switch {
	case g.R == 5 && g.S == 5:
		return b.kernel("ember_conv_pool_dw_5x5")
	case g.R == 3 && g.S == 3:
		return b.kernel("ember_conv_pool_dw_3x3")
	}
	return nil
}

// convPoolDWDirect queues dw += and db += (either may be 0: not wanted) from
// the pooled gradient: partial sums per block of 256 pooled outputs, then a
// finishing launch that adds them in order.
func (b *Backend) convPoolDWDirect(op string, pdw, pdb, pdy, py, pa, px uintptr, s convPoolShape) {
	c, g := s.c, s.c.g
	d := c.dims
	rows := g.K * (c.crs + 1)
	var parts int
	var ws Block
	if f := b.fixedDW(c); f != nil {
		// One part per group of images: one image per block up to 128
		// images, else 128 groups (more groups were no faster, with more
		// partials to add).
		per := (g.N + 127) / 128
		parts = (g.N + per - 1) / per
		ws = b.workspace(op, 4*rows*parts)
		const warps = blockSize / 32 // one per output channel
		grid := Dim3{X: parts, Y: i32dim(op, (g.K+warps-1)/warps), Z: 1}
		devCheck(op, b.x.launch(f, grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{ws.Ptr(), pdy, py, pa, px,
			d[0], d[2], d[3], i32arg(op, g.K), d[8], d[9], d[11], i32arg(op, s.pp), i32arg(op, per)}))
	} else {
		parts = min((g.N*s.pp+blockSize-1)/blockSize, maxGrid)
		ws = b.workspace(op, 4*rows*parts)
		grid := Dim3{X: parts, Y: i32dim(op, g.K), Z: 1}
		devCheck(op, b.x.launch(b.kernel("ember_conv_pool_dw_direct"), grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{ws.Ptr(), pdy, py, pa, px,
			d[0], d[1], d[2], d[3], i32arg(op, g.K), d[4], d[5], d[6], d[7], d[8], d[9], d[11], i32arg(op, s.pp)}))
	}
	defer b.release(ws)
	const warps = blockSize / 32
	b.launchGrid(op, b.kernel("ember_conv_pool_dw_finish"), min((rows+warps-1)/warps, maxGrid), blockSize,
		pdw, pdb, ws.Ptr(), int64(g.K*c.crs), int64(rows), i32arg(op, parts))
}

// gridX checks a grid's x dimension against CUDA's limit.
func gridX(op string, n int) int {
	if n < 1 || n > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: %s: %d blocks in a grid's x dimension (at most %d)", op, n, math.MaxInt32))
	}
	return n
}

// i32dim checks a grid dimension against CUDA's limit for y and z.
func i32dim(op string, n int) int {
	if n < 1 || n > maxGridY {
		panic(fmt.Sprintf("cuda: %s: %d blocks in a grid dimension (at most %d)", op, n, maxGridY))
	}
	return n
}
