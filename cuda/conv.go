package cuda

// Convolution and max pooling on the GPU.
//
// Conv2d lowers to one GEMM over the whole batch, the scheme of the CPU
// backend (tensor/cpu_conv.go), so both compute the same sums in the same
// shapes:
//
//	forward:  im2col   x [N,C,H,W]         -> col [CRS, N·P]   (workspace)
//	          Sgemm    W [K,CRS] · col      -> yt [K, N·P]      (workspace)
//	          swap01   yt [K,N,P] (+bias, ReLU) -> y [N,K,P]
//	backward: bias_grad_rows dy [N,K,P]     -> dyt [K, N·P]     (workspace)
//	                                           and db partials
//	          bias_grad_finish              -> db += ...        (when split)
//	          im2col   x                    -> col              (workspace)
//	          Sgemm    dyt · colᵀ (beta=1)  -> dw += ...
//	          Sgemm    Wᵀ · dyt             -> dcol (reuses col's workspace)
//	          col2im   dcol                 -> dx (overwrite)
//
// with P = OutH·OutW and CRS = C·R·S. Workspaces come from the caching
// allocator and go back as soon as the work using them is queued: the next
// user of the memory is queued later on the same stream, so it runs after.
// Reusing col for dcol is safe for the same reason (the dw GEMM that reads
// col precedes the GEMM that overwrites it). dx is skipped when its buffer is
// empty (the first layer), dw and db when theirs are.
//
// Dilation only changes where im2col reads and col2im writes. With groups
// the col is the same (all C·R·S rows); group gi's rows, weights [K/G,
// C/G·R·S] and outputs are contiguous blocks, so each GEMM above becomes one
// GEMM per group on those blocks (a loop of cuBLAS calls: a depthwise layer
// of C channels costs C small GEMMs each way), the CPU's products. The
// register-tiled and fused LeNet kernels take plain geometries only (no
// dilation, one group, no pooling padding): see the guards in
// convBackwardRT and convPoolShapeOf.
//
// Where cuDNN is installed, Conv2d and Conv2dBackward hand every geometry
// but LeNet's (which the register-tiled kernels take) to it instead:
// conv_cudnn.go; this path remains the fallback.
//
// Launches: forward 3 (im2col, GEMM, swap01); backward 6 or 7 with dx
// (bias_grad_rows, [bias_grad_finish,] im2col, 2 GEMMs, col2im), 4 or 5
// without; without db, swap01 replaces bias_grad_rows.

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// convShape is a validated ConvGeom with its derived sizes.
type convShape struct {
	g             tensor.ConvGeom
	oh, ow, p, np int
	crs           int // C·R·S: the rows of col
	groups        int
	kg, cgrs      int // per group: output channels, weight row length C/G·R·S
	xLen, yLen    int
	wLen, colLen  int
	dims          [12]int32 // N, C, H, W, R, S, SH, SW, PH, PW, OH, OW
	dil           [2]int32  // DH, DW
}

func convShapeOf(op string, g tensor.ConvGeom) convShape {
	dh, dw := g.Dilation()
	groups := g.GroupCount()
	if g.N < 0 || g.C < 0 || g.H < 0 || g.W < 0 || g.K < 0 || g.R < 1 || g.S < 1 ||
		g.StrideH < 1 || g.StrideW < 1 || g.PadH < 0 || g.PadW < 0 || g.DilationH < 0 || g.DilationW < 0 ||
		g.Groups < 0 || g.C%groups != 0 || g.K%groups != 0 {
		panic(fmt.Sprintf("cuda: %s: invalid geometry %+v", op, g))
	}
	c := convShape{g: g, oh: max(g.OutH(), 0), ow: max(g.OutW(), 0), groups: groups}
	if g.H+2*g.PadH < dh*(g.R-1)+1 || g.W+2*g.PadW < dw*(g.S-1)+1 {
		c.oh, c.ow = 0, 0
	}
	c.p = c.oh * c.ow
	c.np = g.N * c.p
	c.crs = g.C * g.R * g.S
	c.xLen = g.N * g.C * g.H * g.W
	c.yLen = g.N * g.K * c.p
	c.kg, c.cgrs = g.K/groups, g.C/groups*g.R*g.S
	c.wLen = g.K * c.cgrs
	c.colLen = c.crs * c.np
	for i, v := range []int{g.N, g.C, g.H, g.W, g.R, g.S, g.StrideH, g.StrideW, g.PadH, g.PadW, c.oh, c.ow} {
		c.dims[i] = i32arg(op, v)
	}
	c.dil = [2]int32{i32arg(op, dh), i32arg(op, dw)}
	return c
}

