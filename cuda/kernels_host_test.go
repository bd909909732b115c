package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestAttentionKernelsOnHost runs the fused attention kernels on the CPU:
// clang++ compiles kernels/attention.cu for the host with a thread-per-
// CUDA-thread emulation of the built-ins it uses (testdata/host_emu.h),
// and testdata/attention_host.cpp checks forward and backward, causal or
// not, with dropout from arguments and from a state, at sizes that are no
// multiple of the tiles, against a double-precision reference. So a kernel edited on a
// machine without a GPU is checked for its logic before it reaches one;
// the GPU conformance suite and compute-sanitizer remain the judges. It
// skips without clang++ and under -short.
func TestAttentionKernelsOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles and runs the attention kernels on the host (seconds)")
	}
	clang, err := exec.LookPath("clang++")
	if err != nil {
		t.Skip("clang++ not installed")
	}
	src, err := concatKernels([]string{"kernels/common.cu", "kernels/philox.cu", "kernels/attention.cu", "kernels/attention_bf16.cu"})
	if err != nil {
		t.Fatal(err)
	}
	driver, err := os.ReadFile(filepath.Join("testdata", "attention_host.cpp"))
	if err != nil {
		t.Fatal(err)
	}
	emu, err := filepath.Abs(filepath.Join("testdata", "host_emu.h"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file, bin := filepath.Join(dir, "attention_host.cpp"), filepath.Join(dir, "attention_host")
	if err := os.WriteFile(file, append([]byte(src), driver...), 0o644); err != nil {
		t.Fatal(err)
	}
	// -x c++: the kernels as plain C++; -w: the CUDA sources' #line
	// directives are not this test's.
	args := []string{"-x", "c++", "-std=c++17", "-O1", "-pthread", "-w", "-include", emu, "-o", bin, file}
	if out, err := exec.Command(clang, args...).CombinedOutput(); err != nil {
		t.Fatalf("clang++ %v: %v\n%s", args, err, out)
	}
	out, err := exec.Command(bin, strconv.Itoa(attnFwdRows), strconv.Itoa(attnFwdThreads)).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("attention kernels on the host: %v", err)
	}
}
