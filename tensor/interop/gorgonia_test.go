package interop_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/interop"
	gt "gorgonia.org/tensor"
)

var cpu = tensor.CPU

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ToDense then FromDense gives back the same shape and values, for scalars,
// vectors, matrices and 4-D tensors.
func TestDenseRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	s := tensor.NewScope()
	defer s.Release()
	for _, shape := range [][]int{{}, {1}, {7}, {3, 4}, {1, 1, 1}, {2, 3, 4, 5}, {64, 1, 28, 28}} {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64())
		}
		x := tensor.FromFloat32(cpu, s, data, shape...)
		d := interop.ToDense(x)
		if d.Dtype() != gt.Float32 {
			t.Fatalf("%v: Dense dtype %v", shape, d.Dtype())
		}
		if len(shape) == 0 {
			if !d.IsScalar() || d.ScalarValue().(float32) != data[0] {
				t.Fatalf("scalar: Dense %v (scalar %v), want %v", d, d.IsScalar(), data[0])
			}
		} else {
			if !sameInts(d.Shape(), shape) {
				t.Fatalf("%v: Dense shape %v", shape, d.Shape())
			}
			// Check values through gorgonia's own indexing.
			idx := make([]int, len(shape))
			for i := 0; i < n; i++ {
				v, err := d.At(idx...)
				if err != nil {
					t.Fatal(err)
				}
				if v.(float32) != data[i] {
					t.Fatalf("%v: Dense.At(%v) = %v, want %v", shape, idx, v, data[i])
				}
				for k := len(idx) - 1; k >= 0; k-- {
					if idx[k]++; idx[k] < shape[k] {
						break
					}
					idx[k] = 0
				}
			}
		}
		y, err := interop.FromDense(cpu, s, d)
		if err != nil {
			t.Fatalf("%v: FromDense: %v", shape, err)
		}
		if !sameInts(y.Shape(), shape) || y.Scope() != s {
			t.Fatalf("%v: round trip gives shape %v, scope %p", shape, y.Shape(), y.Scope())
		}
		equalF32(t, "round trip", y.Float32s(), data)
		// The copies are independent.
		data[0] = 42
		if y.Float32s()[0] == 42 {
			t.Fatalf("FromDense shares memory with the Dense")
		}
	}
}

// ToDense of a strided view is the view's values in row-major order; int32
// tensors convert too.
func TestToDenseViewAndInt(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(cpu, s, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	d := interop.ToDense(x.Transpose(0, 1))
	if !sameInts(d.Shape(), []int{3, 2}) {
		t.Fatalf("shape %v", d.Shape())
	}
	equalF32(t, "transposed view", d.Data().([]float32), []float32{1, 4, 2, 5, 3, 6})
	di := interop.ToDense(tensor.FromInt32(cpu, s, []int32{3, -1, 7}, 3))
	if di.Dtype() != gt.Int32 || di.Data().([]int32)[1] != -1 {
		t.Fatalf("int32: %v %v", di.Dtype(), di)
	}
}

// FromDense refuses other element types and non-row-major layouts, and
// accepts a contiguous slice.
func TestFromDenseErrors(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	f64 := gt.New(gt.WithShape(2, 2), gt.WithBacking([]float64{1, 2, 3, 4}))
	if _, err := interop.FromDense(cpu, s, f64); err == nil {
		t.Errorf("FromDense of a float64 Dense: no error")
	}
	i32 := gt.New(gt.WithShape(3), gt.WithBacking([]int32{1, 2, 3}))
	if _, err := interop.FromDense(cpu, s, i32); err == nil {
		t.Errorf("FromDense of an int32 Dense: no error")
	}
	if _, err := interop.FromDense(cpu, s, nil); err == nil {
		t.Errorf("FromDense of nil: no error")
	}

	m := gt.New(gt.WithShape(3, 4), gt.WithBacking([]float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}))
	tr := m.Clone().(*gt.Dense)
	if err := tr.T(); err != nil {
		t.Fatal(err)
	}
	if _, err := interop.FromDense(cpu, s, tr); err == nil {
		t.Errorf("FromDense of a transposed Dense: no error")
	}
	col, err := m.Slice(nil, gt.S(1)) // column 1: strided
	if err != nil {
		t.Fatal(err)
	}
	if _, err := interop.FromDense(cpu, s, col.(*gt.Dense)); err == nil {
		t.Errorf("FromDense of a column view: no error")
	}
	// Once materialised, the transpose converts.
	if err := tr.Transpose(); err != nil {
		t.Fatal(err)
	}
	y, err := interop.FromDense(cpu, s, tr)
	if err != nil {
		t.Fatalf("FromDense of a materialised transpose: %v", err)
	}
	if !sameInts(y.Shape(), []int{4, 3}) {
		t.Fatalf("shape %v", y.Shape())
	}
	equalF32(t, "materialised transpose", y.Float32s(), []float32{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11})
	rows, err := m.Slice(gt.S(1, 3)) // rows 1-2: contiguous
	if err != nil {
		t.Fatal(err)
	}
	z, err := interop.FromDense(cpu, s, rows.(*gt.Dense))
	if err != nil {
		t.Fatalf("FromDense of a contiguous row slice: %v", err)
	}
	equalF32(t, "row slice", z.Float32s(), []float32{4, 5, 6, 7, 8, 9, 10, 11})
}

func equalF32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d is %v, want %v (all: %v)", what, i, got[i], want[i], got)
		}
	}
}
