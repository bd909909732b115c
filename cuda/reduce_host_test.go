package cuda

import (
	"strconv"
	"testing"
)

// TestReduceChannelsKernelsOnHost runs the per-channel reduction's kernels
// (kernels/reduce_axis.cu: ember_reduce_channels and its join) on the CPU
// through the host emulation of testdata/host_emu.h, with the splits and
// chunks ReduceChannels would choose (chanSplits), and
// testdata/reduce_channels_host.cpp checks them against double sums on
// fresh random inputs: odd channel counts, rows no multiple of 4, one
// outer row, a huge outer axis, channels split over dozens of blocks,
// aligned and unaligned x, sums, accumulated sums and means. So the
// indices and the partition are checked without a GPU; the GPU
// conformance suite (ReduceChannels) remains the judge. It skips without
// clang++ and under -short.
func TestReduceChannelsKernelsOnHost(t *testing.T) {
	// 64 threads a block (the kernels take any multiple of 32; the GPU's
	// 256 would only multiply the emulation's threads).
	run := []string{"64"}
	for _, s := range [][3]int{
		{1, 1, 8},       // one element row of two float4
		{1, 7, 13},      // outer 1, odd channels, rows no multiple of 4
		{5, 3, 8},       // short float4 rows
		{3, 33, 9},      // many odd channels
		{40000, 3, 9},   // huge outer: dozens of splits, one-float path
		{256, 3, 784},   // ResNet's 28x28 rows: splits cut rows mid-way
		{2, 2, 70001},   // few outer rows, long odd rows
		{100003, 1, 12}, // huge odd outer, one channel
	} {
		splits, chunk := chanSplits(s[1], s[0]*s[2])
		for _, v := range []int{s[0], s[1], s[2], splits, chunk} {
			run = append(run, strconv.Itoa(v))
		}
	}
	checkOnHost(t, "reduction", []string{"kernels/common.cu", "kernels/reduce_axis.cu"}, "reduce_channels_host.cpp", run...)
}
