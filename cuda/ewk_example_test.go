package cuda_test

import (
	"fmt"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// An axpy kernel from a C body, run on tensors of the CUDA backend (y is
// broadcast along the rows of x). Without a GPU it prints why and returns.
func ExampleNewElementwiseKernel() {
	b, err := cuda.NewBackend(0, cuda.BackendOptions{})
	if err != nil {
		fmt.Println("no GPU:", err)
		return
	}
	defer b.Close()
	axpy, err := cuda.NewElementwiseKernel(b, cuda.ElementwiseSpec{
		Name: "axpy", Inputs: "x, y", Outputs: "out", Params: "float a",
		Body: "out = a * x + y;",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(b, s, []float32{1, 2, 3, 4}, 2, 2)
	y := tensor.FromFloat32(b, s, []float32{10, 20}, 2)
	out := tensor.Empty(b, s, 2, 2)
	if err := axpy.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{x, y}, float32(2)); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.Float32s()) // [12 24 16 28]
}
