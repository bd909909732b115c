package cuda

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// When the kernel units compile. A cold start (empty kernel cache) spends
// seconds in NVRTC, most of them on units a model may never launch: the
// register-tiled convolutions (conv_rt.cu, twice) serve LeNet-shaped
// layers, conv.cu and conv_pool.cu LeNet's fused convolution and pooling,
// while a ResNet's convolutions go to cuDNN. So NewBackend compiles only
// the core unit (elementwise, reductions, losses, linear layers: what every
// run and the backend's own set-up launch) and starts the general unit
// (normalisation, softmax, gathers, random numbers, the optimisers) in the
// background, where it overlaps with the caller's data loading; the other
// units compile on the first use of one of their kernels. Units asked for
// together compile in parallel, each on its own thread (NVRTC compiles one
// program on one thread).
//
// A graph capture waits for the compiles in flight before it begins, so
// that no module is loaded while the stream records; a unit first needed
// inside a capture is compiled there on drivers from CUDA 12.4 on (which
// load modules during a capture; 12.2 refuses with "operation not
// permitted when stream is capturing"), and fails the capture on older
// ones with ErrLoadDuringCapture, so
// that the step runs eagerly, compiling the unit, and is captured next time.

// ErrLoadDuringCapture fails a capture whose work is the first use of a
// kernel unit on a driver older than CUDA 12.4, which cannot load a module
// while a stream is being captured. Run the work once eagerly (that
// compiles the unit), then capture it.
var ErrLoadDuringCapture = errors.New("cuda: a kernel unit is compiled on first use, which this driver cannot do during a graph capture")

// eagerUnits are compiled by NewBackend; prefetchUnits start in the
// background there. Indices into kernelUnits.
var (
	eagerUnits    = []int{0, 9}
	prefetchUnits = generalUnits
)

// captureLoadDriver is the first driver version that loads modules while a
// stream is being captured.
const captureLoadDriver = 12040

// unitLoad is one unit's compile, started once.
type unitLoad struct {
	started bool          // guarded by kernelLoader.mu
	done    chan struct{} // closed when mod or err is set
	mod     *Module
	err     error
	secs    float64 // compile (or cache load) and lookup
	from    string  // where the module came from (KernelUnit.From)
}

// kernelLoader compiles the backend's units on demand and registers their
// kernels with the backend.
type kernelLoader struct {
	b      *Backend
	mu     sync.Mutex
	units  []*unitLoad
	byName map[string][]int // the units whose sources define a kernel
	// load compiles unit i and registers its kernels, saying where the
	// module came from (compileUnit; a fake in the tests of the
	// scheduling).
	load func(i int) (*Module, string, error)
}

func newKernelLoader(b *Backend) (*kernelLoader, error) {
	l := &kernelLoader{b: b, byName: map[string][]int{}}
	l.load = l.compileUnit
	for i, u := range kernelUnits {
		l.units = append(l.units, &unitLoad{done: make(chan struct{})})
		for _, f := range u.files {
			if f == "kernels/common.cu" {
				continue // included by every unit; its kernels come with the core
			}
			data, err := kernelFS.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("cuda: embedded kernel source %s: %w", f, err)
			}
			for _, name := range kernelNames(string(data)) {
				l.byName[name] = append(l.byName[name], i)
			}
		}
	}
	return l, nil
}

// begin starts compiling unit i unless it has started.
func (l *kernelLoader) begin(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u := l.units[i]; !u.started {
		u.started = true
		go l.compile(i)
	}
}

// started reports whether unit i's compile has begun.
func (l *kernelLoader) started(i int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.units[i].started
}

func (l *kernelLoader) compile(i int) {
	u := l.units[i]
	defer close(u.done)
	t0 := time.Now()
	var err error
	if u.mod, u.from, err = l.load(i); err != nil {
		u.err = fmt.Errorf("cuda: compiling the backend's kernels (%s): %w", strings.Join(kernelUnits[i].files[1:], ", "), err)
		return
	}
	u.secs = time.Since(t0).Seconds()
	if w := l.b.opt.KernelLog; w != nil {
		fmt.Fprintf(w, "cuda: kernel unit %d (%s) ready in %.2f s: %s\n", i, unitName(i), u.secs, u.from)
	}
}

