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

// A convolution, its bias, ReLU and 2×2 max pooling in one call: on a
// backend that fuses them (the CUDA backend) only the pooled output is
// stored; on the CPU they run one after the other, with the same result.
func ExampleConv2dReLUMaxPool() {
	b := tensor.CPU
	step := tensor.NewScope()
	defer step.Release()
	x := tensor.FromFloat32(b, step, []float32{
		1, 2, 0, 1,
		3, -4, 1, 0,
		0, 1, -2, 5,
		2, 0, 1, 1,
	}, 1, 1, 4, 4) // one 4×4 image
	w := tensor.FromFloat32(b, step, []float32{1}, 1, 1, 1, 1) // 1×1 kernel: identity
	bias := tensor.FromFloat32(b, step, []float32{-1.5}, 1)
	y := tensor.Conv2dReLUMaxPool(x, w, bias, 1, 0, 2)
	fmt.Println(y.Shape(), y.Float32s())
	// Output:
	// [1 1 2 2] [1.5 0 0.5 3.5]
}
