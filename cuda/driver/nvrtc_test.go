package driver

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// CPU tests.

func TestChooseArch(t *testing.T) {
	cases := []struct {
		major, minor int
		supported    []int
		cubin        bool
		want         string
		wantCubin    bool
		wantErr      bool
	}{
		{9, 0, []int{75, 80, 86, 89, 90}, true, "sm_90", true, false},
		{9, 0, nil, true, "sm_90", true, false},                              // list unknown: trust NVRTC
		{9, 0, []int{75, 80, 90}, false, "compute_90", false, false},         // no nvrtcGetCUBIN: PTX
		{12, 0, []int{75, 80, 86, 89, 90}, true, "compute_90", false, false}, // GPU newer than NVRTC: PTX, driver JITs
		{8, 6, []int{75, 80, 90}, true, "compute_80", false, false},          // not listed: best lower PTX
		{7, 0, []int{75, 80, 86, 89, 90, 100}, true, "", false, true},        // GPU older than NVRTC supports
		{10, 0, []int{75, 80, 86, 89, 90, 100, 120}, true, "sm_100", true, false},
	}
	for _, c := range cases {
		arch, cubin, err := chooseArch(c.major, c.minor, c.supported, c.cubin)
		if (err != nil) != c.wantErr || arch != c.want || cubin != c.wantCubin {
			t.Errorf("chooseArch(%d.%d, %v, %v) = %q, %v, %v; want %q, %v, err=%v",
				c.major, c.minor, c.supported, c.cubin, arch, cubin, err, c.want, c.wantCubin, c.wantErr)
		}
	}
}

func TestArchOption(t *testing.T) {
	for _, c := range []struct {
		opts []string
		want string
	}{
		{nil, ""},
		{[]string{"-lineinfo"}, ""},
		{[]string{"--gpu-architecture=sm_80"}, "sm_80"},
		{[]string{"-use_fast_math", "-arch=compute_90"}, "compute_90"},
		{[]string{"-arch", "sm_86"}, "sm_86"},
		{[]string{"--gpu-architecture", "sm_75", "-O3"}, "sm_75"},
		{[]string{"-arch"}, ""},
	} {
		if got := archOption(c.opts); got != c.want {
			t.Errorf("archOption(%q) = %q, want %q", c.opts, got, c.want)
		}
	}
}

func TestNVRTCMissingMessage(t *testing.T) {
	if _, _, err := NVRTCVersion(); err == nil {
		t.Skip("NVRTC is installed")
	} else {
		var le *LibraryError
		if errors.As(err, &le) && le.Missing == "" && le.Detail == "" {
			want := "NVRTC not found: tried libnvrtc.so.13, .12, .11 (install the CUDA runtime compiler, e.g. cuda-nvrtc)"
			if err.Error() != want {
				t.Errorf("got  %q\nwant %q", err.Error(), want)
			}
		}
		t.Log(err)
	}
}

// ---------------------------------------------------------------------------
// GPU tests.

