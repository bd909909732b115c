package cuda

import (
	_ "embed"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/ember-ml/ember/cuda/driver"
)

// The kernel bundle: the kernel units compiled ahead of time, embedded in
// the binary, so that a cold start (empty kernel cache) on the GPUs it was
// built for runs no compiler. kernels/bundle.zip holds each unit as a
// cubin for sm_90 (H100, H200) and as PTX for compute_90. A newer GPU
// compiles with NVRTC where it can, which measured faster than the
// driver's JIT of the PTX, and loads the PTX where NVRTC fails or is
// missing (kernels_load.go); an older GPU compiles as without a bundle.
// Entries are keyed by a SHA-256 of the unit's exact source and options
// (package cuda/driver, kernelbundle.go), so a unit edited since the
// bundle was made is compiled at run time: a stale bundle costs time,
// never a wrong kernel. A damaged embedded bundle is ignored the same way
// (KernelLog says so).
//
// Regenerating it (on a machine with NVRTC; no GPU is needed):
//
//	go run ./cmd/kernelbundle -o cuda/kernels/bundle.zip
//
// and `go run ./cmd/kernelbundle -check cuda/kernels/bundle.zip` (or
// TestKernelBundleFresh) lists the units that are stale in it.
// docs/bench/kernel_bundle.sh does both from a machine without NVRTC.

//go:embed kernels/bundle.zip
var embeddedBundle []byte

// BundleTargets are the targets of the embedded bundle: the cubin of the
// H200 and PTX for its architecture and later ones.
var BundleTargets = []string{"sm_90", "compute_90"}

// embedded parses embeddedBundle once (a variable: the tests damage it).
var embedded = sync.OnceValues(func() (*driver.KernelBundle, error) { return driver.ParseKernelBundle(embeddedBundle) })

// openKernelBundle resolves BackendOptions.KernelBundle: "" the embedded
// bundle (nil and why, when it is damaged: the units are then compiled),
// "off" none, anything else a bundle file, which must be readable and
// sound.
func openKernelBundle(setting string) (kb *driver.KernelBundle, from string, unusable error, err error) {
	switch strings.ToLower(strings.TrimSpace(setting)) {
	case "":
		kb, unusable := embedded()
		return kb, "embedded", unusable, nil
	case "off", "0", "false", "none", "disabled":
		return nil, "off", nil, nil
	}
	data, err := os.ReadFile(setting)
	if err != nil {
		return nil, "", nil, fmt.Errorf("cuda: BackendOptions.KernelBundle (EMBER_KERNEL_BUNDLE): %w", err)
	}
	if kb, err = driver.ParseKernelBundle(data); err != nil {
		return nil, "", nil, fmt.Errorf("cuda: BackendOptions.KernelBundle (EMBER_KERNEL_BUNDLE) %s: %w", setting, err)
	}
	return kb, setting, nil, nil
}

// unitName names unit i in reports: its sources (common.cu left out) and
// definitions.
func unitName(i int) string {
	u := kernelUnits[i]
	name := strings.Join(u.files[1:], " ")
	if len(u.defines) > 0 {
		name += " " + strings.Join(u.defines, " ")
	}
	return strings.ReplaceAll(name, "kernels/", "")
}

// bundleUnits are the units as the bundle keys them.
func bundleUnits() ([]driver.BundleUnit, error) {
	var out []driver.BundleUnit
	for i, u := range kernelUnits {
		src, err := u.source()
		if err != nil {
			return nil, err
		}
		out = append(out, driver.BundleUnit{Name: fmt.Sprintf("unit %d (%s)", i, unitName(i)), Source: src, Options: u.options()})
	}
	return out, nil
}

// StaleBundleUnits lists the units of this build that kb holds no image of
// (edited since it was made): they are compiled at run time.
func StaleBundleUnits(kb *KernelBundle) ([]string, error) {
	idx, err := staleUnits(kb)
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, i := range idx {
		stale = append(stale, fmt.Sprintf("unit %d (%s)", i, unitName(i)))
	}
	return stale, nil
}

// staleUnits are the indices of the units kb holds no image of.
func staleUnits(kb *KernelBundle) ([]int, error) {
	var stale []int
	for i, u := range kernelUnits {
		src, err := u.source()
		if err != nil {
			return nil, err
		}
		if !kb.Has(src, u.options()) {
			stale = append(stale, i)
		}
	}
	return stale, nil
}

// WriteKernelBundle compiles every kernel unit of this build for each
// target (sm_XY: a cubin; compute_XY: PTX) with NVRTC, in parallel, and
// writes the bundle to w (cmd/kernelbundle). It needs NVRTC, not a GPU.
// log, when not nil, gets a line per image.
func WriteKernelBundle(w io.Writer, targets []string, log io.Writer) error {
	units, err := bundleUnits()
	if err != nil {
		return err
	}
	nvrtc, err := driver.BundleNVRTCVersion()
	if err != nil {
		return err
	}
	return driver.BuildKernelBundle(w, units, targets, nvrtc, driver.NVRTCBundleCompiler, log)
}

// ParseKernelBundle reads a bundle (driver.ParseKernelBundle).
func ParseKernelBundle(data []byte) (*KernelBundle, error) { return driver.ParseKernelBundle(data) }

// openBundle sets the backend's bundle from its options and reports its
// freshness to KernelLog.
func (b *Backend) openBundle() error {
	kb, from, unusable, err := openKernelBundle(b.opt.KernelBundle)
	if err != nil {
		return err
	}
	b.bundle = kb
	w := b.opt.KernelLog
	if w == nil || from == "off" {
		return nil
	}
	if unusable != nil {
		fmt.Fprintf(w, "cuda: kernel bundle (%s) unusable, every unit is compiled: %v\n", from, unusable)
		return nil
	}
	stale, err := StaleBundleUnits(kb)
	if err != nil {
		return err
	}
	major, minor := b.dev.ComputeCapability()
	m := kb.Manifest
	fmt.Fprintf(w, "cuda: kernel bundle (%s, %d bytes, NVRTC %s, %s): %d of %d units fresh for this build",
		from, kb.Size, m.NVRTC, strings.Join(m.Targets, " "), len(kernelUnits)-len(stale), len(kernelUnits))
	if len(stale) > 0 {
		fmt.Fprintf(w, "; stale (compiled at run time): %s", strings.Join(stale, ", "))
	}
	if t, ok := kb.TargetFor(major, minor); ok && !isPTXTarget(t) {
		fmt.Fprintf(w, "; this GPU (sm_%d%d) loads %s", major, minor, t)
	} else if ok {
		fmt.Fprintf(w, "; this GPU (sm_%d%d) compiles with NVRTC, the bundle's %s PTX the fallback", major, minor, t)
	} else {
		fmt.Fprintf(w, "; nothing for this GPU (sm_%d%d): every unit is compiled", major, minor)
	}
	fmt.Fprintln(w)
	return nil
}
