package cuda

import "testing"

// TestChannelsLastKernelsOnHost runs the channels-last kernels
// (kernels/channels_last.cu: max pooling and its gradient, batch norm's
// sums, statistics and passes, a first layer's direct convolution and its
// filter gradient) on the CPU through the host emulation, and
// testdata/channels_last_host.cpp checks them against plain loops over the
// same bfloat16 values (bounds stated there). It skips without clang++ and
// under -short.
func TestChannelsLastKernelsOnHost(t *testing.T) {
	checkOnHost(t, "channels-last", []string{"kernels/common.cu", "kernels/norm.cu", "kernels/conv.cu", "kernels/channels_last.cu"}, "channels_last_host.cpp")
}
