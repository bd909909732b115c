package tensor_test

import (
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestAddScalarInPlace: the tensor's own memory gains c, twice over two
// calls; a tensor in autograd is refused.
func TestAddScalarInPlace(t *testing.T) {
	x := tensor.FromFloat32(tensor.CPU, nil, []float32{1, -2, 0.5}, 3)
	buf := x.Buffer()
	tensor.AddScalarInPlace(x, 1)
	tensor.AddScalarInPlace(x, 0.25)
	if got, want := x.Float32s(), []float32{2.25, -0.75, 1.75}; !slices.Equal(got, want) {
		t.Errorf("x = %v, want %v", got, want)
	}
	if x.Buffer() != buf {
		t.Error("AddScalarInPlace gave x new memory")
	}
	w := tensor.FromFloat32(tensor.CPU, nil, []float32{1}, 1).SetRequiresGrad(true)
	defer func() {
		if recover() == nil {
			t.Error("AddScalarInPlace of a tensor that requires a gradient did not panic")
		}
	}()
	tensor.AddScalarInPlace(w, 1)
}
