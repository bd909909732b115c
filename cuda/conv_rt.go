package cuda

// Register-tiled direct convolution (kernels/conv_rt.cu) for stride-1
// layers with a 5x5 or 3x3 kernel whose image and weights fit in a block's
// shared memory, with at least 8 input channels (LeNet's conv2) or, forward
// only, one (LeNet's conv1). It replaces
//
//	forward:  conv_relu_pool_5x5_2x2(_c4) (one pooled output per thread or 4
//	          lanes, no reuse of a loaded value across output channels)
//	backward: im2col, the dw GEMM (split-K), the dcol GEMM and col2im
//
// with conv_relu_pool_rt, and conv_dw_rt + add_parts and conv_dx_rt, which
// read the pooled gradient, output and argmax of a fused layer directly (or
// the dense gradient of a plain Conv2d): no column buffer, no unpooled
// gradient, fewer launches (docs/performance.md has the timings).
// EMBER_CONV_RT=0 switches them off (for comparisons).
//
// One difference from the GEMM path, for non-finite inputs only: the
// backward kernels sum over rows padded to multiples of four columns with
// zero gradients, so an Inf or NaN of x (weight gradient) or w (input
// gradient) next to the padding becomes NaN (0·Inf) in sums the GEMM path
// does not form.

import (
	"github.com/ember-ml/ember/tensor"
)

// rtSmemFloats is the kernels' shared memory in floats (EMBER_RT_SMEM).
const rtSmemFloats = 12288

// rtDXWarps is the most warps of a conv_dx_rt block (EMBER_RT_DX_THREADS).
const rtDXWarps = 9

func round4(v int) int { return (v + 3) &^ 3 }

// rtKernelSize says whether the kernels are instantiated for c's R x S
// kernel and c is a stride-1 convolution.
func rtKernelSize(c convShape) bool {
	g := c.g
	return g.StrideH == 1 && g.StrideW == 1 && g.R == g.S && (g.R == 5 || g.R == 3) && c.p > 0
}

// rtManyChannels says whether c has enough input channels that splitting
// each sum over them pays (the backward kernels and the forward's split
// variants).
func rtManyChannels(c convShape) bool { return c.g.C >= 8 }

// rtForward is the register-tiled forward kernel for c and s (2x2 windows
// moved by 2), or nil.
func (b *Backend) rtForward(c convShape, s convPoolShape) *Function {
	g, p := c.g, s.p
	if b.noConvRT || !rtKernelSize(c) || p.KH != 2 || p.KW != 2 || p.StrideH != 2 || p.StrideW != 2 || s.pp == 0 {
		return nil
	}
	// One input channel: only large batches (LeNet's conv1 at batch 1024: 45
	// us against 63 for conv_relu_pool_5x5_2x2; at batch 64, 9.8 against 7.1).
	if !rtManyChannels(c) && (g.C != 1 || g.N < rtImageBlocks) {
		return nil
	}
	hp, wp := g.H+2*g.PadH, g.W+2*g.PadW
	xs := round4(max(wp, 2*p.OutW()+6))
	if rtChannelsPerBlock(g)*c.crs+g.C*hp*xs > rtSmemFloats {
		return nil
	}
	f := &convReLUPoolRTKernels
	if g.R == 3 {
		f = &convReLUPoolRT3Kernels
	}
	return b.kernel(f[rtSplit(g)])
}

// The register-tiled forward kernels by lanes per sum (rtSplit), and the
// backward ones by rtVariant.
var (
	convReLUPoolRTKernels  = [3]string{"ember_conv_relu_pool_rt_5x5_s1", "ember_conv_relu_pool_rt_5x5", "ember_conv_relu_pool_rt_5x5_s8"}
	convReLUPoolRT3Kernels = [3]string{"ember_conv_relu_pool_rt_3x3_s1", "ember_conv_relu_pool_rt_3x3", "ember_conv_relu_pool_rt_3x3_s8"}
	convDWRTKernels        = [4]string{"ember_conv_dw_rt_5x5", "ember_conv_dw_rt_3x3", "ember_conv_dw_rt_pooled_5x5", "ember_conv_dw_rt_pooled_3x3"}
	convDXRTKernels        = [4]string{"ember_conv_dx_rt_5x5", "ember_conv_dx_rt_3x3", "ember_conv_dx_rt_pooled_5x5", "ember_conv_dx_rt_pooled_3x3"}
)

