package tensor

import "fmt"

// view returns a header over t's storage with another shape and strides.
func (t *Tensor) view(off int, shape, strides []int) *Tensor {
	return &Tensor{st: t.st, off: off, shape: shape, strides: strides, scope: t.scope}
}

// Reshape returns a view with a new shape of the same number of elements;
// one dimension may be -1 and is then inferred. t must be contiguous.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	shape = append([]int(nil), shape...)
	infer, known := -1, 1
	for i, d := range shape {
		if d == -1 {
			if infer >= 0 {
				panic(fmt.Sprintf("tensor: Reshape %v: more than one -1", shape))
			}
			infer = i
			continue
		}
		known *= d
	}
	if infer >= 0 {
		if known == 0 || t.Len()%known != 0 {
			panic(fmt.Sprintf("tensor: cannot reshape %v to %v", t.shape, shape))
		}
		shape[infer] = t.Len() / known
	}
	if numel(shape) != t.Len() {
		panic(fmt.Sprintf("tensor: cannot reshape %v (%d elements) to %v", t.shape, t.Len(), shape))
	}
	if !t.IsContiguous() {
		panic("tensor: Reshape of a strided view; call Contiguous first")
	}
	out := t.view(t.off, shape, contiguousStrides(shape))
	in := t
	record(out, "reshape", func(g *Tensor, e *engine) {
		// The gradient is the same memory seen with the input's shape.
		e.give(in, g.view(g.off, in.Shape(), contiguousStrides(in.shape)))
	}, in)
	return out
}

// Flatten keeps the first dimension and folds the rest into one, as
// nn.Flatten does for a batch.
func (t *Tensor) Flatten() *Tensor { return t.Reshape(t.shape[0], -1) }

// Transpose returns a strided view with dimensions i and j swapped.
func (t *Tensor) Transpose(i, j int) *Tensor {
	shape, strides := t.Shape(), t.Strides()
	shape[i], shape[j] = shape[j], shape[i]
	strides[i], strides[j] = strides[j], strides[i]
	out := t.view(t.off, shape, strides)
	in := t
	record(out, "transpose", func(g *Tensor, e *engine) {
		e.pass(in, g.Detach().Transpose(i, j))
	}, in)
	return out
}

// Contiguous returns t when it is dense, else a dense copy.
func (t *Tensor) Contiguous() *Tensor {
	if t.IsContiguous() {
		return t
	}
	out := t.copyDense(t.scope)
	in := t
	record(out, "contiguous", func(g *Tensor, e *engine) { e.pass(in, g) }, in)
	return out
}

// copyDense copies a (possibly strided) tensor into new dense memory.
func (t *Tensor) copyDense(s *Scope) *Tensor {
	out := newTensor(t.st.b, t.DType(), s, t.shape...)
	if t.IsContiguous() {
		t.st.b.Copy(out.buffer(), t.buffer())
		return out
	}
	if t.st.h.released.Load() {
		panic("tensor: use of a released tensor")
	}
	t.fillPendingOnes()
	t.st.b.CopyStrided(out.buffer(), t.st.buf.Slice(t.off, t.st.buf.Len-t.off), t.shape, t.strides)
	return out
}
