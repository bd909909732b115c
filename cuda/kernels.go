package cuda

import (
	"embed"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The CUDA C sources of the backend's kernels, embedded in the binary and
// compiled as the translation units of kernelUnits, each when a Backend
// first needs it (kernels_load.go; cached on disk by KernelCache).
//
// No table lists the kernels: their extern "C" declarations are the only
// list. lookupKernels takes every kernel each module holds (as the driver
// enumerates them), and the operators ask for theirs by name
// (Backend.kernel); TestKernelNamesDefined checks, without a GPU, that
// every name the Go code uses is declared by a source and that every
// declared kernel is used.

//go:embed kernels/*.cu
var kernelFS embed.FS

// kernelFiles lists every source once, common.cu (what the others use)
// first.
var kernelFiles = []string{
	"kernels/common.cu",
	"kernels/elementwise.cu",
	"kernels/reduce.cu",
	"kernels/conv.cu",
	"kernels/conv_pool.cu",
	"kernels/conv_rt.cu",
	"kernels/loss.cu",
	"kernels/linear.cu",
	"kernels/narrow.cu",
	"kernels/strided.cu",
	"kernels/reduce_axis.cu",
	"kernels/softmax.cu",
	"kernels/index.cu",
	"kernels/philox.cu",
	"kernels/random.cu",
	"kernels/norm.cu",
	"kernels/channels_last.cu",
	"kernels/pool.cu",
	"kernels/optim.cu",
	"kernels/xent.cu",
	"kernels/augment.cu",
	"kernels/cast.cu",
	"kernels/attention.cu",
	"kernels/attention_bf16.cu",
}

// kernelUnit is one translation unit: files concatenated in order, and
// preprocessor definitions.
type kernelUnit struct {
	files   []string
	defines []string
}

// kernelUnits compile into a module each, concurrently when several are
// needed at once (kernels_load.go says when): NVRTC compiles one program
// on one thread, so the longest unit is a cold start's critical path
// where the kernel bundle (kernels_bundle.go) has no image of it. The
// register-tiled convolutions' unrolled templates and the strided
// elementwise kernels (instantiated per op code) are most of the work (one
// unit of everything took 9.0 s cold on the H200's host). conv_rt.cu is
// compiled twice, for its 5x5 and its 3x3 kernels. Indices are stable:
// new units go at the end.
//
// generalUnits are the units of the general operators of any model, which
// NewBackend starts compiling in the background, side by side (one unit of
// them all took 18.5 s cold on the H200's host); the gathers, casts and
// the augmented gather (unit 10) compile on first use.
var generalUnits = []int{4, 5, 6, 7}

var kernelUnits = []kernelUnit{
	// The core: LeNet's and every model's elementwise and whole-tensor
	// reductions (units 0 and 9 are compiled by NewBackend, in parallel).
	{files: []string{"kernels/common.cu", "kernels/elementwise.cu", "kernels/reduce.cu"}},
	{files: []string{"kernels/common.cu", "kernels/conv.cu", "kernels/conv_pool.cu"}},
	{files: []string{"kernels/common.cu", "kernels/conv_rt.cu"}, defines: []string{"-DEMBER_RT_SIZE=5"}},
	{files: []string{"kernels/common.cu", "kernels/conv_rt.cu"}, defines: []string{"-DEMBER_RT_SIZE=3"}},
	// The general operators: strided elementwise by op code (its own unit:
	// with the gathers and casts it was the longest, 7.55 s); reductions
	// over an axis, softmax and class losses; random numbers and the
	// optimisers; normalisation and pooling.
	{files: []string{"kernels/common.cu", "kernels/strided.cu"}},
	{files: []string{"kernels/common.cu", "kernels/reduce_axis.cu", "kernels/softmax.cu", "kernels/xent.cu"}},
	{files: []string{"kernels/common.cu", "kernels/philox.cu", "kernels/random.cu", "kernels/optim.cu"}},
	{files: []string{"kernels/common.cu", "kernels/norm.cu", "kernels/channels_last.cu", "kernels/pool.cu"}},
	// The fused attention, which draws Dropout's bits (philox.cu): its own
	// unit, compiled on first use.
	{files: []string{"kernels/common.cu", "kernels/philox.cu", "kernels/attention.cu", "kernels/attention_bf16.cu"}},
	// The linear layers and the fused losses of the core.
	{files: []string{"kernels/common.cu", "kernels/loss.cu", "kernels/linear.cu", "kernels/narrow.cu"}},
	// Gathers, bfloat16 casts and layouts, and the augmented gather (which
	// draws its crops and flips with philox.cu): compiled on first use.
	{files: []string{"kernels/common.cu", "kernels/index.cu", "kernels/cast.cu", "kernels/philox.cu", "kernels/augment.cu"}},
}

// kernelOptions are the NVRTC options of the backend's modules. --fmad=false
// keeps a*b+c as two rounded operations, as Go computes it on amd64, so that
// elementwise kernels reproduce the CPU backend exactly; the kernels are
// memory-bound, so fused multiply-adds would gain nothing measurable.
var kernelOptions = []string{"--fmad=false"}

// source returns the unit's source, with #line directives so that compiler
// messages name the original file and line.
func (u kernelUnit) source() (string, error) { return concatKernels(u.files) }

// options returns the unit's NVRTC options.
func (u kernelUnit) options() []string { return append(slices.Clone(kernelOptions), u.defines...) }

// kernelSource returns every source once, concatenated (where the tests
// read the kernels' signatures).
func kernelSource() (string, error) { return concatKernels(kernelFiles) }

func concatKernels(files []string) (string, error) {
	var b strings.Builder
	for _, name := range files {
		data, err := kernelFS.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("cuda: embedded kernel source %s: %w", name, err)
		}
		fmt.Fprintf(&b, "#line 1 \"%s\"\n", name)
		b.Write(data)
		if len(data) > 0 && data[len(data)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

// kernelNameRE finds the name of every extern "C" kernel in a source.
var kernelNameRE = regexp.MustCompile(`extern "C" __global__ void\s+(?:(?:__launch_bounds__|__cluster_dims__)\([^)]*\)\s*)*(\w+)\s*\(`)

// kernelNames lists the extern "C" kernels a source defines, in order.
func kernelNames(src string) []string {
	var names []string
	for _, m := range kernelNameRE.FindAllStringSubmatch(src, -1) {
		names = append(names, m[1])
	}
	return names
}

// lookupKernels finds every kernel of every unit of units in the unit's own
// module, mods[i] for units[i].
// Where the driver can list a module's kernels, exactly those are looked up
// (a unit compiled with other definitions, or for an older device, holds
// fewer than its source names); elsewhere each extern "C" name of the
// source is tried, and the ones the preprocessor left out are skipped.
func lookupKernels(units []kernelUnit, mods []*Module) (map[string]*Function, error) {
	fns := map[string]*Function{}
	for i, u := range units {
		names, err := mods[i].FunctionNames()
		listed := err == nil
		if errors.Is(err, errNoEnumeration) {
			src, serr := u.source()
			if serr != nil {
				return nil, serr
			}
			names, err = kernelNames(src), nil
		}
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if _, dup := fns[name]; dup {
				continue
			}
			f, err := mods[i].Function(name)
			var e *Error
			if !listed && errors.As(err, &e) && e.Name == "CUDA_ERROR_NOT_FOUND" {
				continue
			}
			if err != nil {
				return nil, err
			}
			fns[name] = f
		}
	}
	return fns, nil
}
