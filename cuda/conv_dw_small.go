package cuda

import (
	"fmt"
	"math"
)

// The filter gradient of convolutions with few taps under autocast
// (kernels/conv.cu, ember_conv_dw_small and its join): a network's first
// layer on one to three input channels, which cuDNN's deterministic
// tensor-core algorithms fit badly (they pad the channels to eight), where
// the products are few and dy only has to be read once. Measured on the
// H200 beside the cuDNN path in one call: ResNet-9 bf16 0.745 -> 0.731 s an
// epoch, airbench 0.301 -> 0.299. The sums are those Conv2dBackwardLowp defines: products of
// the bfloat16-rounded (masked) dy and x, summed in float32 per block and
// in double across blocks in a fixed order (deterministic), rounded to
// bfloat16 and added into dw.

// The limits of ember_conv_dw_small (EMBER_DWS_* in conv.cu): the tile of
// positions, the most output channels and taps (C·R·S) a block holds in
// shared memory, and the most blocks (the partition depends on the shape
// alone, so results do not depend on the device).
const (
	dwsTile   = 96
	dwsMaxK   = 64
	dwsMaxCRS = 16
	dwsBlocks = 1024
	// clDwsTileMax is ember_cl_conv_dw_small's most positions a tile
	// (EMBER_CL_DWS_TP_MAX).
	clDwsTileMax = 256
)

// clDwsTile is ember_cl_conv_dw_small's positions a tile for k output
// channels: what its dy tile of dwsTile·dwsMaxK floats holds, at most
// clDwsTileMax.
func clDwsTile(k int) int { return min(clDwsTileMax, dwsTile*dwsMaxK/k) }

// smallFilterGrad reports whether the filter gradient of c goes to
// ember_conv_dw_small.
func smallFilterGrad(c convShape) bool {
	return c.groups == 1 && c.crs > 0 && c.crs <= dwsMaxCRS && c.g.K > 0 && c.g.K <= dwsMaxK &&
		c.np > 0 && c.np <= math.MaxInt32-clDwsTileMax*dwsBlocks
}

// filterGradSmall queues dw += bfloat16(the filter gradient of the
// bfloat16-rounded dy, masked where pmask is not positive when pmask is
// not 0, and x): ember_conv_dw_small over blocks of positions, then its
// join.
func (b *Backend) filterGradSmall(op string, pdw, px, pdy, pmask uintptr, c convShape) {
	b.filterGradSmallOf(op, "ember_conv_dw_small", dwsTile, pdw, px, pdy, []any{pmask}, nil, c)
}

// filterGradSmallChannelsLast is filterGradSmall of x and dy held
// channels-last: ember_cl_conv_dw_small_mma_n* on tensor cores where the
// device has them, else ember_cl_conv_dw_small, over the same blocks of
// positions.
func (b *Backend) filterGradSmallChannelsLast(op string, pdw, px, pdy uintptr, c convShape) {
	tile := clDwsTile(c.g.K)
	kernel := fmt.Sprintf("ember_cl_conv_dw_small_mma_n%d", clMMAChannelTiles(c.g.K))
	if !b.hasKernel(kernel) {
		kernel = clSmallKernel(c.g, true)
	}
	b.filterGradSmallOf(op, kernel, tile, pdw, px, pdy, nil, append(dividerArgs(c.p, c.ow, c.g.C), int32(tile)), c)
}

// filterGradSmallOf queues kernel (ember_conv_dw_small's parameters, with
// mask the ones after dy and extra after the last; tiles of tile
// positions) and its join.
func (b *Backend) filterGradSmallOf(op, kernel string, tile int, pdw, px, pdy uintptr, mask, extra []any, c convShape) {
	tiles := (c.np + tile - 1) / tile
	per := (tiles + dwsBlocks - 1) / dwsBlocks * tile
	blocks := (c.np + per - 1) / per
	pairs := c.g.K * c.crs
	ws := b.workspace(op, 8*pairs*blocks)
	defer b.release(ws)
	d := c.dims
	args := append(append([]any{ws.Ptr(), px, pdy}, mask...), d[0], d[1], d[2], d[3], i32arg(op, c.g.K), d[4], d[5], d[6], d[7], d[8], d[9],
		d[10], d[11], c.dil[0], c.dil[1], i32arg(op, per))
	args = append(args, extra...)
	devCheck(op, b.x.launch(b.kernel(kernel), Dim3{X: blocks, Y: 1, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1}, args))
	const warps = blockSize / 32
	b.launchGrid(op, b.kernel("ember_conv_dw_small_join"), (pairs+warps-1)/warps, blockSize,
		pdw, ws.Ptr(), i32arg(op, pairs), i32arg(op, blocks))
}
