package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// stridedAttentionCases: the attention of strided views, as a transformer
// makes them. A fused attention reads such views in place (no copy), so
// on a GPU these check the kernels' strided reads and writes: q, k, v as
// [B, H, T, D] permutations of [B, T, H, D] tensors, and
// ScaledDotProductAttentionPacked's one [B, T, 3, H, D] projection, its
// [B, T, H, D] output and the one gradient of the projection. The output
// gradient of the packed attention reaches the kernels strided too (the
// dense [B, T, H, D] gradient read as [B, H, T, D]).
func stridedAttentionCases() []agCase {
	return []agCase{
		sdpaPermutedCase(1, 2, 9, 16, true, true),
		sdpaPermutedCase(2, 3, 19, 16, true, false),
		sdpaPermutedCase(2, 2, 70, 64, false, false),
		sdpaPackedCase(1, 2, 9, 16, true, 0, true),
		sdpaPackedCase(1, 2, 7, 16, false, 0.3, true),
		sdpaPackedCase(2, 3, 19, 16, true, 0, false),
		sdpaPackedCase(1, 2, 21, 16, false, 0.3, false),
		sdpaPackedCase(2, 2, 70, 32, true, 0, false),
		sdpaPackedCase(2, 3, 130, 64, true, 0, false),
		sdpaPackedCase(1, 2, 65, 64, true, 0.2, false),
	}
}

// bhtd is x [B, T, H, D] (at element offset off of rows of stride row)
// gathered into dense [B·H, T, D], the order sdpa64 takes.
func bhtd(x []float64, b, t, h, d, off, row int) []float64 {
	out := make([]float64, b*h*t*d)
	for bi := range b {
		for ti := range t {
			for hi := range h {
				for c := range d {
					out[((bi*h+hi)*t+ti)*d+c] = x[bi*t*row+ti*row+off+hi*d+c]
				}
			}
		}
	}
	return out
}

// scatterBTHD adds y [B·H, T, D] into x [B, T, H, D] laid out as bhtd reads it.
func scatterBTHD(x, y []float64, b, t, h, d, off, row int) {
	for bi := range b {
		for ti := range t {
			for hi := range h {
				for c := range d {
					x[bi*t*row+ti*row+off+hi*d+c] += y[((bi*h+hi)*t+ti)*d+c]
				}
			}
		}
	}
}

// attention64 is sdpa64 or sdpaBound64: the float64 attention of dense
// [bh, t, d] operands, or the magnitudes that bound its rounding errors.
type attention64 func(q, k, v, g, mask []float64, bh, t, s, d, dv int, causal bool, scale float64) (out, dq, dk, dv64 []float64)

