package driver

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kernel bundles: kernels compiled ahead of time and shipped inside the
// binary, so that a cold start (empty kernel cache) runs no compiler.
//
// A bundle is a zip archive (deflate, readable with any unzip) holding one
// image per (source, options, target): "KEY/sm_90.cubin" for a GPU
// architecture, "KEY/compute_90.ptx" for PTX the driver JIT-compiles on any
// GPU of that architecture or newer. KEY is BundleKey(source, options): the
// SHA-256 of the exact source text and options, so that a source edited
// since the bundle was made finds no entry and is compiled at run time, as
// without a bundle; a wrong kernel cannot be loaded. The key leaves out
// the NVRTC version (the images need no compiler to load); a driver too old
// for the NVRTC that made them rejects them, and the caller then compiles.
// manifest.json says which NVRTC made the bundle and names each entry's
// unit, for reports.
//
// Every entry carries zip's CRC-32; a truncated archive fails
// ParseKernelBundle and a damaged entry fails its Load, and either way the
// caller falls back to compiling.

// BundleManifest describes a bundle (its manifest.json).
type BundleManifest struct {
	Format  int          `json:"format"`  // bundleFormat
	NVRTC   string       `json:"nvrtc"`   // the NVRTC version that compiled the images, e.g. "13.0"
	Targets []string     `json:"targets"` // e.g. sm_90, compute_90
	Units   []BundleUnit `json:"units"`
}

// BundleUnit is one translation unit of a bundle: Name for reports, Key
// its BundleKey, Images the hex SHA-256 of its image for each target
// (checked when an image is loaded, beside zip's CRC-32). Source and
// Options are the inputs given to BuildKernelBundle (not stored).
type BundleUnit struct {
	Name    string            `json:"name"`
	Key     string            `json:"key"`
	Images  map[string]string `json:"images"`
	Source  string            `json:"-"`
	Options []string          `json:"-"`
}

const (
	bundleFormat   = 1
	bundleManifest = "manifest.json"
	// maxBundleImage bounds one decompressed image (the largest of ours is
	// a few MB), so that a damaged size field cannot exhaust memory.
	maxBundleImage = 256 << 20
)

// ErrNotInBundle is KernelBundle.Load's error when the bundle holds no
// image of the source and options for the device: the source changed
// since the bundle was made, or the bundle has nothing for this GPU.
var ErrNotInBundle = errors.New("cuda: kernel bundle: no image for this source")

// BundleKey is the key of a source compiled with options (no
// --gpu-architecture: the target is part of the entry's name). Each field
// is length prefixed, as in the kernel cache's key.
func BundleKey(src string, opts []string) string {
	return sourceKey("ember-kernel-bundle-v1", src, opts)
}

// KernelBundle is a parsed bundle. Images are decompressed when loaded. A
// nil *KernelBundle holds nothing. Safe for concurrent use.
type KernelBundle struct {
	Manifest BundleManifest
	Size     int                             // compressed bytes
	images   map[string]map[string]*zip.File // key -> target -> entry
	sums     map[string]map[string]string    // key -> target -> SHA-256 (the manifest's)
}

