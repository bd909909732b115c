package tensortest

import "github.com/ember-ml/ember/tensor"

// tolAutocast is the normwise tolerance of the autocast products and
// convolutions against the float32 computation (the float64 reference of
// the unrounded inputs). A bfloat16 rounding errs by at most u = 2⁻⁹ ≈
// 2e-3 relative; an output element of a product of two rounded operands
// errs by at most 2u of Σ|a·b|, a gradient by 3u (the incoming gradient is
// rounded too), and with these cases' few-term dot products of normal
// values Σ|a·b| stays within a small multiple of the largest output. The
// worst normwise errors measured over 200 seeds on the CPU were 9e-3 for
// the products and under 1.2e-2 for the convolutions (whose results are
// rounded as well); 3e-2 leaves room for the tail.
const tolAutocast = 3e-2

// tolAutocastAttention is the elementwise tolerance of the autocast
// attention against the magnitudes of sdpaBound64, which bound its
// first-order rounding error by about 4u (u = 2⁻⁹): 1e-2 is 5u. A normwise
// test does not hold there: the softmax gradient cancels, and while the
// worst of 1000 seeds erred by 1.6e-2 of the largest gradient, a random
// seed reached 3.1e-2. Against the bound the worst of the 1000 seeds on
// the CPU was 3.6e-3 (float32 attention: 1.2e-7).
const tolAutocastAttention = 1e-2

// autocastCases: the matrix products, attention and convolutions under
// SetAutocast(BFloat16). Loose cases compare them with float32 (the plain
// cases' float64 references) within tolAutocast, or within
// tolAutocastAttention of their rounding bound; exact-semantics cases
// compare them, at the float32 tolerance tolAG, with float64 products of
// the bfloat16-rounded operands and incoming gradients, which only a
// product that really rounds to bfloat16 can meet (a float32 product
// missed by 7e-3 to 8e-3 at worst over 200 seeds).
func autocastCases() []agCase {
	loose := []agCase{
		linearNDCase("Linear/[2, 3, in]", []int{2, 3, 4}),
		bmmCase("BatchMatMul/equal batches", []int{2, 3, 4, 5}, []int{2, 3, 5, 6}, nil, nil),
		bmmCase("BatchMatMul/transposed views", []int{3, 5, 4}, []int{3, 6, 5}, []int{1, 2}, []int{1, 2}),
		// A convolution's output and input and weight gradients are
		// rounded to bfloat16 as well (tensor.LowPrecisionConvBackend).
		convCase("Conv2d/stride 2 pad 1", []int{2, 3, 9, 7}, []int{4, 3, 3, 3}, true, 2, 1),
		convCase("Conv2d/stride 1 pad 0 no bias", []int{2, 2, 8, 6}, []int{3, 2, 3, 3}, false, 1, 0),
	}
	attention := []agCase{
		sdpaCase(false, 0),
		sdpaCase(true, 0.7),
		// D = 64: a GPU's tensor-core attention (the shape, with dropout
		// from the device, of attentionCases' float32 one).
		sdpaFullCase([]int{1, 2}, 130, 130, 64, 64, true, 0, 0.2, true, false),
		// ... and its strided reads and writes: a transformer's packed
		// projection, and permuted views.
		sdpaPackedCase(2, 3, 130, 64, true, 0.2, false),
		sdpaPermutedCase(2, 2, 70, 64, true, false),
	}
	var out []agCase
	for _, c := range loose {
		out = append(out, autocast(c, tolAutocast))
	}
	for _, c := range attention {
		out = append(out, autocast(c, tolAutocastAttention))
	}
	for _, op := range []tensor.UnaryOp{tensor.OpGELU, tensor.OpSiLU} {
		out = append(out, autocast(activationLinearCase(op), tolAutocast))
	}
	return append(out, autocast(linearRoundedCase(), tolAG), autocast(bmmRoundedCase(), tolAG))
}

// activationLinearCase is ActivationLinear(op, x [2, 3, 5], w [4, 5], b)
// against the float64 activation and linear layer: under autocast the
// activation writes the product's bfloat16 operand (and the backward pass
// makes it again), so it is loose as the products are.
func activationLinearCase(op tensor.UnaryOp) agCase {
	const rows, inF, outF = 6, 5, 4
	var uc unaryCase
	for _, c := range unaryCases {
		if c.op == op {
			uc = c
		}
	}
	return agCase{
		name:   "ActivationLinear/" + uc.name,
		inputs: []agInput{in(true, 2, 3, inF), in(true, outF, inF), in(true, outF)},
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.ActivationLinear(op, t[0], t[1], t[2])
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			h := make([]float64, len(v[0]))
			for i, x := range v[0] {
				h[i] = uc.f(float64(x), 0, 0)
			}
			w := f64(v[1])
			dh, dw, db := linearGrads64(f64(g), h, w, rows, inF, outF)
			for i, x := range v[0] {
				dh[i] *= uc.df(float64(x), 0, 0)
			}
			return linear64(h, w, f64(v[2]), rows, inF, outF), [][]float64{dh, dw, db}
		},
	}
}

// autocast is case c run with autocast to bfloat16 on its inputs' scope.
func autocast(c agCase, tol float64) agCase {
	fwd := c.fwd
	c.name = "Autocast/" + c.name
	c.tol = tol
	c.skip = func(b tensor.Backend) string {
		if _, ok := b.(tensor.LowPrecisionBackend); !ok {
			return "backend " + b.Name() + " has no LowPrecisionBackend"
		}
		return ""
	}
	c.fwd = func(in []*tensor.Tensor, labels *tensor.Tensor) *tensor.Tensor {
		in[0].Scope().SetAutocast(tensor.BFloat16)
		return fwd(in, labels)
	}
	return c
}

// linearRoundedCase is Linear of x [6, 5] with w [4, 5] and a bias; its
// reference rounds x, w and the output gradient to bfloat16 for the
// products (the bias and its gradient stay float32).
func linearRoundedCase() agCase {
	const rows, inF, outF = 6, 5, 4
	return agCase{
		name:   "Linear/rounded operands",
		inputs: []agInput{in(true, rows, inF), in(true, outF, inF), in(true, outF)},
		fwd:    func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Linear(t[0], t[1], t[2]) },
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			x, w := f64(roundedBF16(v[0])), f64(roundedBF16(v[1]))
			dx, dw, _ := linearGrads64(f64(roundedBF16(g)), x, w, rows, inF, outF)
			_, _, db := linearGrads64(f64(g), x, w, rows, inF, outF)
			return linear64(x, w, f64(v[2]), rows, inF, outF), [][]float64{dx, dw, db}
		},
	}
}

// bmmRoundedCase is BatchMatMul of a [3, 4, 5] and b [3, 5, 6], its
// reference on the bfloat16-rounded operands and output gradient.
func bmmRoundedCase() agCase {
	as, bs := []int{3, 4, 5}, []int{3, 5, 6}
	return agCase{
		name:   "BatchMatMul/rounded operands",
		inputs: []agInput{in(true, as...), in(true, bs...)},
		fwd:    func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.BatchMatMul(t[0], t[1]) },
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			out, da, db := refBatchMatMul(f64(roundedBF16(v[0])), f64(roundedBF16(v[1])), as, bs, roundedBF16(g))
			return out, [][]float64{da, db}
		},
	}
}
