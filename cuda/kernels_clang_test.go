package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestKernelsParseWithClang checks the syntax and types of the backend's
// kernels with clang's CUDA front end (declarations of the CUDA built-ins in
// testdata/cuda_decls.h), so that a kernel edited on a machine without a GPU
// or CUDA toolkit is checked before it reaches NVRTC. It skips when clang is
// not installed; on a GPU the backend compiles the same source with NVRTC
// and the conformance tests run it.
func TestKernelsParseWithClang(t *testing.T) {
	clang, err := exec.LookPath("clang++")
	if err != nil {
		t.Skip("clang++ not installed")
	}
	decls, err := filepath.Abs(filepath.Join("testdata", "cuda_decls.h"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, u := range kernelUnits {
		src, err := u.source()
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, fmt.Sprintf("unit%d.cu", i))
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib",
			"--cuda-gpu-arch=sm_70", "-include", decls, "-Wall", "-Werror", "-fsyntax-only"}
		args = append(append(args, u.defines...), file)
		if out, err := exec.Command(clang, args...).CombinedOutput(); err != nil {
			t.Fatalf("clang, unit %d %v: %v\n%s", i, u.files, err, out)
		}
	}
}
