package driver

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// fakeImage is what the fake compiler makes of a source for a target: the
// tests can tell every image apart.
func fakeImage(src string, opts []string, target string) []byte {
	return []byte(target + "|" + strings.Join(opts, " ") + "|" + src)
}

func fakeCompiler(src string, opts []string, target string) ([]byte, error) {
	return fakeImage(src, opts, target), nil
}

func testBundle(t *testing.T, units []BundleUnit, targets []string, compile BundleCompiler) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := BuildKernelBundle(&buf, units, targets, "13.0", compile, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func twoUnits() []BundleUnit {
	return []BundleUnit{
		{Name: "a", Source: "__global__ void a() {}", Options: []string{"--fmad=false"}},
		{Name: "b", Source: "__global__ void b() {}", Options: []string{"--fmad=false", "-DX=3"}},
	}
}

func TestBundleKey(t *testing.T) {
	base := BundleKey("src", []string{"-O3"})
	if !validKey(base) || BundleKey("src", []string{"-O3"}) != base {
		t.Fatalf("key %q: not 64 hex digits or not deterministic", base)
	}
	for what, k := range map[string]string{
		"a byte of the source": BundleKey("src ", []string{"-O3"}),
		"the options":          BundleKey("src", []string{"-O2"}),
		"no options":           BundleKey("src", nil),
		"the option split":     BundleKey("src", []string{"-O", "3"}),
	} {
		if k == base {
			t.Errorf("changing %s gives the same key", what)
		}
	}
}

// TestKernelBundleLookup checks which image a GPU gets: the cubin of its
// own architecture, else the PTX of the newest architecture not newer than
// it, else none; and that a changed source or options find nothing.
func TestKernelBundleLookup(t *testing.T) {
	units := twoUnits()
	data := testBundle(t, units, []string{"sm_90", "compute_80", "compute_90"}, fakeCompiler)
	kb, err := ParseKernelBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	if kb.Manifest.NVRTC != "13.0" || len(kb.Manifest.Units) != 2 || kb.Manifest.Units[1].Name != "b" ||
		kb.Manifest.Units[1].Key != BundleKey(units[1].Source, units[1].Options) {
		t.Errorf("manifest %+v", kb.Manifest)
	}
	for _, c := range []struct {
		major, minor int
		want         string // target, "" for none
	}{
		{9, 0, "sm_90"}, {10, 0, "compute_90"}, {12, 0, "compute_90"}, {8, 9, "compute_80"}, {8, 0, "compute_80"}, {7, 5, ""},
	} {
		for _, u := range units {
			if got, ok := kb.UnitTarget(u.Source, u.Options, c.major, c.minor); got != c.want || ok != (c.want != "") {
				t.Errorf("unit %s on sm_%d%d: UnitTarget %q, %v; want %q", u.Name, c.major, c.minor, got, ok, c.want)
			}
			img, kind, target, err := kb.Image(u.Source, u.Options, c.major, c.minor)
			if c.want == "" {
				if !errors.Is(err, ErrNotInBundle) {
					t.Errorf("sm_%d%d: %v; want ErrNotInBundle", c.major, c.minor, err)
				}
				continue
			}
			wantKind := ImagePTX
			if strings.HasPrefix(c.want, "sm_") {
				wantKind = ImageCUBIN
			}
			if err != nil || target != c.want || kind != wantKind || !bytes.Equal(img, fakeImage(u.Source, u.Options, c.want)) {
				t.Errorf("unit %s on sm_%d%d: %s %v %q, %v; want the %s image", u.Name, c.major, c.minor, target, kind, img, err, c.want)
			}
		}
	}
	u := units[0]
	for what, in := range map[string]BundleUnit{
		"an edited source":    {Source: u.Source + "\n", Options: u.Options},
		"other options":       {Source: u.Source, Options: []string{"--fmad=true"}},
		"an architecture set": {Source: u.Source, Options: append([]string{"--gpu-architecture=sm_90"}, u.Options...)},
	} {
		if kb.Has(in.Source, in.Options) {
			t.Errorf("%s: Has reports an entry", what)
		}
		if _, _, _, err := kb.Image(in.Source, in.Options, 9, 0); !errors.Is(err, ErrNotInBundle) {
			t.Errorf("%s: %v; want ErrNotInBundle (a changed source must be compiled, never served a stale image)", what, err)
		}
	}
	var none *KernelBundle
	if _, _, _, err := none.Image(u.Source, u.Options, 9, 0); !errors.Is(err, ErrNotInBundle) || none.Has(u.Source, u.Options) {
		t.Errorf("a nil bundle: %v", err)
	}
	if again := testBundle(t, twoUnits(), []string{"sm_90", "compute_80", "compute_90"}, fakeCompiler); !bytes.Equal(again, data) {
		t.Error("two builds of the same inputs differ: the bundle is not reproducible")
	}
}

// TestKernelBundleDamage truncates the bundle at every length and flips
// every byte of it in turn: each damaged copy either fails to parse, or
// fails the lookup, or returns exactly the image it would undamaged (a
// byte zip does not check, such as a time stamp). No damage may give a
// wrong image.
func TestKernelBundleDamage(t *testing.T) {
	units := twoUnits()
	targets := []string{"sm_90", "compute_90"}
	data := testBundle(t, units, targets, fakeCompiler)
	check := func(what string, d []byte) (served int) {
		kb, err := ParseKernelBundle(d)
		if err != nil {
			return 0
		}
		for _, u := range units {
			for _, sm := range []int{90, 100} {
				img, _, target, err := kb.Image(u.Source, u.Options, sm/10, sm%10)
				if err != nil {
					continue
				}
				served++
				if !bytes.Equal(img, fakeImage(u.Source, u.Options, target)) {
					t.Fatalf("%s: unit %s on sm_%d got %q as its %s image", what, u.Name, sm, img, target)
				}
			}
		}
		return served
	}
	if n := check("undamaged", data); n != 4 {
		t.Fatalf("undamaged bundle served %d images; want 4", n)
	}
	for n := range len(data) {
		if _, err := ParseKernelBundle(data[:n]); err == nil {
			t.Fatalf("a bundle truncated to %d of %d bytes parses", n, len(data))
		}
	}
	for i := range data {
		d := bytes.Clone(data)
		d[i] ^= 0x5a
		check("byte "+strconv.Itoa(i)+" flipped", d)
	}
	if _, err := ParseKernelBundle([]byte("not a zip archive at all")); err == nil {
		t.Error("garbage parses as a bundle")
	}
}

func TestBuildKernelBundleErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := BuildKernelBundle(&buf, twoUnits(), []string{"sm90"}, "", fakeCompiler, nil); err == nil || !strings.Contains(err.Error(), "sm90") {
		t.Errorf("a malformed target: %v", err)
	}
	if err := BuildKernelBundle(&buf, nil, []string{"sm_90"}, "", fakeCompiler, nil); err == nil {
		t.Error("no units accepted")
	}
	failB := func(src string, opts []string, target string) ([]byte, error) {
		if strings.Contains(src, "void b") {
			return nil, errors.New("syntax error")
		}
		return fakeImage(src, opts, target), nil
	}
	if err := BuildKernelBundle(&buf, twoUnits(), []string{"sm_90"}, "", failB, nil); err == nil || !strings.Contains(err.Error(), "b for sm_90: syntax error") {
		t.Errorf("a failed compile: %v; want it named with its unit and target", err)
	}
	empty := func(string, []string, string) ([]byte, error) { return nil, nil }
	if err := BuildKernelBundle(&buf, twoUnits(), []string{"sm_90"}, "", empty, nil); err == nil {
		t.Error("an empty image accepted")
	}
}

