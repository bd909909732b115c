package tensor

import "fmt"

// Pack moves the given long-lived tensors (of one dtype) into one new
// allocation, in order, and returns the whole allocation as a flat tensor;
// each tensor keeps its identity and values but becomes a view of it.
// Parameters, gradients and momentum each packed this way let an optimiser
// update all of a model in one backend call; a batch's indices and labels
// packed together take one upload.
func Pack(ts []*Tensor) *Tensor {
	if len(ts) == 0 {
		panic("tensor: Pack of no tensors")
	}
	b, dt := ts[0].st.b, ts[0].DType()
	total := 0
	for _, t := range ts {
		if t.st.b != b || t.DType() != dt || !t.IsContiguous() || t.node != nil {
			panic(fmt.Sprintf("tensor: Pack needs contiguous leaves of one dtype on one device; got %v", t))
		}
		total += t.Len()
	}
	flat := EmptyOf(b, nil, dt, total)
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