// im2col queues col [CRS, N·P] = the patches of x: a 2-D grid, y over the
// C·R (channel, kernel row) pairs, x over the N·P columns (kernels/conv.cu).
func (b *Backend) im2col(op string, col, x uintptr, c convShape) {
	d := c.dims
	grid := Dim3{X: min((c.np+blockSize-1)/blockSize, maxGrid), Y: min(c.g.C*c.g.R, maxGridY), Z: 1}
	devCheck(op, b.x.launch(b.kernel("ember_im2col"), grid, Dim3{X: blockSize, Y: 1, Z: 1}, []any{col, x,
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], c.dil[0], c.dil[1], int64(c.np)}))
}

// col2im queues dx = the sum of col's patches (overwrite).
func (b *Backend) col2im(op string, dx, col uintptr, c convShape) {
	d := c.dims
	b.launch(op, b.kernel("ember_col2im"), c.xLen, dx, col,
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], c.dil[0], c.dil[1],
		int64(c.xLen), int64(c.colLen))
}

// rowTiles is the launch of a kernel over rows × P elements in 2-D tiles
// (swap01): blockDim.x threads along P (a multiple of 32, at most 256,
// splitting P into equal parts), blockDim.y rows per block.
func rowTiles(rows, P int) (grid, block Dim3) {
	tx, ty := 0, 1
	if P >= blockSize {
		parts := (P + blockSize - 1) / blockSize
		tx = ((P+parts-1)/parts + 31) / 32 * 32
	} else {
		tx = max((P+31)/32*32, 32)
		ty = blockSize / tx
	}
	grid = Dim3{X: min((P+tx-1)/tx, maxGrid), Y: min((rows+ty-1)/ty, maxGridY), Z: 1}
	return grid, Dim3{X: tx, Y: ty, Z: 1}
}

// swap01 queues out [B, A, P] = in [A, B, P] (+ bias[a] when bias != 0,
// then max(·, 0) when relu).
func (b *Backend) swap01(op string, out, in, bias uintptr, A, B, P int, relu bool) {
	if A*B*P <= 0 {
		return
	}
	grid, block := rowTiles(A*B, P)
	devCheck(op, b.x.launch(b.kernel("ember_swap01"), grid, block, []any{out, in, bias, int64(A), int64(B), int64(P), flag(relu)}))
}

// groupGEMMs calls gemm once per channel group with the byte offsets of
// the group's blocks of w [K, C/G·R·S], col [C·R·S, N·P] and yt [K, N·P].
func groupGEMMs(c convShape, gemm func(wOff, colOff, yOff uintptr)) {
	for gi := 0; gi < c.groups; gi++ {
		gemm(uintptr(4*gi*c.kg*c.cgrs), uintptr(4*gi*c.cgrs*c.np), uintptr(4*gi*c.kg*c.np))
	}
}

func (b *Backend) gemm(op string, transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, bm uintptr, ldb int, beta float32, c uintptr, ldc int) {
	devCheck(op, b.x.sgemm(transA, transB, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc))
}

// Conv2d sets y = conv(x, w) + bias (bias may be empty), then max(y, 0)
// when g.ReLU (in the same pass: swap01's epilogue).
func (b *Backend) Conv2d(y, x, w, bias tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d"
	c := convShapeOf(op, g)
	need(op, "y", y, c.yLen)
	need(op, "x", x, c.xLen)
	need(op, "w", w, c.wLen)
	py, px, pw := b.f32(op, y), b.f32(op, x), b.f32(op, w)
	var pbias uintptr
	if !bias.Empty() {
		need(op, "bias", bias, g.K)
		pbias = b.f32(op, bias)
	}
	if c.yLen == 0 {
		return
	}
	if c.crs == 0 {
		// No input channels: the products are empty, y = bias (or 0).
		devCheck(op, b.x.memset32(py, 0, c.yLen))
		if pbias != 0 {
			b.launch(op, b.kernel("ember_add_bias"), c.yLen, py, pbias, int64(c.yLen), int64(g.K), int64(c.p))
			if g.ReLU {
				b.launch(op, b.kernel("ember_relu"), c.yLen, py, py, int64(c.yLen))
			}
		}
		return
	}
	if b.conv2dCuDNN(op, py, px, pw, pbias, c) {
		return
	}
	col := b.workspace(op, 4*c.colLen)
	defer b.release(col)
	yt := b.workspace(op, 4*c.yLen)
	defer b.release(yt)
	b.im2col(op, col.Ptr(), px, c)
	groupGEMMs(c, func(wOff, colOff, yOff uintptr) {
		b.gemm(op, false, false, c.kg, c.np, c.cgrs, 1, pw+wOff, c.cgrs, col.Ptr()+colOff, c.np, 0, yt.Ptr()+yOff, c.np)
	})
	b.swap01(op, py, yt.Ptr(), pbias, g.K, g.N, c.p, g.ReLU)
}

