package cuda

import "testing"

// TestIndexAddScanOnHost runs ember_index_add_scan (kernels/index.cu) on
// the CPU through the host emulation (testdata/index_add_host.cpp): its
// sums against the CPU backend's bit for bit, with distinct and repeated
// indices, lists of several tiles and blocks that loop; and that every bad
// index traps. It skips without clang++ and under -short.
func TestIndexAddScanOnHost(t *testing.T) {
	checkOnHost(t, "index", []string{"kernels/common.cu", "kernels/index.cu"}, "index_add_host.cpp")
}
