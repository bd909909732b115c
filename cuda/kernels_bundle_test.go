package cuda

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ember-ml/ember/cuda/driver"
	"github.com/ember-ml/ember/tensor"
)

// TestKernelBundleFresh reports which kernel units the embedded bundle
// holds for this build. Policy: a bundle that does not parse fails (it is
// committed and must be sound); a stale unit (a source edited since the
// bundle was made, which then compiles at run time) is logged and fails
// only under EMBER_KERNEL_BUNDLE_STRICT=1, which the check after
// regenerating the bundle sets: CI has no NVRTC to regenerate it, and a
// stale unit costs start-up time, never correctness.
func TestKernelBundleFresh(t *testing.T) {
	kb, err := driver.ParseKernelBundle(embeddedBundle)
	if err != nil {
		t.Fatalf("the embedded bundle (kernels/bundle.zip, %d bytes) does not parse: %v", len(embeddedBundle), err)
	}
	stale, err := StaleBundleUnits(kb)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernels/bundle.zip: %d bytes, NVRTC %s, targets %v, %d of %d units fresh", len(embeddedBundle), kb.Manifest.NVRTC,
		kb.Manifest.Targets, len(kernelUnits)-len(stale), len(kernelUnits))
	for _, s := range stale {
		t.Logf("stale (compiled at run time until the bundle is regenerated: go run ./cmd/kernelbundle -o cuda/kernels/bundle.zip): %s", s)
	}
	if len(stale) > 0 && os.Getenv("EMBER_KERNEL_BUNDLE_STRICT") == "1" {
		t.Errorf("EMBER_KERNEL_BUNDLE_STRICT=1 and %d units are stale", len(stale))
	}
	for _, want := range BundleTargets {
		if len(stale) < len(kernelUnits) && !strings.Contains(" "+strings.Join(kb.Manifest.Targets, " ")+" ", " "+want+" ") {
			t.Errorf("the bundle's targets %v lack %s", kb.Manifest.Targets, want)
		}
	}
	// A unit edited by one byte is not found: it is compiled, never served
	// the old image.
	for i, u := range kernelUnits {
		src, err := u.source()
		if err != nil {
			t.Fatal(err)
		}
		if kb.Has(src+" ", u.options()) || kb.Has(src, append(u.options(), "-DEMBER_EDITED")) {
			t.Errorf("unit %d: an edited source or other options find an image", i)
		}
	}
}

// withEmbedded replaces the embedded bundle for one test.
func withEmbedded(t *testing.T, data []byte) {
	old, oldParse := embeddedBundle, embedded
	embeddedBundle = data
	embedded = sync.OnceValues(func() (*driver.KernelBundle, error) { return driver.ParseKernelBundle(embeddedBundle) })
	t.Cleanup(func() { embeddedBundle, embedded = old, oldParse })
}

