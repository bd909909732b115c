//go:build opbench_all

package cuda

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Cases of TestGPUOpBench (opbench_test.go) whose operators come from the
// elementwise, reduction, normalisation and random branches; built with
// -tags opbench_all until those are merged.

func init() { opBenchExtra = append(opBenchExtra, extraOpCases()...) }

// normCase is BatchNorm or LayerNorm on x of dims with parameters of
// params elements (weight and bias, which take gradients): forward reads x
// and the parameters and writes y, backward reads x, the parameters and
// the output's gradient and writes the gradients of all three.
func normCase(op, shape string, dims []int, params int, f func(x, w, bias *tensor.Tensor) *tensor.Tensor, stats bool) opCase {
	n, p := float64(numelOf(dims))*f32Bytes, float64(params)*f32Bytes
	return opCase{op: op, shape: shape, fwdBytes: 2*n + 2*p, bwdBytes: 3*n + 3*p,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x := benchUniform(b, rng, true, dims...)
			pdims := dims[len(dims)-1:]
			if stats {
				pdims = dims[1:2]
			}
			w := tensor.Full(b, nil, 1, pdims...).SetRequiresGrad(true)
			bias := tensor.Zeros(b, nil, pdims...).SetRequiresGrad(true)
			return func(s *tensor.Scope) *tensor.Tensor {
				return f(s.Borrow(x), s.Borrow(w), s.Borrow(bias))
			}, []*tensor.Tensor{x, w, bias}
		}}
}

func batchNormCase(dims []int) opCase {
	c := dims[1]
	var mean, variance *tensor.Tensor // made by the first setup, freed with the inputs
	cs := normCase("BatchNorm", shapeName(dims)+" train", dims, c, func(x, w, bias *tensor.Tensor) *tensor.Tensor {
		return tensor.BatchNorm(x, w, bias, mean, variance, true, 0.1, 1e-5)
	}, true)
	setup := cs.setup
	cs.setup = func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
		call, in := setup(b, rng)
		mean, variance = tensor.Zeros(b, nil, c), tensor.Full(b, nil, 1, c)
		return call, append(in, mean, variance)
	}
	return cs
}

// reduceCase is SumAxes or MeanAxes of x of dims over axes: forward reads
// x and writes the reduced tensor, backward reads its gradient and writes
// x's.
func reduceCase(op string, dims, axes []int, f func(x *tensor.Tensor, axes []int, keepdim bool) *tensor.Tensor) opCase {
	kept := numelOf(dims)
	for _, a := range axes {
		kept /= dims[(a+len(dims))%len(dims)]
	}
	n, r := float64(numelOf(dims))*f32Bytes, float64(kept)*f32Bytes
	over := ""
	for i, a := range axes {
		if i > 0 {
			over += ","
		}
		over += fmt.Sprint(a)
	}
	return opCase{op: op, shape: shapeName(dims) + " over " + over, fwdBytes: n + r, bwdBytes: r + n,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x := benchUniform(b, rng, true, dims...)
			return func(s *tensor.Scope) *tensor.Tensor { return f(s.Borrow(x), axes, false) }, []*tensor.Tensor{x}
		}}
}

func extraOpCases() []opCase {
	rows := []int{gptRows, gptWidth}
	bias := []int{1, resnetAct[1], 1, 1}
	n := float64(numelOf(resnetAct)) * f32Bytes
	gen := tensor.NewGenerator(1)
	return []opCase{
		{op: "Add", shape: shapeName(resnetAct) + "+" + shapeName(bias),
			fwdBytes: 2*n + float64(resnetAct[1])*f32Bytes, bwdBytes: 2*n + float64(resnetAct[1])*f32Bytes,
			setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
				x, y := benchUniform(b, rng, true, resnetAct...), benchUniform(b, rng, true, bias...)
				return func(s *tensor.Scope) *tensor.Tensor { return tensor.Add(s.Borrow(x), s.Borrow(y)) }, []*tensor.Tensor{x, y}
			}},
		unaryCase("GELU", shapeName(gptMLP), gptMLP, 2, 3, func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, false) }),
		reduceCase("SumAxes", rows, []int{-1}, tensor.SumAxes),
		reduceCase("MeanAxes", rows, []int{-1}, tensor.MeanAxes),
		reduceCase("SumAxes", resnetAct, []int{0, 2, 3}, tensor.SumAxes),
		reduceCase("MeanAxes", resnetAct, []int{0, 2, 3}, tensor.MeanAxes),
		normCase("LayerNorm", shapeName(gptAct)+" over 384", gptAct, gptWidth, func(x, w, bias *tensor.Tensor) *tensor.Tensor {
			return tensor.LayerNorm(x, []int{gptWidth}, w, bias, 1e-5)
		}, false),
		batchNormCase(resnetAct),
		batchNormCase([]int{512, 128, 14, 14}),
		batchNormCase([]int{512, 256, 7, 7}),
		unaryCase("Dropout", shapeName(gptAct)+" p=0.2", gptAct, 2, 2, func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.Dropout(x, 0.2, true, gen)
		}),
	}
}
