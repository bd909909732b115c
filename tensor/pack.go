package tensor

import "fmt"

// Pack moves the given long-lived float32 tensors into one new allocation,
// in order, and returns the whole allocation as a flat tensor; each tensor
// keeps its identity and values but becomes a view of it. Parameters,
// gradients and momentum each packed this way let an optimiser update all of
// a model in one backend call.
func Pack(ts []*Tensor) *Tensor {
	if len(ts) == 0 {
		panic("tensor: Pack of no tensors")
	}
	b := ts[0].st.b
	total := 0
	for _, t := range ts {
		if t.st.b != b || t.DType() != Float32 || !t.IsContiguous() || t.node != nil {
			panic(fmt.Sprintf("tensor: Pack needs contiguous float32 leaves on one device; got %v", t))
		}
		total += t.Len()
	}
	flat := Empty(b, nil, total)
	off := 0
	for _, t := range ts {
		n := t.Len()
		b.Copy(flat.st.buf.Slice(off, n), t.buffer())
		old := t.st
		t.st, t.off, t.scope = flat.st, off, nil
		// Free the old storage once all of it has moved: a tensor packed
		// before (the same parameters packed again) shares it with its
		// neighbours until they move too.
		if old.moved += n; old != flat.st && old.moved >= old.buf.Len {
			old.release()
		}
		off += n
	}
	return flat
}