// TestOpenKernelBundle checks BackendOptions.KernelBundle: a damaged
// embedded bundle is set aside with the reason (the units then compile);
// "off" is none; a file is read, and an unreadable or damaged one is an
// error naming the option and the file.
func TestOpenKernelBundle(t *testing.T) {
	kb, from, unusable, err := openKernelBundle("")
	if err != nil || unusable != nil || kb == nil || from != "embedded" {
		t.Fatalf(`"": %v %q %v %v; want the embedded bundle`, kb, from, unusable, err)
	}
	if kb, _, unusable, err := openKernelBundle("off"); kb != nil || unusable != nil || err != nil {
		t.Errorf(`"off": %v %v %v; want no bundle`, kb, unusable, err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "bundle.zip")
	if err := os.WriteFile(good, embeddedBundle, 0o644); err != nil {
		t.Fatal(err)
	}
	if kb, from, unusable, err := openKernelBundle(good); kb == nil || from != good || unusable != nil || err != nil {
		t.Errorf("a bundle file: %v %q %v %v", kb, from, unusable, err)
	}
	bad := filepath.Join(dir, "truncated.zip")
	if err := os.WriteFile(bad, embeddedBundle[:len(embeddedBundle)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bad, filepath.Join(dir, "missing.zip")} {
		if _, _, _, err := openKernelBundle(p); err == nil || !strings.Contains(err.Error(), "KernelBundle") || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v; want an error naming BackendOptions.KernelBundle and the file", p, err)
		}
	}
	for _, n := range []int{0, 22, len(embeddedBundle) - 1} {
		withEmbedded(t, embeddedBundle[:n])
		kb, from, unusable, err := openKernelBundle("")
		if kb != nil || unusable == nil || err != nil || from != "embedded" {
			t.Errorf("the embedded bundle truncated to %d bytes: %v %v %v; want it set aside with the reason", n, kb, unusable, err)
		}
	}
}

// unitKey is unit i's bundle key.
func unitKey(t *testing.T, i int) string {
	t.Helper()
	src, err := kernelUnits[i].source()
	if err != nil {
		t.Fatal(err)
	}
	return driver.BundleKey(src, kernelUnits[i].options())
}

// filterBundle rewrites a bundle with only the entries keep accepts (the
// manifest is always kept).
func filterBundle(t *testing.T, data []byte, keep func(name string) bool) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range zr.File {
		if f.Name == "manifest.json" || keep(f.Name) {
			if err := zw.Copy(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestKernelBundleUnitsGPU starts backends on the GPU with the bundle
// (EMBER_KERNEL_BUNDLE or the embedded one): each fresh unit loads from
// it when it has a cubin for this GPU; a unit missing from it (as an
// edited one is) compiles at run time, as every unit does when the bundle
// holds only PTX for this GPU (a newer GPU than its cubins, with NVRTC
// present); the operators compute what the CPU does either way. Skipped where the bundle has nothing for this GPU
// or is stale for the core units.
func TestKernelBundleUnitsGPU(t *testing.T) {
	d := requireGPU(t)
	opt, err := OptionsFromEnv(BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kb, from, unusable, err := openKernelBundle(opt.KernelBundle)
	if err != nil || unusable != nil || kb == nil {
		t.Fatalf("bundle %q: %v %v", opt.KernelBundle, unusable, err)
	}
	major, minor := d.ComputeCapability()
	if _, ok := kb.TargetFor(major, minor); !ok {
		t.Skipf("the bundle (%s, targets %v) has nothing for sm_%d%d", from, kb.Manifest.Targets, major, minor)
	}
	stale, err := staleUnits(kb)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(stale, 0) || slices.Contains(stale, 9) {
		t.Skipf("the bundle (%s) is stale for the core units: %v", from, stale)
	}
	var data []byte
	if opt.KernelBundle == "" {
		data = embeddedBundle
	} else if data, err = os.ReadFile(opt.KernelBundle); err != nil {
		t.Fatal(err)
	}
	check := func(what string, b *Backend) {
		x := tensor.FromFloat32(b, nil, []float32{1, -2, 3.5, 4, 5, 6, 7, 8.25}, 8)
		y := tensor.Mul(tensor.Add(x, x), x) // elementwise (unit 0)
		want := []float32{2, 8, 24.5, 32, 50, 72, 98, 136.125}
		for i, v := range y.Float32s() {
			if v != want[i] {
				t.Fatalf("%s: (x+x)*x = %v; want %v", what, y.Float32s(), want)
			}
		}
		y.Release()
		x.Release()
	}
	key0, cubin := unitKey(t, 0), "/sm_"+strconv.Itoa(major*10+minor)+".cubin"
	for _, c := range []struct {
		what    string
		keep    func(name string) bool
		bundled map[int]bool
		reason  map[int]string // what KernelUnit.From says of a unit
	}{
		{"the bundle", func(string) bool { return true }, map[int]bool{0: true, 9: true}, nil},
		{"the bundle without unit 0", func(n string) bool { return !strings.HasPrefix(n, key0+"/") },
			map[int]bool{0: false, 9: true}, map[int]string{0: "changed since the bundle was made"}},
		// A newer GPU than the cubins finds only PTX: NVRTC compiles.
		{"the bundle's PTX only", func(n string) bool { return !strings.HasSuffix(n, cubin) },
			map[int]bool{0: false, 9: false}, map[int]string{0: "PTX", 9: "PTX"}},
	} {
		path := filepath.Join(t.TempDir(), "bundle.zip")
		if err := os.WriteFile(path, filterBundle(t, data, c.keep), 0o644); err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		b := newGPUBackend(t, BackendOptions{KernelBundle: path, KernelLog: &syncWriter{w: &log}})
		check(c.what, b)
		units := b.KernelUnits()
		for i, want := range c.bundled {
			if units[i].Bundled != want {
				t.Errorf("%s: unit %d loaded from the bundle %v, want %v (%s)", c.what, i, units[i].Bundled, want, units[i].From)
			}
		}
		for i, want := range c.reason {
			if !strings.Contains(units[i].From, want) {
				t.Errorf("%s: unit %d: %q; want the reason it was compiled (%q)", c.what, i, units[i].From, want)
			}
		}
		b.kl.settle()
		if !strings.Contains(log.String(), "kernel bundle ("+path) {
			t.Errorf("%s: the kernel log does not report the bundle:\n%s", c.what, log.String())
		}
		t.Logf("%s:\n%s", c.what, log.String())
	}
}

// syncWriter serialises the kernel log's writes from the loader's
// goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
