package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
		// sm_80 as well where a unit has kernels compiled for it only.
		archs := []string{"sm_70"}
		if slices.Contains(u.files, "kernels/attention_bf16.cu") {
			archs = append(archs, "sm_80")
		}
		for _, arch := range archs {
			args := []string{"-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib",
				"--cuda-gpu-arch=" + arch, "-include", decls, "-Wall", "-Werror", "-fsyntax-only"}
			args = append(append(args, u.defines...), file)
			if out, err := exec.Command(clang, args...).CombinedOutput(); err != nil {
				t.Fatalf("clang, unit %d %v (%s): %v\n%s", i, u.files, arch, err, out)
			}
		}
	}
}
