package tensor_test

import (
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestFunctionReleasesItsGradients: the gradients a Function's backward
// returns belong to it: passed into the inputs' gradients and released
// then (an unscoped one would leak otherwise), once when returned for two
// inputs; one that is g itself is left to Backward.
func TestFunctionReleasesItsGradients(t *testing.T) {
	a := tensor.FromFloat32(cpu, nil, []float32{1, 2}, 2).SetRequiresGrad(true)
	b := tensor.FromFloat32(cpu, nil, []float32{3, 4}, 2).SetRequiresGrad(true)
	defer a.Release()
	defer b.Release()
	s := tensor.NewScope()
	defer s.Release()
	var returned *tensor.Tensor
	y := tensor.Function("twice_sum", tensor.FromFloat32(cpu, s, []float32{4, 6}, 2), func(g *tensor.Tensor) []*tensor.Tensor {
		host := g.Float32s()
		for i := range host {
			host[i] *= 2
		}
		returned = tensor.FromFloat32(cpu, nil, host, 2) // unscoped: leaked unless released
		return []*tensor.Tensor{returned, returned}
	}, a, b)
	z := tensor.Function("identity", tensor.FromFloat32(cpu, s, []float32{4, 6}, 2), func(g *tensor.Tensor) []*tensor.Tensor {
		return []*tensor.Tensor{g}
	}, y)
	tensor.Sum(z).Backward()
	equalF32(t, "a's gradient", a.Grad().Float32s(), []float32{2, 2})
	equalF32(t, "b's gradient", b.Grad().Float32s(), []float32{2, 2})
	if !returned.Released() {
		t.Error("the gradient backward returned was not released")
	}
}