// ParseKernelBundle reads a bundle's index and manifest (no image is
// decompressed). Any damage to the archive's structure, a missing or
// unreadable manifest, or an unknown format is an error.
func ParseKernelBundle(data []byte) (*KernelBundle, error) {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, fmt.Errorf("cuda: kernel bundle: %w", err)
	}
	kb := &KernelBundle{Size: len(data), images: map[string]map[string]*zip.File{}}
	var manifest *zip.File
	for _, f := range zr.File {
		if f.Name == bundleManifest {
			manifest = f
			continue
		}
		key, file := path.Split(f.Name)
		key = strings.TrimSuffix(key, "/")
		target, ok := targetOfImage(file)
		if !validKey(key) || !ok {
			return nil, fmt.Errorf("cuda: kernel bundle: unexpected entry %q", f.Name)
		}
		if kb.images[key] == nil {
			kb.images[key] = map[string]*zip.File{}
		}
		kb.images[key][target] = f
	}
	if manifest == nil {
		return nil, fmt.Errorf("cuda: kernel bundle: no %s", bundleManifest)
	}
	raw, err := readZipFile(manifest, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("cuda: kernel bundle: %s: %w", bundleManifest, err)
	}
	if err := json.Unmarshal(raw, &kb.Manifest); err != nil {
		return nil, fmt.Errorf("cuda: kernel bundle: %s: %w", bundleManifest, err)
	}
	if kb.Manifest.Format != bundleFormat {
		return nil, fmt.Errorf("cuda: kernel bundle: format %d, this build reads format %d", kb.Manifest.Format, bundleFormat)
	}
	kb.sums = map[string]map[string]string{}
	for _, u := range kb.Manifest.Units {
		kb.sums[u.Key] = u.Images
	}
	return kb, nil
}

// targetOfImage parses an entry's file name: "sm_90.cubin" or
// "compute_90.ptx".
func targetOfImage(file string) (string, bool) {
	target, ext, ok := strings.Cut(file, ".")
	if !ok {
		return "", false
	}
	kind, _, ok := parseTarget(target)
	if !ok || ext != imageExt(kind) {
		return "", false
	}
	return target, true
}

// parseTarget splits "sm_90" / "compute_90" into its image kind and SM
// version.
func parseTarget(target string) (ImageKind, int, bool) {
	kind, num := ImageCUBIN, strings.TrimPrefix(target, "sm_")
	if num == target {
		kind, num = ImagePTX, strings.TrimPrefix(target, "compute_")
	}
	v, err := strconv.Atoi(num)
	if num == target || err != nil || v <= 0 || strconv.Itoa(v) != num {
		return 0, 0, false
	}
	return kind, v, true
}

func imageExt(kind ImageKind) string {
	if kind == ImageCUBIN {
		return "cubin"
	}
	return "ptx"
}