// compileUnit loads unit i from the kernel bundle or, where the bundle has
// no cubin of it for this GPU, compiles it (or reads it from the kernel
// cache); then it registers the module's kernels with the backend.
//
// The bundle's PTX (what a GPU newer than its cubins gets) is only the
// fallback when NVRTC fails or is missing: on the H200's 16-core host a
// cold LeNet start from PTX took 17.9 s of process time against 11.3 s
// through NVRTC, since the driver JIT-compiles one module at a time while
// the units compile with NVRTC side by side (docs/performance.md).
func (l *kernelLoader) compileUnit(i int) (*Module, string, error) {
	src, err := kernelUnits[i].source()
	if err != nil {
		return nil, "", err
	}
	opts := kernelUnits[i].options()
	var m *Module
	from := "compiled (or read from the kernel cache)"
	target, ptx := "", false
	if l.b.bundle != nil {
		if t, ok := l.b.bundle.TargetFor(l.b.dev.ComputeCapability()); ok {
			target, ptx = t, isPTXTarget(t)
		}
		// An entry without this GPU's cubin would load its PTX: compile
		// instead, keeping the PTX as the fallback, as for a newer GPU.
		major, minor := l.b.dev.ComputeCapability()
		if t, ok := l.b.bundle.UnitTarget(src, opts, major, minor); ok && !ptx && isPTXTarget(t) {
			target, ptx = t, true
		}
	}
	if target != "" && !ptx {
		m, err = l.b.dev.LoadBundled(l.b.bundle, src, opts...)
		if err == nil {
			from = fmt.Sprintf("from the kernel bundle (%s %v)", m.Arch, m.Kind)
		} else {
			// A stale unit, or an image the driver rejects: compile, as
			// without a bundle.
			from += ", not from the bundle: " + strings.TrimPrefix(err.Error(), "cuda: kernel bundle: ")
		}
	}
	if m == nil {
		var cerr error
		if m, cerr = l.b.dev.Compile(src, opts...); cerr != nil {
			if !ptx {
				return nil, "", cerr
			}
			if m, err = l.b.dev.LoadBundled(l.b.bundle, src, opts...); err != nil {
				return nil, "", errors.Join(cerr, err)
			}
			from = fmt.Sprintf("from the kernel bundle (%s %v, JIT-compiled by the driver) after NVRTC failed: %v", m.Arch, m.Kind, cerr)
		} else if ptx {
			from += fmt.Sprintf(", not from the bundle's %s PTX (the fallback where NVRTC fails)", target)
		}
	}
	if err := l.b.register(i, m); err != nil {
		m.Unload()
		return nil, "", err
	}
	return m, from, nil
}

// isPTXTarget says whether a bundle target is PTX (compute_XY) rather than
// a cubin (sm_XY).
func isPTXTarget(target string) bool { return strings.HasPrefix(target, "compute_") }

// wait starts the units and waits for all of them; the first error.
func (l *kernelLoader) wait(units ...int) error {
	for _, i := range units {
		l.begin(i)
	}
	var errs []error
	for _, i := range units {
		<-l.units[i].done
		errs = append(errs, l.units[i].err)
	}
	return errors.Join(errs...)
}

// settle waits for the units whose compile has started (before a capture,
// and in Close).
func (l *kernelLoader) settle() {
	for i, u := range l.units {
		if l.started(i) {
			<-u.done
		}
	}
}

// ready reports whether every unit of units has finished (well or not).
func (l *kernelLoader) ready(units []int) bool {
	for _, i := range units {
		select {
		case <-l.units[i].done:
		default:
			return false
		}
	}
	return true
}

// loadFor compiles the units that define the kernel name (none: a name no
// source defines, which the caller reports), panicking with the error of a
// failed compile as every device error does.
func (l *kernelLoader) loadFor(op, name string) {
	units := l.byName[name]
	if len(units) == 0 {
		return
	}
	if l.b.capturing.Load() && !l.ready(units) {
		if v, err := DriverVersion(); err == nil && v < captureLoadDriver {
			devCheck(op, fmt.Errorf("%w: kernel %s (this driver supports CUDA %d.%d)", ErrLoadDuringCapture, name, v/1000, v%1000/10))
		}
	}
	devCheck(op, l.wait(units...))
}

// modules are the units' loaded modules (after settle).
func (l *kernelLoader) modules() []*Module {
	var ms []*Module
	for i, u := range l.units {
		if !l.started(i) {
			continue
		}
		select {
		case <-u.done:
			if u.mod != nil {
				ms = append(ms, u.mod)
			}
		default:
		}
	}
	return ms
}

// KernelUnit describes the compile of one of the backend's kernel units.
type KernelUnit struct {
	Files   []string // its sources, common.cu left out
	Defines []string
	Loaded  bool    // compiled, read from the kernel cache or loaded from the bundle, and registered
	Seconds float64 // how long that took (ReadKernelStats says whether NVRTC ran)
	Bundled bool    // loaded from the kernel bundle (kernels_bundle.go)
	From    string  // where it came from, in words (with why the bundle was not used)
}

// KernelUnits says which of the backend's kernel units have been compiled so
// far and how long each took: a model compiles only the units it launches.
func (b *Backend) KernelUnits() []KernelUnit {
	if b.kl == nil {
		return nil
	}
	var out []KernelUnit
	for i, u := range b.kl.units {
		k := KernelUnit{Files: kernelUnits[i].files[1:], Defines: kernelUnits[i].defines}
		if !b.kl.started(i) {
			out = append(out, k)
			continue
		}
		select {
		case <-u.done:
			k.Loaded, k.Seconds = u.mod != nil && u.err == nil, u.secs
			k.From, k.Bundled = u.from, strings.HasPrefix(u.from, "from the kernel bundle")
		default:
		}
		out = append(out, k)
	}
	return out
}

// register looks up every kernel of unit i's module (those the driver
// lists, or each extern "C" name of its source where it cannot list them)
// and adds them to the backend's kernels by name.
func (b *Backend) register(i int, m *Module) error {
	fns, err := lookupKernels(kernelUnits[i:i+1], []*Module{m})
	if err != nil {
		return err
	}
	b.fnMu.Lock()
	defer b.fnMu.Unlock()
	if b.fns == nil {
		b.fns = map[string]*Function{}
	}
	for name, f := range fns {
		if _, dup := b.fns[name]; !dup {
			b.fns[name] = f
		}
	}
	return nil
}
