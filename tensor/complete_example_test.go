package tensor_test

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// A backend that implements only tensor.Backend (here the CPU's core,
// behind tensortest.CoreOnly) runs every layer: Linear's bias and ReLU's
// mask are composed from the core's Binary and Unary, and Complete gives
// the same operations to code that works on buffers.
func ExampleComplete() {
	b := tensortest.CoreOnly(tensor.CPU)
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(b, s, []float32{1, 2, 3, 4}, 2, 2)
	w := tensor.FromFloat32(b, s, []float32{1, 0, 0, -1}, 2, 2)
	bias := tensor.FromFloat32(b, s, []float32{0.5, 1}, 2)
	fmt.Println(tensor.LinearReLU(x, w, bias).Float32s())

	y := tensor.FromFloat32(b, s, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	tensor.Complete(b).AddBias(y.Buffer(), tensor.FromFloat32(b, s, []float32{10, 20, 30}, 3).Buffer(), 2, 3, 1)
	fmt.Println(y.Float32s())
	// Output:
	// [1.5 0 3.5 0]
	// [11 22 33 14 25 36]
}