func readZipFile(f *zip.File, limit uint64) ([]byte, error) {
	if f.UncompressedSize64 > limit {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", f.Name, f.UncompressedSize64, limit)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// zip's reader checks the CRC-32 and the size at EOF: read to the end.
	data, err := io.ReadAll(io.LimitReader(rc, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	if uint64(len(data)) != f.UncompressedSize64 {
		return nil, fmt.Errorf("%s: %d bytes, the index says %d", f.Name, len(data), f.UncompressedSize64)
	}
	return data, nil
}

// Has reports whether the bundle holds src compiled with opts for any
// target.
func (kb *KernelBundle) Has(src string, opts []string) bool {
	return kb != nil && len(kb.images[BundleKey(src, opts)]) > 0
}

// HasKey reports whether the bundle holds images under key.
func (kb *KernelBundle) HasKey(key string) bool { return kb != nil && len(kb.images[key]) > 0 }

// pick chooses the image for a GPU of SM version sm among the targets of
// one entry: the cubin for exactly this architecture, else the PTX of the
// newest architecture not newer than the GPU (PTX runs on its own and
// later architectures), else none.
func pick(targets map[string]*zip.File, sm int) (string, bool) {
	if _, ok := targets["sm_"+strconv.Itoa(sm)]; ok {
		return "sm_" + strconv.Itoa(sm), true
	}
	best, bestV := "", 0
	for t := range targets {
		if kind, v, ok := parseTarget(t); ok && kind == ImagePTX && v <= sm && v > bestV {
			best, bestV = t, v
		}
	}
	return best, best != ""
}

// TargetFor is the target of the bundle's images that a GPU of compute
// capability major.minor loads (see pick); false when none fits it.
func (kb *KernelBundle) TargetFor(major, minor int) (string, bool) {
	if kb == nil {
		return "", false
	}
	targets := map[string]*zip.File{}
	for _, t := range kb.Manifest.Targets {
		targets[t] = nil
	}
	return pick(targets, major*10+minor)
}

// UnitTarget is the target of src compiled with opts that a GPU of compute
// capability major.minor would load (see pick); false when the bundle has
// no image of it that fits. Unlike TargetFor it looks at this entry alone,
// which may lack a target the manifest lists.
func (kb *KernelBundle) UnitTarget(src string, opts []string, major, minor int) (string, bool) {
	if kb == nil {
		return "", false
	}
	return pick(kb.images[BundleKey(src, opts)], major*10+minor)
}

// Image returns the bundle's image of src compiled with opts for a GPU of
// compute capability major.minor (see pick), decompressed and checked
// against its CRC-32. ErrNotInBundle when there is none.
func (kb *KernelBundle) Image(src string, opts []string, major, minor int) (image []byte, kind ImageKind, target string, err error) {
	if kb == nil {
		return nil, 0, "", ErrNotInBundle
	}
	if archOption(opts) != "" {
		return nil, 0, "", fmt.Errorf("%w: the options name an architecture", ErrNotInBundle)
	}
	targets := kb.images[BundleKey(src, opts)]
	if len(targets) == 0 {
		return nil, 0, "", fmt.Errorf("%w: the source or options differ from every entry (changed since the bundle was made)", ErrNotInBundle)
	}
	sm := major*10 + minor
	target, ok := pick(targets, sm)
	if !ok {
		have := make([]string, 0, len(targets))
		for t := range targets {
			have = append(have, t)
		}
		slices.Sort(have)
		return nil, 0, "", fmt.Errorf("%w: nothing for sm_%d (the bundle has %s)", ErrNotInBundle, sm, strings.Join(have, ", "))
	}
	kind, _, _ = parseTarget(target)
	img, err := readZipFile(targets[target], maxBundleImage)
	if err != nil {
		return nil, 0, "", fmt.Errorf("cuda: kernel bundle: %w", err)
	}
	sum := sha256.Sum256(img)
	if want := kb.sums[BundleKey(src, opts)][target]; want != hex.EncodeToString(sum[:]) {
		return nil, 0, "", fmt.Errorf("cuda: kernel bundle: %s: the image's SHA-256 differs from the manifest's", targets[target].Name)
	}
	return img, kind, target, nil
}

// LoadBundled loads src compiled with opts from the bundle into d: the
// cubin for d's architecture, or PTX that the driver JIT-compiles (see
// Image). It runs no compiler. The error wraps ErrNotInBundle when the
// bundle has no image for it, else says why an image was unusable (a
// damaged entry, or a driver that rejects it); either way the caller
// compiles the source instead (Compile).
func (d *Device) LoadBundled(kb *KernelBundle, src string, opts ...string) (*Module, error) {
	if d == nil || d.closed.Load() {
		return nil, ErrClosed
	}
	img, kind, target, err := kb.Image(src, opts, d.major, d.minor)
	if errors.Is(err, ErrNotInBundle) {
		kstats.bundleMisses.Add(1)
		return nil, err
	}
	if err == nil {
		var m *Module
		if m, err = d.loadModule(img, kind, target); err == nil {
			kstats.bundleHits.Add(1)
			return m, nil
		}
		err = fmt.Errorf("cuda: kernel bundle: %s image rejected by the driver: %w", target, err)
	}
	kstats.bundleBad.Add(1)
	return nil, err
}

// BundleCompiler compiles one unit for one target: NVRTC in
// BuildKernelBundle (a fake in tests).
type BundleCompiler func(src string, opts []string, target string) ([]byte, error)

// NVRTCBundleCompiler compiles with NVRTC for target (sm_XY: a cubin;
// compute_XY: PTX). It needs no GPU.
func NVRTCBundleCompiler(src string, opts []string, target string) ([]byte, error) {
	kind, _, ok := parseTarget(target)
	if !ok {
		return nil, fmt.Errorf("cuda: kernel bundle: target %q: want sm_XY or compute_XY", target)
	}
	res, err := nvrtcCompile(src, "ember_kernel.cu", append(slices.Clone(opts), "--gpu-architecture="+target), kind == ImageCUBIN)
	if err != nil {
		return nil, err
	}
	return res.image, nil
}

// BundleNVRTCVersion is the version of the NVRTC that NVRTCBundleCompiler
// uses ("13.0"), loading it.
func BundleNVRTCVersion() (string, error) {
	if err := loadNVRTC(); err != nil {
		return "", err
	}
	return nvrtcVersStr, nil
}

// BuildKernelBundle compiles every unit for every target with compile, in
// parallel (NVRTC compiles one program on one thread), and writes the
// bundle to w; nvrtc names the compiler in the manifest. log, when not nil,
// gets a line per image. The output depends only on the inputs (entries in
// a fixed order, no time stamps).
func BuildKernelBundle(w io.Writer, units []BundleUnit, targets []string, nvrtc string, compile BundleCompiler, log io.Writer) error {
	if len(units) == 0 || len(targets) == 0 {
		return errors.New("cuda: kernel bundle: no units or no targets")
	}
	for _, t := range targets {
		if _, _, ok := parseTarget(t); !ok {
			return fmt.Errorf("cuda: kernel bundle: target %q: want sm_XY or compute_XY", t)
		}
	}
	type job struct {
		unit, target int
		img          []byte
		err          error
		secs         float64
	}
	units = slices.Clone(units) // Key and Images are filled in below
	jobs := make([]*job, 0, len(units)*len(targets))
	for u := range units {
		units[u].Key = BundleKey(units[u].Source, units[u].Options)
		units[u].Images = map[string]string{}
		for t := range targets {
			jobs = append(jobs, &job{unit: u, target: t})
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, runtime.NumCPU()))
	var logMu sync.Mutex
	for _, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t0 := time.Now()
			u := units[j.unit]
			j.img, j.err = compile(u.Source, u.Options, targets[j.target])
			j.secs = time.Since(t0).Seconds()
			if j.err == nil && len(j.img) == 0 {
				j.err = errors.New("empty image")
			}
			if log != nil {
				logMu.Lock()
				fmt.Fprintf(log, "kernel bundle: %s for %s: %d bytes in %.2f s\n", u.Name, targets[j.target], len(j.img), j.secs)
				logMu.Unlock()
			}
		})
	}
	wg.Wait()
	var errs []error
	for _, j := range jobs {
		if j.err != nil {
			errs = append(errs, fmt.Errorf("%s for %s: %w", units[j.unit].Name, targets[j.target], j.err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: kernel bundle: %w", err)
	}

	zw := zip.NewWriter(w)
	zw.RegisterCompressor(zip.Deflate, func(out io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(out, flate.BestCompression)
	})
	put := func(name string, data []byte) error {
		f, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate})
		if err != nil {
			return err
		}
		_, err = f.Write(data)
		return err
	}
	for _, j := range jobs {
		u := &units[j.unit]
		sum := sha256.Sum256(j.img)
		u.Images[targets[j.target]] = hex.EncodeToString(sum[:])
	}
	man, err := json.MarshalIndent(BundleManifest{Format: bundleFormat, NVRTC: nvrtc, Targets: targets, Units: units}, "", "  ")
	if err != nil {
		return err
	}
	if err := put(bundleManifest, append(man, '\n')); err != nil {
		return fmt.Errorf("cuda: kernel bundle: %w", err)
	}
	seen := map[string]bool{}
	for _, j := range jobs {
		kind, _, _ := parseTarget(targets[j.target])
		name := units[j.unit].Key + "/" + targets[j.target] + "." + imageExt(kind)
		if seen[name] {
			continue // two units of the same source and options
		}
		seen[name] = true
		if err := put(name, j.img); err != nil {
			return fmt.Errorf("cuda: kernel bundle: %w", err)
		}
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("cuda: kernel bundle: %w", err)
	}
	return nil
}