// TestGPUKernelBundle builds a real bundle with NVRTC for this GPU (its
// cubin, and PTX of its architecture) and checks on the device: a fresh
// source loads from it without compiling and computes saxpy; the PTX alone
// (what a newer GPU than the bundle's gets) loads too; an edited source
// misses; an image the driver rejects is an error the caller can fall
// back from.
func TestGPUKernelBundle(t *testing.T) {
	d := requireGPU(t)
	major, minor := d.ComputeCapability()
	sm := strconv.Itoa(major*10 + minor)
	opts := []string{"--fmad=false"}
	units := []BundleUnit{{Name: "saxpy", Source: saxpySrc, Options: opts}}
	run := func(what string, kb *KernelBundle) {
		before := ReadKernelStats()
		m, err := d.LoadBundled(kb, saxpySrc, opts...)
		if err != nil {
			t.Fatalf("%s: LoadBundled: %v", what, err)
		}
		defer m.Unload()
		if after := ReadKernelStats(); after.Compiles != before.Compiles || after.BundleHits != before.BundleHits+1 {
			t.Errorf("%s: stats %+v -> %+v; want a bundle hit and no compile", what, before, after)
		}
		const n = 1000
		hx, hy := make([]float32, n), make([]float32, n)
		for i := range hx {
			hx[i], hy[i] = float32(i)/7, float32(n-i)/3
		}
		x, err := d.AllocFloat32(n)
		gpuCheck(t, err)
		defer x.Free()
		y, err := d.AllocFloat32(n)
		gpuCheck(t, err)
		defer y.Free()
		gpuCheck(t, x.CopyFromHost(hx))
		gpuCheck(t, y.CopyFromHost(hy))
		gpuCheck(t, gpuFunction(t, m, "saxpy").Launch(Grid1D(n, 128), Dim3{X: 128}, 0, 0, float32(1.5), x, y.Ptr(), int32(n)))
		got := make([]float32, n)
		gpuCheck(t, y.CopyToHost(got))
		for i := range got {
			// --fmad=false: a*x and +y round separately, as Go does.
			if want := 1.5*hx[i] + hy[i]; got[i] != want && math.Abs(float64(got[i]-want)) > 1e-6*math.Abs(float64(want)) {
				t.Fatalf("%s: y[%d] = %v, want %v", what, i, got[i], want)
			}
		}
		t.Logf("%s: %v for %s", what, m.Kind, m.Arch)
	}
	var buf bytes.Buffer
	if err := BuildKernelBundle(&buf, units, []string{"sm_" + sm, "compute_" + sm}, "", NVRTCBundleCompiler, nil); err != nil {
		t.Fatal(err)
	}
	kb, err := ParseKernelBundle(buf.Bytes())
	gpuCheck(t, err)
	run("cubin", kb)
	buf.Reset()
	if err := BuildKernelBundle(&buf, units, []string{"compute_" + sm}, "", NVRTCBundleCompiler, nil); err != nil {
		t.Fatal(err)
	}
	ptx, err := ParseKernelBundle(buf.Bytes())
	gpuCheck(t, err)
	run("PTX", ptx)

	if _, err := d.LoadBundled(kb, saxpySrc+"// edited\n", opts...); !errors.Is(err, ErrNotInBundle) {
		t.Errorf("an edited source: %v; want ErrNotInBundle", err)
	}
	buf.Reset()
	junk := func(string, []string, string) ([]byte, error) { return []byte("\x7fELF not really a cubin"), nil }
	if err := BuildKernelBundle(&buf, units, []string{"sm_" + sm}, "", junk, nil); err != nil {
		t.Fatal(err)
	}
	bad, err := ParseKernelBundle(buf.Bytes())
	gpuCheck(t, err)
	before := ReadKernelStats().BundleBad
	if _, err := d.LoadBundled(bad, saxpySrc, opts...); err == nil || errors.Is(err, ErrNotInBundle) {
		t.Errorf("a cubin the driver rejects: %v; want an error other than ErrNotInBundle", err)
	} else if !strings.Contains(err.Error(), "rejected") {
		t.Errorf("a rejected cubin: %v", err)
	}
	if ReadKernelStats().BundleBad != before+1 {
		t.Error("a rejected image is not counted in BundleBad")
	}
}
