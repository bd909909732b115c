package tensor_test

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// A residual connection after a dropout, as a transformer block has: in
// training each element of x is dropped (r alone is left) or scaled by
// 1/(1-p) and added to r, in one pass where the backend has one; in
// evaluation it is r + x.
func ExampleDropoutAdd() {
	s := tensor.NewScope()
	defer s.Release()
	r := tensor.FromFloat32(tensor.CPU, s, []float32{1, 1, 1, 1, 1, 1}, 6)
	x := tensor.FromFloat32(tensor.CPU, s, []float32{10, 10, 10, 10, 10, 10}, 6)
	gen := tensor.NewGenerator(42)
	fmt.Println(tensor.DropoutAdd(r, x, 0.5, true, gen).Float32s())
	fmt.Println(tensor.DropoutAdd(r, x, 0.5, false, gen).Float32s())
	// Output:
	// [1 21 21 21 1 21]
	// [11 11 11 11 11 11]
}