// Conv2dBackward overwrites dx with the input gradient (skipped when dx is
// empty) and adds the weight and bias gradients into dw and db (each
// skipped when empty).
func (b *Backend) Conv2dBackward(dx, dw, db, dy, x, w, y tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d_backward"
	wantDX, wantDW, wantDB := !dx.Empty(), !dw.Empty(), !db.Empty()
	if !wantDX && !wantDW && !wantDB {
		return
	}
	c := convShapeOf(op, g)
	need(op, "dy", dy, c.yLen)
	pdy := b.f32(op, dy)
	var pdx, pdw, pdb, px, pw uintptr
	if wantDX {
		need(op, "dx", dx, c.xLen)
		need(op, "w", w, c.wLen)
		pdx, pw = b.f32(op, dx), b.f32(op, w)
	}
	if wantDW {
		need(op, "dw", dw, c.wLen)
		need(op, "x", x, c.xLen)
		pdw, px = b.f32(op, dw), b.f32(op, x)
	}
	if wantDB {
		need(op, "db", db, g.K)
		pdb = b.f32(op, db)
	}
	if c.yLen == 0 {
		// No outputs (or no output channels): nothing flows back; dx is
		// overwritten with zeros as on the CPU.
		if wantDX && c.xLen > 0 {
			devCheck(op, b.x.memset32(pdx, 0, c.xLen))
		}
		return
	}
	var pmask uintptr // the fused ReLU's output, masking dy
	if g.ReLU {
		need(op, "y", y, c.yLen)
		pmask = b.f32(op, y)
	}
	if !wantDX && !wantDW {
		// Only the bias: reduce dy [N, K, P] over N and P directly.
		b.biasGrad(op, pdb, pdy, 0, pmask, g.N, g.K, c.p, true)
		return
	}
	if b.conv2dBackwardCuDNN(op, pdx, pdw, pdb, pdy, px, pw, pmask, c) {
		return
	}
	dyt := b.workspace(op, 4*c.yLen)
	defer b.release(dyt)
	switch {
	case wantDB || pmask != 0:
		// dyt [K, N·P] = dy transposed (and masked), and db[k] += the sum
		// of row k, in one pass over dy. Without db the sums go to scratch.
		if !wantDB {
			scratch := b.workspace(op, 4*g.K)
			defer b.release(scratch)
			pdb = scratch.Ptr()
		}
		b.biasGrad(op, pdb, pdy, dyt.Ptr(), pmask, g.N, g.K, c.p, wantDB)
	default:
		b.swap01(op, dyt.Ptr(), pdy, 0, g.N, g.K, c.p, false)
	}
	b.convBackwardGEMMs(op, pdx, pdw, px, pw, dyt.Ptr(), c)
}

// convBackwardGEMMs finishes a convolution's backward pass from dyt [K, N·P],
// the output gradient transposed: dw += dyt · colᵀ when pdw is not 0, and
// dx = col2im(Wᵀ · dyt) when pdx is not 0.
func (b *Backend) convBackwardGEMMs(op string, pdx, pdw, px, pw, dyt uintptr, c convShape) {
	if c.crs == 0 || (pdx == 0 && pdw == 0) {
		return // no weights, and dx has no elements
	}
	if b.convBackwardRT(op, pdx, pdw, px, pw, rtSource{dyt: dyt}, c, nil) {
		return
	}
	col := b.workspace(op, 4*c.colLen)
	defer b.release(col)
	if pdw != 0 {
		b.im2col(op, col.Ptr(), px, c)
		// dw [K, CRS] += dyt [K, N·P] · colᵀ, per group.
		groupGEMMs(c, func(wOff, colOff, yOff uintptr) {
			b.gemm(op, false, true, c.kg, c.cgrs, c.np, 1, dyt+yOff, c.np, col.Ptr()+colOff, c.np, 1, pdw+wOff, c.cgrs)
		})
	}
	if pdx != 0 {
		// dcol [CRS, N·P] = Wᵀ · dyt, per group, into col's workspace.
		groupGEMMs(c, func(wOff, colOff, yOff uintptr) {
			b.gemm(op, true, false, c.cgrs, c.np, c.kg, 1, pw+wOff, c.cgrs, dyt+yOff, c.np, 0, col.Ptr()+colOff, c.np)
		})
		b.col2im(op, pdx, col.Ptr(), c)
	}
}

