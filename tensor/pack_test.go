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
	mustPanic(t, "Pack of a strided view", "Pack needs", func() {
		tensor.Pack([]*tensor.Tensor{tensor.FromFloat32(cpu, s, []float32{1, 2, 3, 4}, 2, 2).Transpose(0, 1)})
	})
}
