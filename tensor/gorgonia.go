package tensor

import (
	"fmt"

	gt "gorgonia.org/tensor"
)

// Interoperation with gorgonia.org/tensor: a tensor copied to the host as a
// *gt.Dense and back. Both copy; neither shares memory.

// ToDense copies t to a new row-major *gt.Dense of the same shape: a
// float32 tensor (any shape, contiguous or a strided view) becomes a
// Float32 Dense; contiguous int32 and uint8 tensors become Int32 and Uint8
// ones. A tensor of shape [] becomes a gorgonia scalar.
func ToDense(t *Tensor) *gt.Dense {
	var data any
	var scalar any
	switch t.DType() {
	case Float32:
		d := t.Float32s()
		data, scalar = d, first(d)
	case Int32:
		d := make([]int32, t.Len())
		t.st.b.Download(d, t.buffer())
		data, scalar = d, first(d)
	case Uint8:
		d := make([]uint8, t.Len())
		t.st.b.Download(d, t.buffer())
		data, scalar = d, first(d)
	default:
		panic(fmt.Sprintf("tensor: ToDense of a %v tensor", t.DType()))
	}
	if len(t.shape) == 0 {
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
func FromDense(b Backend, s *Scope, d *gt.Dense) (*Tensor, error) {
	if d == nil {
		return nil, fmt.Errorf("tensor: FromDense of a nil Dense")
	}
	if d.Dtype() != gt.Float32 {
		return nil, fmt.Errorf("tensor: FromDense of a %v Dense; only float32 is supported", d.Dtype())
	}
	if d.IsMasked() {
		return nil, fmt.Errorf("tensor: FromDense of a masked Dense")
	}
	if d.IsScalar() {
		v, ok := d.Data().(float32)
		if !ok {
			return nil, fmt.Errorf("tensor: FromDense: scalar Dense holds %T", d.Data())
		}
		return FromFloat32(b, s, []float32{v}), nil
	}
	shape := append([]int(nil), d.Shape()...)
	if d.DataOrder().IsColMajor() || d.RequiresIterator() || !rowMajor(shape, d.Strides()) {
		return nil, fmt.Errorf("tensor: FromDense of a Dense of shape %v with strides %v that is not dense row-major; Materialize it first", shape, d.Strides())
	}
	data, ok := d.Data().([]float32)
	if !ok {
		return nil, fmt.Errorf("tensor: FromDense: Dense data is %T", d.Data())
	}
	n := numel(shape)
	if len(data) < n {
		return nil, fmt.Errorf("tensor: FromDense: %d values for shape %v", len(data), shape)
	}
	return FromFloat32(b, s, data[:n], shape...), nil
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
