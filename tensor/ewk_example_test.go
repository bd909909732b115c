package tensor_test

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// A fused x·sigmoid(y) + 1 over a row of y broadcast to every row of x,
// with the gradients Backward derives from the expression.
func ExampleFused() {
	x, y := tensor.Var("x"), tensor.Var("y")
	op, err := tensor.Fused(x.Mul(y.Sigmoid()).AddConst(1), "x", "y")
	if err != nil {
		panic(err)
	}
	fmt.Println("d/dy:", op.Gradient("y"))

	s := tensor.NewScope()
	defer s.Release()
	xt := tensor.FromFloat32(tensor.CPU, s, []float32{1, 2, 3, 4}, 2, 2).SetRequiresGrad(true)
	yt := tensor.FromFloat32(tensor.CPU, s, []float32{0, 0}, 2).SetRequiresGrad(true)
	out := op.Apply(xt, yt)
	tensor.Sum(out).Backward()
	fmt.Println("out:", out.Float32s())
	fmt.Println("dx:", xt.Grad().Float32s())
	fmt.Println("dy:", yt.Grad().Float32s())
	// Output:
	// d/dy: ((1 * x) * (sigmoid(y) * (1 - sigmoid(y))))
	// out: [1.5 2 2.5 3]
	// dx: [0.5 0.5 0.5 0.5]
	// dy: [1 1.5]
}
