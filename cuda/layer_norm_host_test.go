package cuda

import (
	"strconv"
	"testing"
)

// TestLayerNormKernelsOnHost runs layer norm's kernels over rows held in
// registers (ember_layer_norm_rows*, ember_layer_norm_backward_rows* and the
// finish over their partial sums) and the kernels they replace on the CPU
// through the host emulation; testdata/layer_norm_host.cpp wants the same
// bits for y, the statistics and dx, and the parameters' sums within the
// bounds it states. The grids are the backend's (lnLanes, lnRowsBlocks),
// so blocks take several rows a warp where rows outnumber them. It skips
// without clang++ and under -short.
func TestLayerNormKernelsOnHost(t *testing.T) {
	// 64 threads a block (the kernels take any multiple of 32; the GPU's 256
	// would only multiply the emulation's threads, every one a pthread).
	const threads = 64
	run := []string{strconv.Itoa(threads)}
	for _, s := range [][2]int{
		{1, 3},    // one row, most lanes idle
		{37, 35},  // a second column a lane for three lanes
		{40, 128}, // whole rows of four a lane
		{45, 200}, // eight a lane, the last partly
		{20, 384}, // the GPT's width
		{5, 512},  // the widest held
		{700, 5},  // more rows than the grid's warps: several a warp
	} {
		rows, cols := s[0], s[1]
		run = append(run, strconv.Itoa(rows), strconv.Itoa(cols), strconv.Itoa(lnLanes(cols)), strconv.Itoa(lnRowsBlocks(rows)))
	}
	checkOnHost(t, "layer norm", []string{"kernels/common.cu", "kernels/norm.cu"}, "layer_norm_host.cpp", run...)
}
