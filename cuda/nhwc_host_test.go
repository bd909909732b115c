package cuda

import (
	"strconv"
	"testing"
)

// TestNHWCCastKernelsOnHost runs the layout casts around autocast's
// convolutions (kernels/cast.cu: ember_to_nhwc_bf16, ember_from_nhwc_bf16)
// on the CPU through the host emulation of testdata/host_emu.h, with the
// grid and tile nhwcGrid picks, and testdata/nhwc_cast_host.cpp checks
// them bit for bit against plain loops over the two layouts. The shapes
// cover each tile width (8 to 64 channels), odd channel counts (element
// stores) and even ones (pairs), channels past one tile, planes smaller
// than a tile's rows (rows run across images) and planes no multiple of
// it; filters' shapes (fewer than 32 taps) also run the slab kernels
// (ember_to_nhwc_slab_bf16, ember_from_nhwc_slab_bf16). The GPU
// conformance suite remains the judge of the real thing.
func TestNHWCCastKernelsOnHost(t *testing.T) {
	var run []string
	for _, s := range [][3]int{
		{3, 3, 17},   // three channels (a network's input), odd: element stores; the rows kernel
		{2, 4, 45},   // four channels: the rows kernel's widest
		{2, 24, 31},  // 24 channels in a tile of 32, rows across images
		{5, 64, 9},   // 3x3 planes, one tile of 64
		{1, 130, 40}, // three channel tiles, the last of 2
		{4, 7, 50},   // odd channels, tile of 8
		{2, 16, 300}, // tile of 16 over rows spanning both images
		{3, 64, 50},  // tile of 64, three blocks of rows, the last partial
		{6, 512, 9},  // a 3x3 filter of 512 input channels: slabs of 4608
		{3, 1365, 9}, // odd channels, a slab of 12285 (the largest is 12288)
		{5, 100, 25}, // 5x5 taps
	} {
		n, ch, inner := s[0], s[1], s[2]
		_, tc := nhwcGrid(n, ch, inner)
		for _, v := range []int{n, ch, inner, tc} {
			run = append(run, strconv.Itoa(v))
		}
	}
	checkOnHost(t, "layout cast", []string{"kernels/common.cu", "kernels/cast.cu"}, "nhwc_cast_host.cpp", run...)
}
