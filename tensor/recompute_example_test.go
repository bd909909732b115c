package tensor_test

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// A block of two products run through Recompute: the forward pass keeps
// its input and result, the backward pass runs it again, and the gradient
// is the plain block's.
func ExampleRecompute() {
	b := tensor.CPU
	w := tensor.FromFloat32(b, nil, []float32{0.5, -1, 2, 0.25}, 2, 2).SetRequiresGrad(true)
	defer w.Release()
	block := func(in ...*tensor.Tensor) *tensor.Tensor {
		return tensor.Linear(tensor.Tanh(tensor.Linear(in[0], w, nil)), w, nil)
	}
	for _, recompute := range []bool{false, true} {
		s := tensor.NewScope()
		x := tensor.FromFloat32(b, s, []float32{1, 2, 3, 4}, 2, 2)
		var y *tensor.Tensor
		if recompute {
			y = tensor.Recompute(block, x)
		} else {
			y = block(x)
		}
		tensor.Sum(y).Backward()
		fmt.Printf("recompute %v: dw %.4f\n", recompute, w.Grad().Float32s())
		w.ZeroGrad()
		s.Release()
	}
	w.Grad().Release()
	// Output:
	// recompute false: dw [-1.2406 3.1561 -1.9117 1.9467]
	// recompute true: dw [-1.2406 3.1561 -1.9117 1.9467]
}