// rtSplit indexes the forward kernels by lanes per sum: 1 for one input
// channel, 8 for small grids, else 4.
func rtSplit(g tensor.ConvGeom) int {
	switch {
	case g.C == 1:
		return 0
	case rtForwardBlocks(g) < rtSmallGrid:
		return 2
	}
	return 1
}

// rtSmallGrid is the forward grid below which 8 lanes share each sum
// instead of 4 (about two blocks per SM of an H200).
const rtSmallGrid = 264

func rtForwardBlocks(g tensor.ConvGeom) int {
	kpb := rtChannelsPerBlock(g)
	return min(g.N, rtImageBlocks) * ((g.K + kpb - 1) / kpb)
}

// rtChannelsPerBlock is how many output channels a forward block takes: 16
// (4 groups of 4), or with one input channel, whose weights are small, up to
// 32, so that no group of a block is left idle (LeNet's conv1: 20 in one
// block instead of 16 and 4).
func rtChannelsPerBlock(g tensor.ConvGeom) int {
	if g.C == 1 {
		return 4 * min(8, (g.K+3)/4)
	}
	return 16
}

// rtImageBlocks caps the images a forward or input-gradient grid covers at
// once: larger batches loop, so that the weights a block copies serve
// several images. (At batch 1024: 128 took 0.044 s per epoch, 256 and 512
// 0.042, 1024 0.043.)
const rtImageBlocks = 256

// launchRTForward queues the register-tiled forward: rtChannelsPerBlock
// output channels per block, a warp (two with 8 lanes per sum) for each 4.
func (b *Backend) launchRTForward(op string, f *Function, py, pa, px, pw, pbias uintptr, s convPoolShape) {
	g := s.c.g
	kpb := rtChannelsPerBlock(g)
	threads := 32 * kpb / 4 // a warp per 4 channels
	if rtSplit(g) == 2 {
		threads *= 2
	}
	grid := Dim3{X: min(g.N, rtImageBlocks), Y: i32dim(op, (g.K+kpb-1)/kpb), Z: 1}
	devCheck(op, b.x.launch(f, grid, Dim3{X: threads, Y: 1, Z: 1}, []any{py, pa, px, pw, pbias,
		i32arg(op, g.N), i32arg(op, g.C), i32arg(op, g.H), i32arg(op, g.W), i32arg(op, g.K),
		i32arg(op, g.PadH), i32arg(op, g.PadW), i32arg(op, s.c.ow), i32arg(op, s.p.OutH()), i32arg(op, s.p.OutW())}))
}

// rtDW is the register-tiled weight-gradient kernel for c (reading the
// pooled gradient when pooled), or nil.
func (b *Backend) rtDW(c convShape, pooled bool) *Function {
	g := c.g
	if b.noConvRT || !rtKernelSize(c) || !rtManyChannels(c) {
		return nil
	}
	hp, wp := g.H+2*g.PadH, g.W+2*g.PadW
	xs := round4(max(wp, round4(c.ow)+4))
	if g.C*hp*xs+round4(g.K)*c.oh*round4(c.ow) > rtSmemFloats {
		return nil
	}
	return b.kernel(convDWRTKernels[rtVariant(g, pooled)])
}

// rtVariant indexes the backward kernels: 5x5, 3x3, then their pooled
// forms.
func rtVariant(g tensor.ConvGeom, pooled bool) int {
	i := 0
	if g.R == 3 {
		i = 1
	}
	if pooled {
		i += 2
	}
	return i
}

// rtDX is the register-tiled input-gradient kernel for c (reading the
// pooled gradient when pooled), or nil.
func (b *Backend) rtDX(c convShape, pooled bool) *Function {
	g := c.g
	if b.noConvRT || !rtKernelSize(c) || !rtManyChannels(c) || g.PadH > g.R-1 || g.PadW > g.S-1 {
		return nil
	}
	ds := round4(max(g.S-1-g.PadW+c.ow, 4*((g.W+3)/4)+4))
	dos := c.oh * ds // ember_rt_dx_ostride: an odd number of 16-byte words
	if dos/4%2 == 0 {
		dos += 4
	}
	if g.K*g.R*g.S*4+g.K*dos > rtSmemFloats-4 { // 4: the image queue's
		return nil
	}
	return b.kernel(convDXRTKernels[rtVariant(g, pooled)])
}

// rtGroups is how many image groups the weight gradient is split into (one
// block row and one partial dw each), before rounding to whole images per
// group: about 32 where the batch allows, for enough blocks, and at most
// 128, which bounds the partials' memory (128 copies of dw; 64 groups at
// batch 64 cost 3.2 MB more at the peak).
func rtGroups(n int) int { return min(n, 128, max(32, (n+7)/8)) }

