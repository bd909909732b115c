package tensor_test

import (
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Pack moves tensors into one allocation, keeping their identity and
// values, and frees the storages they leave.
func TestPack(t *testing.T) {
	a := tensor.FromFloat32(cpu, nil, []float32{1, 2, 3, 4}, 2, 2)
	b := tensor.FromFloat32(cpu, nil, []float32{5}, 1)
	c := tensor.FromFloat32(cpu, nil, []float32{6, 7, 8}, 3)
	oldA := a.Reshape(4) // a view sharing a's old storage
	flat := tensor.Pack([]*tensor.Tensor{a, b, c})
	defer flat.Release()
	equalF32(t, "flat", flat.Float32s(), []float32{1, 2, 3, 4, 5, 6, 7, 8})
	equalF32(t, "a", a.Float32s(), []float32{1, 2, 3, 4})
	equalF32(t, "c", c.Float32s(), []float32{6, 7, 8})
	if !oldA.Released() {
		t.Errorf("the storage a left is not freed")
	}
	// a is now a view of flat: writes through it show in flat.
	c.CopyFrom([]float32{9, 9, 9})
	equalF32(t, "flat after a write to c", flat.Float32s(), []float32{1, 2, 3, 4, 5, 9, 9, 9})

	// Packing some of them again (a new optimiser on the same parameters)
	// must not free the first flat buffer while b still uses it.
	flat2 := tensor.Pack([]*tensor.Tensor{c, a})
	defer flat2.Release()
	equalF32(t, "flat2", flat2.Float32s(), []float32{9, 9, 9, 1, 2, 3, 4})
	if flat.Released() || b.Released() {
		t.Fatalf("re-packing a and c freed the buffer that b still uses")
	}
	equalF32(t, "b after re-packing its neighbours", b.Float32s(), []float32{5})
	// Once b moves as well, the first flat buffer is entirely vacated and
	// freed.
	flat3 := tensor.Pack([]*tensor.Tensor{b})
	defer flat3.Release()
	if !flat.Released() {
		t.Errorf("the vacated first flat buffer is not freed")
	}
	equalF32(t, "b", b.Float32s(), []float32{5})

	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(cpu, s, []float32{1, 2}, 2).SetRequiresGrad(true)
	mustPanic(t, "Pack of a computed tensor", "Pack needs", func() { tensor.Pack([]*tensor.Tensor{tensor.Mul(x, x)}) })
	mustPanic(t, "Pack of nothing", "no tensors", func() { tensor.Pack(nil) })
	mustPanic(t, "Pack of two dtypes", "one dtype", func() {
		tensor.Pack([]*tensor.Tensor{tensor.FromFloat32(cpu, s, []float32{1}, 1), tensor.FromInt32(cpu, s, []int32{1}, 1)})
	})
	mustPanic(t, "Pack of a strided view", "Pack needs", func() {
		tensor.Pack([]*tensor.Tensor{tensor.FromFloat32(cpu, s, []float32{1, 2, 3, 4}, 2, 2).Transpose(0, 1)})
	})
}

// Int32 tensors pack too (a batch's indices and labels, uploaded at once).
func TestPackInt32(t *testing.T) {
	idx := tensor.FromInt32(cpu, nil, []int32{3, 1, 2}, 3)
	labels := tensor.FromInt32(cpu, nil, []int32{7, 8, 9}, 3)
	flat := tensor.Pack([]*tensor.Tensor{idx, labels})
	defer flat.Release()
	cpu.Upload(flat.Buffer(), []int32{4, 5, 6, 0, 1, 2})
	if got := idx.Int32s(); got[0] != 4 || got[1] != 5 || got[2] != 6 {
		t.Errorf("idx after one upload to the packed buffer: %v, want [4 5 6]", got)
	}
	if got := labels.Int32s(); got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Errorf("labels after one upload to the packed buffer: %v, want [0 1 2]", got)
	}
}