// sdpaPermutedCase is ScaledDotProductAttention of q, k, v given as
// [B, T, H, D] tensors permuted to [B, H, T, D] (strided views).
func sdpaPermutedCase(b, h, t, d int, causal, fd bool) agCase {
	sc := 1 / math.Sqrt(float64(d))
	// eval is attention fn of the [B, T, H, D] operands x and the
	// [B, H, T, D] output gradient g: the output ([B, H, T, D]) and the
	// gradients of x, and the operands and gradients as fn takes and gives
	// them (dense [B·H, T, D]).
	eval := func(fn attention64, x [][]float32, g []float32) (out []float64, grads, ins, dense [][]float64) {
		for i := range 3 {
			ins = append(ins, bhtd(f64(x[i]), b, t, h, d, 0, h*d))
		}
		out, dq, dk, dv := fn(ins[0], ins[1], ins[2], f64(g), nil, b*h, t, t, d, d, causal, sc)
		dense = [][]float64{dq, dk, dv}
		for _, gi := range dense {
			grad := make([]float64, b*t*h*d)
			scatterBTHD(grad, gi, b, t, h, d, 0, h*d)
			grads = append(grads, grad)
		}
		return out, grads, ins, dense
	}
	return agCase{
		name:   fmt.Sprintf("ScaledDotProductAttention/permuted views B %d H %d T %d D %d causal %v", b, h, t, d, causal),
		inputs: []agInput{in(true, b, t, h, d), in(true, b, t, h, d), in(true, b, t, h, d)}, tol: tolAG,
		fwd: func(x []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.ScaledDotProductAttention(x[0].Permute(0, 2, 1, 3), x[1].Permute(0, 2, 1, 3), x[2].Permute(0, 2, 1, 3), causal, 0)
		},
		bound: func(x [][]float32, g []float32) ([]float64, [][]float64) {
			out, grads, _, _ := eval(sdpaBound64, x, g)
			return out, grads
		},
		ref: func(x [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			out, grads, ins, dense := eval(sdpa64, x, g)
			if fd {
				loss := func(q, k, v []float64) float64 {
					o, _, _, _ := sdpa64(q, k, v, f64(g), nil, b*h, t, t, d, d, causal, sc)
					return dot64(o, f64(g))
				}
				checkRefFD("permuted attention", ins, dense, loss)
			}
			return out, grads
		},
	}
}

// sdpaPackedCase is ScaledDotProductAttentionPacked of qkv [B, T, 3, H, D]
// with dropout p (a Generator of dropoutSeed) when p > 0.
func sdpaPackedCase(b, h, t, d int, causal bool, p float32, fd bool) agCase {
	name := fmt.Sprintf("ScaledDotProductAttentionPacked/B %d H %d T %d D %d causal %v", b, h, t, d, causal)
	if p > 0 {
		name += fmt.Sprintf(" dropout %g", p)
	}
	row := 3 * h * d
	sc := 1 / math.Sqrt(float64(d))
	var mask []float64
	if p > 0 {
		mask = refDropoutMask(dropoutSeed, b*h*t*t, p)
	}
	// eval is attention fn of the packed projection x and the [B, T, H, D]
	// output gradient g: the output and the projection's gradient in the
	// same layouts, and the operands, the output gradient and the
	// gradients as fn takes and gives them (dense [B·H, T, D]).
	eval := func(fn attention64, x [][]float32, g []float32) (out, grad []float64, ins [][]float64, g64 []float64, dense [][]float64) {
		x64 := f64(x[0])
		for i := range 3 {
			ins = append(ins, bhtd(x64, b, t, h, d, i*h*d, row))
		}
		g64 = bhtd(f64(g), b, t, h, d, 0, h*d)
		o, dq, dk, dv := fn(ins[0], ins[1], ins[2], g64, mask, b*h, t, t, d, d, causal, sc)
		out = make([]float64, b*t*h*d)
		scatterBTHD(out, o, b, t, h, d, 0, h*d)
		grad = make([]float64, len(x64))
		dense = [][]float64{dq, dk, dv}
		for i, gi := range dense {
			scatterBTHD(grad, gi, b, t, h, d, i*h*d, row)
		}
		return out, grad, ins, g64, dense
	}
	return agCase{
		name:   name,
		inputs: []agInput{in(true, b, t, 3, h, d)}, tol: tolAG,
		fwd: func(x []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			var gen tensor.RandomSource
			if p > 0 {
				gen = tensor.NewGenerator(dropoutSeed)
			}
			y := tensor.ScaledDotProductAttentionPacked(x[0], causal, 0, p, gen)
			if s := y.Shape(); len(s) != 4 || s[0] != b || s[1] != t || s[2] != h || s[3] != d {
				panic(fmt.Sprintf("ScaledDotProductAttentionPacked gave %v; want [%d %d %d %d]", s, b, t, h, d))
			}
			return y
		},
		bound: func(x [][]float32, g []float32) ([]float64, [][]float64) {
			out, grad, _, _, _ := eval(sdpaBound64, x, g)
			return out, [][]float64{grad}
		},
		ref: func(x [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			out, grad, ins, g64, dense := eval(sdpa64, x, g)
			if fd {
				loss := func(q, k, v []float64) float64 {
					o, _, _, _ := sdpa64(q, k, v, g64, mask, b*h, t, t, d, d, causal, sc)
					return dot64(o, g64)
				}
				checkRefFD("packed attention", ins, dense, loss)
			}
			return out, [][]float64{grad}
		},
	}
}

func dot64(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// checkRefFD panics unless the reference gradients of q, k, v match
// central differences of loss (float64, step 1e-6), as sdpaFullCase's.
func checkRefFD(what string, ins, grads [][]float64, loss func(q, k, v []float64) float64) {
	const h = 1e-6
	for w, in := range ins {
		for i := range in {
			x0 := in[i]
			in[i] = x0 + h
			up := loss(ins[0], ins[1], ins[2])
			in[i] = x0 - h
			down := loss(ins[0], ins[1], ins[2])
			in[i] = x0
			if fd := (up - down) / (2 * h); math.Abs(fd-grads[w][i]) > 1e-6*(1+math.Abs(fd)) {
				panic(fmt.Sprintf("%s reference: gradient %d of input %d is %g, finite differences %g", what, i, w, grads[w][i], fd))
			}
		}
	}
}
