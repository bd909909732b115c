// Package interop converts ember tensors to and from other Go array
// libraries: gorgonia.org/tensor's *Dense (and through it its .npy I/O).
// It is a package of its own so that programs that do not convert pull in
// none of those libraries' dependencies.
package interop

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"

	gt "gorgonia.org/tensor"
)

// Interoperation with gorgonia.org/tensor: a tensor copied to the host as a
// *gt.Dense and back. Both copy; neither shares memory.

// ToDense copies t to a new row-major *gt.Dense of the same shape: a
// float32 tensor (any shape, contiguous or a strided view) becomes a
// Float32 Dense; contiguous int32 and uint8 tensors become Int32 and Uint8
// ones. A tensor of shape [] becomes a gorgonia scalar.
func ToDense(t *tensor.Tensor) *gt.Dense {
	var data any
	var scalar any
	switch t.DType() {
	case tensor.Float32:
		d := t.Float32s()
		data, scalar = d, first(d)
	case tensor.Int32:
		d := t.Int32s()
		data, scalar = d, first(d)
	case tensor.Uint8:
		d := t.Uint8s()
		data, scalar = d, first(d)
	default:
		panic(fmt.Sprintf("interop: ToDense of a %v tensor", t.DType()))
	}
	if len(t.Shape()) == 0 {
		return gt.New(gt.FromScalar(scalar))
	}
	return gt.New(gt.WithShape(t.Shape()...), gt.WithBacking(data))
}

func first[T any](s []T) T {
	var z T
	if len(s) > 0 {
		z = s[0]
	}
	return z
}

// FromDense copies a float32 *gt.Dense into a new tensor of the same shape
// on b in scope s (nil for a long-lived tensor). It returns an error for
// another element type and for a Dense that is not laid out densely in
// row-major order (a transposed or strided view: Materialize it first, or a
// column-major or masked one).
func FromDense(b tensor.Backend, s *tensor.Scope, d *gt.Dense) (*tensor.Tensor, error) {
	if d == nil {
		return nil, fmt.Errorf("interop: FromDense of a nil Dense")
	}
	if d.Dtype() != gt.Float32 {
		return nil, fmt.Errorf("interop: FromDense of a %v Dense; only float32 is supported", d.Dtype())
	}
	if d.IsMasked() {
		return nil, fmt.Errorf("interop: FromDense of a masked Dense")
	}
	if d.IsScalar() {
		v, ok := d.Data().(float32)
		if !ok {
			return nil, fmt.Errorf("interop: FromDense: scalar Dense holds %T", d.Data())
		}
		return tensor.FromFloat32(b, s, []float32{v}), nil
	}
	shape := append([]int(nil), d.Shape()...)
	if d.DataOrder().IsColMajor() || d.RequiresIterator() || !rowMajor(shape, d.Strides()) {
		return nil, fmt.Errorf("interop: FromDense of a Dense of shape %v with strides %v that is not dense row-major; Materialize it first", shape, d.Strides())
	}
	data, ok := d.Data().([]float32)
	if !ok {
		return nil, fmt.Errorf("interop: FromDense: Dense data is %T", d.Data())
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if len(data) < n {
		return nil, fmt.Errorf("interop: FromDense: %d values for shape %v", len(data), shape)
	}
	return tensor.FromFloat32(b, s, data[:n], shape...), nil
}

// rowMajor reports whether strides are the dense row-major strides of shape
// (dimensions of size 1 may have any stride).
func rowMajor(shape, strides []int) bool {
	if len(strides) < len(shape) {
		return false
	}
	want := 1
	for i := len(shape) - 1; i >= 0; i-- {
		if shape[i] != 1 && strides[i] != want {
			return false
		}
		want *= shape[i]
	}
	return true
}