// rtSource is where the backward kernels read the output gradient: dyt
// [K, N·P], or the pooled gradient of a fused convolution + ReLU + pooling
// with its output and argmax (see ember_dy_source).
type rtSource struct {
	dyt           uintptr
	dy, y, argmax uintptr
	pp            int
}

func (r rtSource) pooled() bool { return r.dyt == 0 }

// args are the source's kernel arguments.
func (r rtSource) args(op string) []any {
	if r.pooled() {
		return []any{r.dy, r.y, r.argmax, i32arg(op, r.pp)}
	}
	return []any{r.dyt}
}

// convBackwardRT queues dw += and dx = (either may be 0: not wanted) from
// src with the register-tiled kernels, and then alsoDW (when not nil: the
// bias gradient, which needs neither), and reports whether it could; when
// not, nothing was queued. With both dw and dx, inside a graph capture, the
// weight gradient and alsoDW run on the side stream (see sideLane) while
// the input gradient runs on the main one; otherwise one after the other.
func (b *Backend) convBackwardRT(op string, pdx, pdw, px, pw uintptr, src rtSource, c convShape, alsoDW func(ex executor)) bool {
	if c.g.N == 0 || !c.g.Plain() { // the kernels know neither dilation nor groups
		return false
	}
	var fdw, fdx *Function
	if pdw != 0 {
		if fdw = b.rtDW(c, src.pooled()); fdw == nil {
			return false
		}
	}
	if pdx != 0 {
		if fdx = b.rtDX(c, src.pooled()); fdx == nil {
			return false
		}
	}
	g := c.g
	dims := []any{i32arg(op, g.N), i32arg(op, g.C), i32arg(op, g.H), i32arg(op, g.W), i32arg(op, g.K),
		i32arg(op, g.PadH), i32arg(op, g.PadW), i32arg(op, c.oh), i32arg(op, c.ow)}
	weightGrad := func(ex executor, ws uintptr, groups, per int) {
		tasks := (g.K + 3) / 4 * g.C * g.R // EMBER_RT_DW_KT = 4 output channels per task
		grid := Dim3{X: gridX(op, groups), Y: i32dim(op, (tasks+blockSize-1)/blockSize), Z: 1}
		args := append(append(append([]any{ws}, src.args(op)...), px), dims...)
		devCheck(op, ex.launch(fdw, grid, Dim3{X: blockSize, Y: 1, Z: 1}, append(args, i32arg(op, per))))
		devCheck(op, ex.launch(b.kernel("ember_add_parts"), gridFor(c.wLen), Dim3{X: blockSize, Y: 1, Z: 1},
			[]any{pdw, ws, int64(c.wLen), i32arg(op, groups)}))
	}
	inputGrad := func() {
		positions := g.H * ((g.W + 3) / 4)
		warps := min((positions+3)/4, rtDXWarps) // 4 positions per warp
		grid := Dim3{X: min(g.N, rtImageBlocks), Y: i32dim(op, (g.C+3)/4), Z: 1}
		// Images dealt out as blocks finish, when blocks loop. The counters
		// are the backend's one set: the input gradient runs on the main
		// stream only, one launch at a time.
		var queue uintptr
		if g.N > grid.X && grid.Y <= rtQueueGroups {
			queue = b.tileCounters.Ptr() + 4*rtQueue
		}
		args := append(append(append([]any{pdx}, src.args(op)...), pw), dims...)
		devCheck(op, b.x.launch(fdx, grid, Dim3{X: 32 * warps, Y: 1, Z: 1}, append(args, queue)))
	}
	also := func(ex executor) {
		if alsoDW != nil {
			alsoDW(ex)
		}
	}
	if fdw == nil {
		inputGrad()
		also(b.x)
		return true
	}
	groups := rtGroups(g.N)
	per := (g.N + groups - 1) / groups
	groups = (g.N + per - 1) / per
	// The partials are allocated and freed on the main stream, around the
	// fork and after the join.
	ws := b.workspace(op, 4*groups*c.wLen)
	defer b.release(ws)
	if fdx == nil {
		weightGrad(b.x, ws.Ptr(), groups, per)
		also(b.x)
		return true
	}
	devCheck(op, b.x.parallel(func(ex executor) {
		weightGrad(ex, ws.Ptr(), groups, per)
		also(ex)
	}, inputGrad))
	return true
}
