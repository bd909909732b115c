package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestKernelsParseWithClang checks the syntax and types of the backend's
// kernels with clang's CUDA front end (declarations of the CUDA built-ins in
// testdata/cuda_decls.h), so that a kernel edited on a machine without a GPU
// or CUDA toolkit is checked before it reaches NVRTC. It skips when clang is
// not installed; on a GPU the backend compiles the same source with NVRTC
// and the conformance tests run it.
func TestKernelsParseWithClang(t *testing.T) {
	clang, decls := clangCUDA(t)
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
		// sm_80 as well where a unit has kernels compiled for it only, and
		// code for sm_90 and later (thread block clusters) parsed as if for
		// sm_90: this clang knows no sm_90, so the architecture macro is set
		// by hand and __cluster_dims__ left out.
		archs := [][]string{{"--cuda-gpu-arch=sm_70"}}
		if slices.Contains(u.files, "kernels/attention_bf16.cu") {
			archs = append(archs, []string{"--cuda-gpu-arch=sm_80"})
		}
		if strings.Contains(src, "__CUDA_ARCH__ >= 900") {
			archs = append(archs, []string{"--cuda-gpu-arch=sm_80", "-U__CUDA_ARCH__", "-D__CUDA_ARCH__=900", "-D__cluster_dims__(x,y,z)="})
		}
		for _, arch := range archs {
			args := []string{"-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib"}
			// -Wzero-length-array: clang takes an array of size zero (an
			// unused template instance's) as an extension; NVRTC refuses it.
			args = append(append(args, arch...), "-include", decls, "-Wall", "-Wzero-length-array", "-Werror", "-fsyntax-only")
			args = append(append(args, u.defines...), file)
			if out, err := exec.Command(clang, args...).CombinedOutput(); err != nil {
				t.Fatalf("clang, unit %d %v (%s): %v\n%s", i, u.files, arch, err, out)
			}
		}
	}
}

// TestBF16PairRoundingByArch: common.cu's ember_bf16x2_from_f32 issues
// cvt.rn.bf16x2 for sm_80 and later only; before (sm_70, sm_75: V100,
// T4) it keeps the integer rounding, since the instruction does not exist
// there. Checked on clang's preprocessed source of common.cu per arch.
func TestBF16PairRoundingByArch(t *testing.T) {
	clang, decls := clangCUDA(t)
	src, err := kernelFS.ReadFile("kernels/common.cu")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "common.cu")
	if err := os.WriteFile(file, src, 0o644); err != nil {
		t.Fatal(err)
	}
	for arch, want := range map[string]bool{"sm_70": false, "sm_75": false, "sm_80": true} {
		out, err := exec.Command(clang, "-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib",
			"--cuda-gpu-arch="+arch, "-include", decls, "-E", file).CombinedOutput()
		if err != nil {
			t.Fatalf("clang -E, %s: %v\n%s", arch, err, out)
		}
		if got := strings.Contains(string(out), "cvt.rn.bf16x2.f32"); got != want {
			t.Errorf("%s: cvt.rn.bf16x2 in ember_bf16x2_from_f32: %v, want %v", arch, got, want)
		}
	}
}

// clangCUDA is clang++ and the absolute path of the CUDA built-ins'
// declarations it is given; the test skips where clang++ is missing.
func clangCUDA(t *testing.T) (clang, decls string) {
	t.Helper()
	clang, err := exec.LookPath("clang++")
	if err != nil {
		t.Skip("clang++ not installed")
	}
	decls, err = filepath.Abs(filepath.Join("testdata", "cuda_decls.h"))
	if err != nil {
		t.Fatal(err)
	}
	return clang, decls
}
