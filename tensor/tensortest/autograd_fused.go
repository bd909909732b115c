package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Tensor-level cases of fused pointwise expressions (tensor.Fused): the
// forward and the symbolically derived backward against hand-written
// float64 references, themselves checked by finite differences
// (fdChecked). On a backend with tensor.FusedBackend (CUDA) each runs as
// one generated kernel forward and one backward; on others as composed
// operations.

var (
	fusedX, fusedY = tensor.Var("x"), tensor.Var("y")
	// x·y + sigmoid(x)
	fusedAxpySigmoid = tensor.MustFused(fusedX.Mul(fusedY).Add(fusedX.Sigmoid()), "x", "y")
	// GELU's tanh approximation of x + y (a bias added before the activation)
	fusedBiasGELU = func() *tensor.FusedOp {
		u := fusedX.Add(fusedY)
		inner := u.Add(u.Mul(u).Mul(u).Scale(0.044715)).Scale(geluK)
		return tensor.MustFused(u.Scale(0.5).Mul(inner.Tanh().AddConst(1)), "x", "y")
	}()
	// tanh(x)·exp(-y²) / (1 + x²)
	fusedRational = tensor.MustFused(fusedX.Tanh().Mul(fusedY.Square().Neg().Exp()).Div(fusedX.Square().AddConst(1)), "x", "y")
)

// geluK is √(2/π), rounded to float32 as the expression holds it.
const geluK = float32(0.7978845608028654)

func fusedAutogradCases() []agCase {
	sig := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	k := float64(geluK)
	c := float64(float32(0.044715))
	gelu := func(u float64) float64 { return 0.5 * u * (1 + math.Tanh(k*(u+c*u*u*u))) }
	dgelu := func(u float64) float64 {
		th := math.Tanh(k * (u + c*u*u*u))
		return 0.5*(1+th) + 0.5*u*(1-th*th)*k*(1+3*c*u*u)
	}
	cases := []agCase{
		binaryAG("Fused x*y+sigmoid(x) broadcast", []int{3, 5, 7}, []int{5, 1}, "normal",
			func(a, b *tensor.Tensor) *tensor.Tensor { return fusedAxpySigmoid.Apply(a, b) },
			func(x, y float64) float64 { return x*y + sig(x) },
			func(x, y float64) float64 { return y + sig(x)*(1-sig(x)) },
			func(x, y float64) float64 { return x }),
		binaryAG("Fused bias+GELU-tanh", []int{6, 9}, []int{9}, "normal",
			func(a, b *tensor.Tensor) *tensor.Tensor { return fusedBiasGELU.Apply(a, b) },
			func(x, y float64) float64 { return gelu(x + y) },
			func(x, y float64) float64 { return dgelu(x + y) },
			func(x, y float64) float64 { return dgelu(x + y) }),
		binaryAG("Fused tanh(x)exp(-y^2)/(1+x^2)", []int{4, 6}, []int{4, 6}, "normal",
			func(a, b *tensor.Tensor) *tensor.Tensor { return fusedRational.Apply(a, b) },
			func(x, y float64) float64 { return math.Tanh(x) * math.Exp(-y*y) / (1 + x*x) },
			func(x, y float64) float64 {
				th, d := math.Tanh(x), 1+x*x
				return math.Exp(-y*y) * ((1-th*th)*d - th*2*x) / (d * d)
			},
			func(x, y float64) float64 { return -2 * y * math.Tanh(x) * math.Exp(-y*y) / (1 + x*x) }),
	}
	for i := range cases {
		cases[i] = fdChecked(cases[i])
	}
	return cases
}