func TestGPUCompileCacheHit(t *testing.T) {
	d := requireGPU(t)
	cache := gpuTempCache(t, d)
	src := testKernels + "\n// cache test " + t.Name() + "\n"
	before := ReadKernelStats()

	m1, err := d.Compile(src)
	gpuCheck(t, err)
	defer m1.Unload()
	mid := ReadKernelStats()
	if mid.Compiles-before.Compiles != 1 || mid.CacheMisses-before.CacheMisses != 1 {
		t.Errorf("first compile: %+v -> %+v", before, mid)
	}
	entries, err := os.ReadDir(cache.Dir())
	gpuCheck(t, err)
	if len(entries) != 1 || !strings.HasSuffix(entries[0].Name(), ".kc") {
		t.Fatalf("cache dir after one compile: %v", entries)
	}

	m2, err := d.Compile(src)
	gpuCheck(t, err)
	defer m2.Unload()
	after := ReadKernelStats()
	if after.Compiles != mid.Compiles {
		t.Errorf("second compile of the same source ran NVRTC: %+v -> %+v", mid, after)
	}
	if after.CacheHits-mid.CacheHits != 1 {
		t.Errorf("second compile was not a cache hit: %+v -> %+v", mid, after)
	}
	// The cached module works.
	f := gpuFunction(t, m2, "add_one")
	x, err := d.AllocFloat32(10)
	gpuCheck(t, err)
	defer x.Free()
	gpuCheck(t, x.CopyFromHost(make([]float32, 10)))
	gpuCheck(t, f.Launch(Dim3{X: 1}, Dim3{X: 32}, 0, 0, x.Ptr(), int32(10)))
	out := make([]float32, 10)
	gpuCheck(t, x.CopyToHost(out))
	if out[9] != 1 {
		t.Errorf("kernel from cache: %v", out)
	}

	// Different options: a different entry, compiled again.
	m3, err := d.Compile(src, "-lineinfo")
	gpuCheck(t, err)
	defer m3.Unload()
	if s := ReadKernelStats(); s.Compiles-after.Compiles != 1 {
		t.Errorf("compile with other options did not compile: %+v", s)
	}

	// A corrupted entry is ignored, recompiled and rewritten.
	path := cache.path(entries[0].Name()[:64])
	gpuCheck(t, os.WriteFile(path, []byte("garbage"), 0o644))
	pre := ReadKernelStats()
	m4, err := d.Compile(src)
	gpuCheck(t, err)
	defer m4.Unload()
	post := ReadKernelStats()
	if post.Compiles-pre.Compiles != 1 || post.CacheBadEntry-pre.CacheBadEntry != 1 {
		t.Errorf("corrupt entry: %+v -> %+v", pre, post)
	}
	if _, _, ok := cache.Get(entries[0].Name()[:64]); !ok {
		t.Error("corrupt entry was not rewritten")
	}

	// Caching disabled: every Compile compiles.
	d.SetKernelCache(nil)
	pre = ReadKernelStats()
	m5, err := d.Compile(src)
	gpuCheck(t, err)
	defer m5.Unload()
	if s := ReadKernelStats(); s.Compiles-pre.Compiles != 1 {
		t.Errorf("with the cache off: %+v", s)
	}
}

func TestGPUCompileError(t *testing.T) {
	d := requireGPU(t)
	gpuTempCache(t, d)
	_, err := d.Compile(`extern "C" __global__ void broken(float *x) { x[0] = undefined_name; }`)
	if err == nil {
		t.Fatal("broken source compiled")
	}
	var e *Error
	if !errors.As(err, &e) || e.Name != "NVRTC_ERROR_COMPILATION" || e.Call != "nvrtcCompileProgram" {
		t.Fatalf("error = %#v", err)
	}
	if !strings.Contains(e.Message, "undefined_name") {
		t.Errorf("error does not carry the program log: %q", e.Message)
	}
	t.Log(err)
	if _, err := d.Compile("", "--no-such-option"); err == nil {
		t.Error("unknown option accepted")
	}
}

func TestGPUCompileUserArch(t *testing.T) {
	d := requireGPU(t)
	major, minor := d.ComputeCapability()
	archs := []string{"compute_" + testItoa(major*10+minor)}
	for _, arch := range archs {
		m := gpuCompile(t, d, saxpySrc, "--gpu-architecture="+arch)
		if m.Kind != ImagePTX || m.Arch != arch {
			t.Errorf("%s: kind %v arch %s", arch, m.Kind, m.Arch)
		}
		gpuFunction(t, m, "saxpy")
	}
	nvMajor, nvMinor, err := NVRTCVersion()
	gpuCheck(t, err)
	t.Logf("NVRTC %d.%d, supported archs %v", nvMajor, nvMinor, nvrtcArchs)
}

func testItoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}
