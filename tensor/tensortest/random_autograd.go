package tensortest

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// dropoutSeed is the generator seed of the Dropout cases: the backend under
// test and the reference draw the same mask from it.
const dropoutSeed = 0x5eed_d80f

// refDropoutMask is the mask Dropout(p) draws for n elements from a fresh
// generator of seed: 1/(1-p) where the Bernoulli(1-p) draw is 1, else 0.
// The threshold is float32(1-p), as the tensor layer passes it.
func refDropoutMask(seed uint64, n int, p float32) []float64 {
	keep := refRandom(tensor.Bernoulli, seed, 0, n, 1-p, 0)
	for i := range keep {
		keep[i] /= 1 - float64(p)
	}
	return keep
}

// dropoutCase is Dropout(x, p, train) on x of shape (transposed first when
// transpose, so that the input is a strided view).
func dropoutCase(shape []int, p float32, train, transpose bool) agCase {
	name := fmt.Sprintf("Dropout/p=%g train=%v %v", p, train, shape)
	if transpose {
		name += " transposed"
	}
	outShape := append([]int(nil), shape...)
	if transpose {
		outShape[0], outShape[1] = outShape[1], outShape[0]
	}
	return agCase{
		// tolElem: one product, with the scale 1/(1-p) rounded to float32.
		name: name, inputs: []agInput{in(true, shape...)}, tol: tolElem,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			x := t[0]
			if transpose {
				x = x.Transpose(0, 1)
			}
			return tensor.Dropout(x, p, train, tensor.NewGenerator(dropoutSeed))
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			x := f64(v[0])
			if transpose {
				x = swapAxes(x, shape, 0, 1)
			}
			n := len(x)
			mask := make([]float64, n)
			switch {
			case !train || p == 0:
				for i := range mask {
					mask[i] = 1
				}
			case p < 1:
				mask = refDropoutMask(dropoutSeed, n, p)
			}
			out, dx := zeros64(n), zeros64(n)
			for i := range out {
				out[i] = x[i] * mask[i]
				dx[i] = float64(g[i]) * mask[i]
			}
			if transpose {
				dx = swapAxes(dx, outShape, 0, 1)
			}
			return out, [][]float64{dx}
		},
	}
}

// randomCases are the tensor-level cases of random numbers and dropout.
func randomCases() []agCase {
	return []agCase{
		dropoutCase([]int{7, 33}, 0.3, true, false),
		dropoutCase([]int{1000}, 0.5, true, false),
		dropoutCase([]int{5, 13}, 0.2, true, true),
		dropoutCase([]int{7, 33}, 0, true, false),
		dropoutCase([]int{7, 33}, 0.5, false, false),
		dropoutCase([]int{3, 11}, 1, true, false),
		generatorCase(false),
		generatorCase(true),
	}
}

// generatorCase checks that a Generator advances between draws: two draws
// of 7 values (two blocks each) from one generator equal one draw of the
// streams at offsets 0 and 2, and Rand, RandUniform, RandN and
// RandBernoulli map as tensor.Random does. The output is x times the draws
// side by side (x [36], so that the case has a gradient: dx = g·draws).
//
// With device set the draws come from a DeviceGenerator instead, whose
// offset lives (and advances) in device memory: the same numbers.
func generatorCase(device bool) agCase {
	const seed = 12345
	name := "Generator/Rand RandUniform RandN RandBernoulli"
	if device {
		name = "DeviceGenerator/Rand RandUniform RandN RandBernoulli"
	}
	return agCase{
		// Normal draws within 2 ulp (see testRandom); the rest are exact but
		// share the normwise test.
		name: name, inputs: []agInput{in(true, 36)}, tol: 2.4e-7,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			b, s := t[0].Backend(), t[0].Scope()
			var gen tensor.RandomSource
			offset := func() uint64 { return gen.(*tensor.Generator).Offset() }
			if device {
				dg := tensor.NewDeviceGenerator(b, seed)
				defer dg.Release()
				gen, offset = dg, func() uint64 { _, off := dg.SeedOffset(); return off }
			} else {
				gen = tensor.NewGenerator(seed)
			}
			parts := []*tensor.Tensor{
				tensor.Rand(b, s, gen, 7), tensor.Rand(b, s, gen, 7),
				tensor.RandUniform(b, s, gen, -3, 5, 9),
				tensor.RandN(b, s, gen, 8),
				tensor.RandBernoulli(b, s, gen, 0.4, 5),
			}
			if off := offset(); off != 2+2+3+2+2 {
				panic(fmt.Sprintf("generator offset %d after draws of 7, 7, 9, 8, 5; want 11", off))
			}
			var all []float32
			for _, p := range parts {
				all = append(all, p.Float32s()...)
			}
			return tensor.Mul(t[0], tensor.FromFloat32(b, s, all, len(all)))
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			var out []float64
			out = append(out, refRandom(tensor.Uniform, seed, 0, 7, 0, 1)...)
			out = append(out, refRandom(tensor.Uniform, seed, 2, 7, 0, 1)...)
			out = append(out, refRandom(tensor.Uniform, seed, 4, 9, -3, 5)...)
			out = append(out, refRandom(tensor.Normal, seed, 7, 8, 0, 1)...)
			out = append(out, refRandom(tensor.Bernoulli, seed, 9, 5, 0.4, 0)...)
			dx := make([]float64, len(out))
			for i, d := range out {
				out[i], dx[i] = float64(v[0][i])*d, float64(g[i])*d
			}
			return out, [][]float64{dx}
		},
	}
}
