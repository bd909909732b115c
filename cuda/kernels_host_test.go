package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
	checkOnHost(t, "attention", []string{"kernels/common.cu", "kernels/philox.cu", "kernels/attention.cu", "kernels/attention_bf16.cu"},
		"attention_host.cpp", strconv.Itoa(attnFwdRows), strconv.Itoa(attnFwdThreads))
}

// checkOnHost runs a host test's driver (runOnHost) and fails the test,
// with the driver's output, when it reports a failure; what names the
// kernels in the messages. It skips under -short.
func checkOnHost(t *testing.T, what string, kernels []string, driver string, args ...string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("compiles and runs the %s kernels on the host (seconds)", what)
	}
	out, err := runOnHost(t, kernels, driver, args...)
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("%s kernels on the host: %v", what, err)
	}
}

// hostDynamicShared matches a kernel's dynamic shared memory declaration.
var hostDynamicShared = regexp.MustCompile(`extern __shared__ (\w+) (\w+)\[\];`)

// runOnHost compiles the kernel sources (concatenated, as a unit is) with
// the test driver testdata/driver for the CPU, through clang++ and the
// emulation of CUDA's built-ins in testdata/host_emu.h, then runs the
// program with args and returns its output. It skips the test without
// clang++.
func runOnHost(t *testing.T, kernels []string, driver string, args ...string) ([]byte, error) {
	t.Helper()
	clang, err := exec.LookPath("clang++")
	if err != nil {
		t.Skip("clang++ not installed")
	}
	src, err := concatKernels(kernels)
	if err != nil {
		t.Fatal(err)
	}
	// Dynamic shared memory becomes a static array of the 48 KiB a block
	// may take without opting in (host_emu.h makes __shared__ static).
	src = hostDynamicShared.ReplaceAllString(src, "static $1 $2[49152 / sizeof($1)];")
	prog, err := os.ReadFile(filepath.Join("testdata", driver))
	if err != nil {
		t.Fatal(err)
	}
	emu, err := filepath.Abs(filepath.Join("testdata", "host_emu.h"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, driver)
	bin := strings.TrimSuffix(file, filepath.Ext(file))
	if err := os.WriteFile(file, append([]byte(src), prog...), 0o644); err != nil {
		t.Fatal(err)
	}
	// -x c++: the kernels as plain C++; -w: the CUDA sources' #line
	// directives are not this test's.
	cc := []string{"-x", "c++", "-std=c++17", "-O1", "-pthread", "-w", "-include", emu, "-I", filepath.Dir(emu), "-o", bin, file}
	if out, err := exec.Command(clang, cc...).CombinedOutput(); err != nil {
		t.Fatalf("clang++ %v: %v\n%s", cc, err, out)
	}
	return exec.Command(bin, args...).CombinedOutput()
}
