package cuda

import "testing"

// TestIndexAddScanOnHost runs ember_index_add_scan (kernels/index.cu) on
// the CPU through the host emulation (testdata/index_add_host.cpp): its
// sums against the CPU backend's bit for bit, with distinct and repeated
// indices, lists of several tiles and blocks that loop; and that every bad
// index traps. It skips without clang++ and under -short.
func TestIndexAddScanOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles and runs the kernel on the host (seconds)")
	}
	out, err := runOnHost(t, []string{"kernels/common.cu", "kernels/index.cu"}, "index_add_host.cpp")
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("index kernels on the host: %v", err)
	}
}
