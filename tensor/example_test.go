package tensor_test

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// A scalar function of a parameter, its gradient by Backward, and the step's
// memory freed by its scope.
func Example() {
	b := tensor.CPU
	w := tensor.FromFloat32(b, nil, []float32{1, 2, 3}, 3).SetRequiresGrad(true)

	step := tensor.NewScope()
	x := tensor.FromFloat32(b, step, []float32{4, 5, 6}, 3)
	loss := tensor.Sum(tensor.Mul(w, x)) // w·x
	loss.Backward()
	fmt.Println("loss", loss.Item())
	fmt.Println("dloss/dw", w.Grad().Float32s())
	step.Release()
	// Output:
	// loss 32
	// dloss/dw [4 5 6]
}
