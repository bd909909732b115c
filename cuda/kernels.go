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
	"kernels/random.cu",
	"kernels/norm.cu",
	"kernels/pool.cu",
	"kernels/optim.cu",
	"kernels/xent.cu",
	"kernels/augment.cu",
	"kernels/cast.cu",
}

// kernelUnit is one translation unit: files concatenated in order, and
// preprocessor definitions.
type kernelUnit struct {
	files   []string
	defines []string
}

// kernelUnits compile into a module each, concurrently when several are
// needed at once (kernels_load.go says when): NVRTC
// compiles one program on one thread, and the register-tiled convolutions'
// unrolled templates are most of the work (one unit of everything took 9.0
// s cold on the H200's host). conv_rt.cu is compiled twice, for its 5x5 and
// its 3x3 kernels.
var kernelUnits = []kernelUnit{
	{files: []string{"kernels/common.cu", "kernels/elementwise.cu", "kernels/reduce.cu", "kernels/loss.cu", "kernels/linear.cu", "kernels/narrow.cu"}},
	{files: []string{"kernels/common.cu", "kernels/conv.cu", "kernels/conv_pool.cu"}},
	{files: []string{"kernels/common.cu", "kernels/conv_rt.cu"}, defines: []string{"-DEMBER_RT_SIZE=5"}},
	{files: []string{"kernels/common.cu", "kernels/conv_rt.cu"}, defines: []string{"-DEMBER_RT_SIZE=3"}},
	// The general operators of any model (strided elementwise, reductions
	// over an axis, gathers, random numbers, normalisation, pooling, the
	// optimisers, the augmented batch gather).
	{files: []string{"kernels/common.cu", "kernels/strided.cu", "kernels/reduce_axis.cu",
		"kernels/softmax.cu", "kernels/index.cu", "kernels/random.cu", "kernels/norm.cu", "kernels/pool.cu", "kernels/optim.cu", "kernels/xent.cu",
		"kernels/augment.cu", "kernels/cast.cu"}},
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

// kernels holds every kernel of the backend's module.
type kernels struct {
	add, mul, axpy, scale, scaleBy, broadcast *Function
	relu, reluBackward                        *Function
	addBias, biasGradCols                     *Function
	biasGradRows, biasGradFinish              *Function
	copyStridedU32, copyStridedU8             *Function
	gatherNormalize, sgd, sgd4                *Function
	sumPartial, sumFinal                      *Function
	im2col, col2im, swap01                    *Function
	maxPool, maxPoolBackward                  *Function
	maxPoolBackwardDisjoint                   *Function
	convReLUPoolDirect, swap01ReLUPool        *Function
	convReLUPoolTiled                         *Function
	convReLUPool5x5, convReLUPool3x3          [3]*Function // by channel split 1, 2, 4
	convPoolDW5x5, convPoolDW3x3              *Function
	gemmSmall, gemmSmallT                     *Function
	addBiasReLU, unpoolTBias                  *Function
	unpoolT, convPoolDWDirect, convPoolDWFin  *Function
	crossEntropy, argmax                      *Function
	convReLUPoolRT, convReLUPoolRT3           [3]*Function // 5x5 and 3x3, by lanes per sum 1, 4, 8
	convDWRT, convDXRT                        [4]*Function // 5x5, 3x3, pooled 5x5, pooled 3x3
	addParts, linearGradsSmall                *Function
	linearTiled, linearGradsTiled             *Function
	linearXent                                *Function
	linearGradsNarrow                         [2]*Function // by outputs <= 16, 32
	// Compiled for sm_90 and later only (thread block clusters); nil
	// elsewhere.
	linearTiledCluster, linearGradsTiledCluster *Function
}

// table lists each field with the extern "C" name of its kernel.
func (k *kernels) table() []struct {
	f    **Function
	name string
} {
	return []struct {
		f    **Function
		name string
	}{
		{&k.add, "ember_add"},
		{&k.mul, "ember_mul"},
		{&k.axpy, "ember_axpy"},
		{&k.scale, "ember_scale"},
		{&k.scaleBy, "ember_scale_by"},
		{&k.broadcast, "ember_broadcast"},
		{&k.relu, "ember_relu"},
		{&k.reluBackward, "ember_relu_backward"},
		{&k.addBias, "ember_add_bias"},
		{&k.biasGradCols, "ember_bias_grad_cols"},
		{&k.biasGradRows, "ember_bias_grad_rows"},
		{&k.biasGradFinish, "ember_bias_grad_finish"},
		{&k.copyStridedU32, "ember_copy_strided_u32"},
		{&k.copyStridedU8, "ember_copy_strided_u8"},
		{&k.gatherNormalize, "ember_gather_normalize"},
		{&k.sgd, "ember_sgd"},
		{&k.sgd4, "ember_sgd4"},
		{&k.sumPartial, "ember_sum_partial"},
		{&k.sumFinal, "ember_sum_final"},
		{&k.im2col, "ember_im2col"},
		{&k.col2im, "ember_col2im"},
		{&k.swap01, "ember_swap01"},
		{&k.maxPool, "ember_maxpool2d"},
		{&k.maxPoolBackward, "ember_maxpool2d_backward"},
		{&k.maxPoolBackwardDisjoint, "ember_maxpool2d_backward_disjoint"},
		{&k.convReLUPoolDirect, "ember_conv_relu_pool_direct"},
		{&k.convReLUPoolTiled, "ember_conv_relu_pool_tiled"},
		{&k.convReLUPool5x5[0], "ember_conv_relu_pool_5x5_2x2"},
		{&k.convReLUPool5x5[1], "ember_conv_relu_pool_5x5_2x2_c2"},
		{&k.convReLUPool5x5[2], "ember_conv_relu_pool_5x5_2x2_c4"},
		{&k.convReLUPool3x3[0], "ember_conv_relu_pool_3x3_2x2"},
		{&k.convReLUPool3x3[1], "ember_conv_relu_pool_3x3_2x2_c2"},
		{&k.convReLUPool3x3[2], "ember_conv_relu_pool_3x3_2x2_c4"},
		{&k.convPoolDW5x5, "ember_conv_pool_dw_5x5"},
		{&k.convPoolDW3x3, "ember_conv_pool_dw_3x3"},
		{&k.gemmSmall, "ember_gemm_small"},
		{&k.gemmSmallT, "ember_gemm_small_t"},
		{&k.addBiasReLU, "ember_add_bias_relu"},
		{&k.unpoolTBias, "ember_unpool_t_bias"},
		{&k.swap01ReLUPool, "ember_swap01_relu_pool"},
		{&k.unpoolT, "ember_unpool_t"},
		{&k.convPoolDWDirect, "ember_conv_pool_dw_direct"},
		{&k.convPoolDWFin, "ember_conv_pool_dw_finish"},
		{&k.crossEntropy, "ember_cross_entropy"},
		{&k.argmax, "ember_argmax"},
		{&k.convReLUPoolRT[0], "ember_conv_relu_pool_rt_5x5_s1"},
		{&k.convReLUPoolRT[1], "ember_conv_relu_pool_rt_5x5"},
		{&k.convReLUPoolRT[2], "ember_conv_relu_pool_rt_5x5_s8"},
		{&k.convReLUPoolRT3[0], "ember_conv_relu_pool_rt_3x3_s1"},
		{&k.convReLUPoolRT3[1], "ember_conv_relu_pool_rt_3x3"},
		{&k.convReLUPoolRT3[2], "ember_conv_relu_pool_rt_3x3_s8"},
		{&k.convDWRT[0], "ember_conv_dw_rt_5x5"},
		{&k.convDWRT[1], "ember_conv_dw_rt_3x3"},
		{&k.convDWRT[2], "ember_conv_dw_rt_pooled_5x5"},
		{&k.convDWRT[3], "ember_conv_dw_rt_pooled_3x3"},
		{&k.convDXRT[0], "ember_conv_dx_rt_5x5"},
		{&k.convDXRT[1], "ember_conv_dx_rt_3x3"},
		{&k.convDXRT[2], "ember_conv_dx_rt_pooled_5x5"},
		{&k.convDXRT[3], "ember_conv_dx_rt_pooled_3x3"},
		{&k.addParts, "ember_add_parts"},
		{&k.linearGradsSmall, "ember_linear_grads_small"},
		{&k.linearTiled, "ember_linear_tiled"},
		{&k.linearGradsTiled, "ember_linear_grads_tiled"},
		{&k.linearXent, "ember_linear_xent"},
		{&k.linearGradsNarrow[0], "ember_linear_grads_narrow_c16"},
		{&k.linearGradsNarrow[1], "ember_linear_grads_narrow_c32"},
		{&k.linearTiledCluster, "ember_linear_tiled_cluster"},
		{&k.linearGradsTiledCluster, "ember_linear_grads_tiled_cluster"},
	}
}

// sm90Kernels are compiled for sm_90 and later only: load leaves them nil
// elsewhere.
var sm90Kernels = map[string]bool{"ember_linear_tiled_cluster": true, "ember_linear_grads_tiled_cluster": true}

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

// load fills the fields of k from the kernels found by name.
func (k *kernels) load(fns map[string]*Function) error {
	for _, e := range k.table() {
		f, ok := fns[e.name]
		if !ok && !sm90Kernels[e.name] {
			return fmt.Errorf("cuda: kernel %s is in the table but in no kernel source", e.name)
		}
		*e.f = f
	}
	return nil
}
