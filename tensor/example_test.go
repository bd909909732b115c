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

// A classifier's last layer and its loss in one call: on a backend that
// fuses them (the CUDA backend, up to 32 classes) the forward pass also
// forms the logits' and the input's gradients; on the CPU it is
// CrossEntropy(Linear(...)), with the same result. LinearCrossEntropySum
// also adds the loss into a running total.
func ExampleLinearCrossEntropy() {
	b := tensor.CPU
	step := tensor.NewScope()
	defer step.Release()
	x := tensor.FromFloat32(b, step, []float32{1, 0, 0, 1}, 2, 2) // two inputs
	w := tensor.FromFloat32(b, step, []float32{2, 0, 0, 2, 0, 0}, 3, 2).SetRequiresGrad(true)
	labels := tensor.FromInt32(b, step, []int32{0, 1}, 2)
	total := tensor.Zeros(b, step, 1)
	loss := tensor.LinearCrossEntropySum(x, w, nil, labels, total)
	loss.Backward()
	fmt.Printf("loss %.4f, total %.4f\n", loss.Item(), total.Item())
	fmt.Printf("dloss/dw row 2 %.4f\n", w.Grad().Float32s()[4:])
	// Output:
	// loss 0.2395, total 0.2395
	// dloss/dw row 2 [0.0533 0.0533]
}