// poolShape is a validated PoolGeom with its derived sizes.
type poolShape struct {
	xLen, yLen int
	dims       [10]int32 // H, W, KH, KW, SH, SW, PH, PW, OH, OW
}

func poolShapeOf(op string, g tensor.PoolGeom) poolShape {
	// Padding of at most half the window (torch's rule) keeps an input
	// element in every window, so that every argmax is a real position.
	if g.N < 0 || g.C < 0 || g.H < 0 || g.W < 0 || g.KH < 1 || g.KW < 1 || g.StrideH < 1 || g.StrideW < 1 ||
		g.PadH < 0 || g.PadW < 0 || 2*g.PadH > g.KH || 2*g.PadW > g.KW {
		panic(fmt.Sprintf("cuda: %s: invalid geometry %+v", op, g))
	}
	oh, ow := g.OutH(), g.OutW()
	if g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW || g.H == 0 || g.W == 0 {
		oh, ow = 0, 0
	}
	if g.H*g.W > 1<<31-1 {
		panic(fmt.Sprintf("cuda: %s: a %dx%d plane does not fit int32 argmax indices", op, g.H, g.W))
	}
	s := poolShape{xLen: g.N * g.C * g.H * g.W, yLen: g.N * g.C * oh * ow}
	for i, v := range []int{g.H, g.W, g.KH, g.KW, g.StrideH, g.StrideW, g.PadH, g.PadW, oh, ow} {
		s.dims[i] = i32arg(op, v)
	}
	return s
}

// MaxPool2d sets y to the window maxima of x and argmax to their flat
// h*W+w positions in the input plane (first maximum wins, NaN propagates).
func (b *Backend) MaxPool2d(y, argmax, x tensor.Buffer, g tensor.PoolGeom) {
	const op = "maxpool2d"
	s := poolShapeOf(op, g)
	need(op, "y", y, s.yLen)
	need(op, "argmax", argmax, s.yLen)
	need(op, "x", x, s.xLen)
	d := s.dims
	b.launch(op, b.kernel("ember_maxpool2d"), s.yLen, b.f32(op, y), b.i32(op, argmax), b.f32(op, x),
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], int64(s.yLen), int64(s.xLen))
}

// MaxPool2dBackward routes dy to the argmax positions of dx (+ dx when
// accumulating), deterministically and without atomics. Windows that do not
// overlap (stride >= window, no padding: LeNet's, ResNet's and airbench's
// 2x2 pools): one thread per input row of a stride cell writes that row of
// the cell (ember_maxpool2d_backward_disjoint). Otherwise one thread per
// dx element gathers from the windows that cover it.
func (b *Backend) MaxPool2dBackward(dx, dy, argmax tensor.Buffer, g tensor.PoolGeom, accumulate bool) {
	const op = "maxpool2d_backward"
	s := poolShapeOf(op, g)
	need(op, "dx", dx, s.xLen)
	need(op, "dy", dy, s.yLen)
	need(op, "argmax", argmax, s.yLen)
	d := s.dims
	if g.StrideH >= g.KH && g.StrideW >= g.KW && g.PadH == 0 && g.PadW == 0 {
		if s.yLen == 0 {
			// No windows: nothing routed; dx = 0 (+ dx).
			if !accumulate && s.xLen > 0 {
				devCheck(op, b.x.memset32(b.f32(op, dx), 0, s.xLen))
			}
			return
		}
		ow := int(d[9])
		items := g.N * g.C * g.H * ow
		row, col := newDivider(g.H*ow), newDivider(ow)
		b.launch(op, b.kernel("ember_maxpool2d_backward_disjoint"), items, b.f32(op, dx), b.f32(op, dy), b.i32(op, argmax),
			d[0], d[1], d[2], d[3], d[4], d[5], d[8], d[9], int64(items), int64(s.xLen), flag(accumulate),
			int32(row.mul), int32(row.shift), int32(col.mul), int32(col.shift))
		return
	}
	b.launch(op, b.kernel("ember_maxpool2d_backward"), s.xLen, b.f32(op, dx), b.f32(op, dy), b.i32(op, argmax),
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], int64(s.xLen), int64(s.yLen), flag(accumulate))
}
