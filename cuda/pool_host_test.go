package cuda

import "testing"

// TestMaxPoolBackwardKernelOnHost runs max pooling's backward pass for
// windows that do not overlap (kernels/conv.cu:
// ember_maxpool2d_backward_disjoint) on the CPU through the host
// emulation, and testdata/maxpool_host.cpp checks it bit for bit against a
// plain scatter of dy to the argmaxes: odd planes whose last cells own the
// rows and columns past the windows, ceil mode's partial windows, windows
// smaller than their strides, overwriting and accumulating.
func TestMaxPoolBackwardKernelOnHost(t *testing.T) {
	checkOnHost(t, "max pooling", []string{"kernels/common.cu", "kernels/conv.cu"}, "maxpool_host.cpp")
}
