package tensor

import (
	"fmt"
	"slices"
)

// view returns a header over t's storage with another shape and strides,
// counted as one more holder of the storage: a view the caller may keep,
// which Backward must not free under (release.go).
func (t *Tensor) view(off int, shape, strides []int) *Tensor {
	t.st.refs++
	return t.rawView(off, shape, strides)
}

// rawView is view without the count, for a header that goes no further
// than the operation making it (a transient operand) or that replaces t,
// which nothing else holds (a fresh result seen with its final shape).
func (t *Tensor) rawView(off int, shape, strides []int) *Tensor {
	return &Tensor{st: t.st, off: off, shape: shape, strides: strides, scope: t.scope}
}

// Reshape returns a view with a new shape of the same number of elements;
// one dimension may be -1 and is then inferred. A strided view is copied
// first (as torch.reshape copies when it cannot return a view).
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
		return t.Contiguous().Reshape(shape...)
	}
	out := t.view(t.off, shape, contiguousStrides(shape))
	in := t
	record(out, "reshape", func(g *Tensor, e *engine) {
		// The gradient is the same memory seen with the input's shape.
		e.give(in, g.view(g.off, in.Shape(), contiguousStrides(in.shape)))
	}, in)
	readsNot(out, true, in)
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
	readsNot(out, true, in)
	return out
}

// copyDense copies a (possibly strided) tensor into new dense memory.
func (t *Tensor) copyDense(s *Scope) *Tensor {
	out := newTensor(t.st.b, t.DType(), s, t.shape...)
	if t.IsContiguous() {
		t.st.b.Copy(out.buffer(), t.buffer())
		return out
	}
	t.mustBeLive()
	t.fillPendingOnes()
	t.st.b.CopyStrided(out.buffer(), t.st.buf.Slice(t.off, t.st.buf.Len-t.off), t.shape, t.strides)
	return out
}

// Permute returns a view with the axes in the order perm (a permutation of
// 0..rank-1), as torch.permute.
func (t *Tensor) Permute(perm ...int) *Tensor {
	if len(perm) != len(t.shape) {
		panic(fmt.Sprintf("tensor: Permute of %v by %v: want %d axes", t.shape, perm, len(t.shape)))
	}
	shape, strides := make([]int, len(perm)), make([]int, len(perm))
	inv := make([]int, len(perm))
	seen := make([]bool, len(perm))
	for i, p := range perm {
		if p < 0 || p >= len(perm) || seen[p] {
			panic(fmt.Sprintf("tensor: Permute of %v by %v: not a permutation", t.shape, perm))
		}
		seen[p] = true
		shape[i], strides[i] = t.shape[p], t.strides[p]
		inv[p] = i
	}
	out := t.view(t.off, shape, strides)
	in := t
	record(out, "permute", func(g *Tensor, e *engine) {
		e.pass(in, g.Detach().Permute(inv...))
	}, in)
	return out
}

// axis normalises a possibly negative axis of a rank-r tensor.
func axisOf(op string, shape []int, axis, r int) int {
	k := axis
	if k < 0 {
		k += r
	}
	if k < 0 || k >= r {
		panic(fmt.Sprintf("tensor: %s of %v: axis %d out of range", op, shape, axis))
	}
	return k
}

// Narrow returns the view of length elements of axis from start, as
// torch.narrow; its gradient fills the rest of the input with zeros.
func (t *Tensor) Narrow(axis, start, length int) *Tensor {
	return t.Slice(axis, start, start+length, 1)
}

// Slice returns the view of axis from start to end (exclusive) by step
// (> 0), as x[..., start:end:step, ...] (start and end within [0, dim]).
func (t *Tensor) Slice(axis, start, end, step int) *Tensor {
	k := axisOf("Slice", t.shape, axis, len(t.shape))
	if step < 1 || start < 0 || end > t.shape[k] || start > end {
		panic(fmt.Sprintf("tensor: Slice of %v axis %d [%d:%d:%d]: out of range", t.shape, axis, start, end, step))
	}
	shape, strides := t.Shape(), t.Strides()
	shape[k] = (end - start + step - 1) / step
	strides[k] *= step
	off := t.off
	if shape[k] > 0 {
		off += start * t.strides[k]
	}
	out := t.view(off, shape, strides)
	in := t
	record(out, "slice", func(g *Tensor, e *engine) {
		dst, acc := e.sink(in)
		be := in.st.b
		if !acc {
			be.Fill(dst, 0)
		}
		st := contiguousStrides(in.shape)
		region := Dense(dst, in.shape)
		region.Buf = dst.Slice(start*st[k], dst.Len-start*st[k])
		region.Strides[k] *= step
		if numel(shape) > 0 {
			be.CopyView(region, denseView(g), shape, true)
		}
	}, in)
	return out
}

// Expand returns a view of t broadcast to shape (zero strides on new
// leading axes and on axes of size 1; -1 keeps a dimension), as
// torch.expand. Its gradient is summed back to t's shape.
func (t *Tensor) Expand(shape ...int) *Tensor {
	shape = slices.Clone(shape)
	lead := len(shape) - len(t.shape)
	if lead < 0 {
		panic(fmt.Sprintf("tensor: Expand of %v to %v: fewer dimensions", t.shape, shape))
	}
	for k := range t.shape {
		if shape[lead+k] == -1 {
			shape[lead+k] = t.shape[k]
		}
		if t.shape[k] != 1 && t.shape[k] != shape[lead+k] {
			panic(fmt.Sprintf("tensor: Expand of %v to %v: dimension %d is %d", t.shape, shape, k, t.shape[k]))
		}
	}
	strides := make([]int, len(shape))
	for k := range t.shape {
		if t.shape[k] != 1 {
			strides[lead+k] = t.strides[k]
		}
	}
	out := t.view(t.off, shape, strides)
	in := t
	record(out, "expand", func(g *Tensor, e *engine) {
		giveSummed(e, in, g, false)
	}, in)
	takesUniform(out)
	return out
}

// Concat joins ts along axis (all of one shape but along it), as torch.cat.
func Concat(axis int, ts ...*Tensor) *Tensor {
	if len(ts) == 0 {
		panic("tensor: Concat of no tensors")
	}
	sameBackend(ts...)
	k := axisOf("Concat", ts[0].shape, axis, len(ts[0].shape))
	shape := ts[0].Shape()
	shape[k] = 0
	for _, t := range ts {
		if len(t.shape) != len(shape) || t.DType() != Float32 {
			panic(fmt.Sprintf("tensor: Concat of %s %v with %v", t.DType(), t.shape, ts[0].shape))
		}
		for j := range shape {
			if j != k && t.shape[j] != shape[j] {
				panic(fmt.Sprintf("tensor: Concat along axis %d of %v with %v", axis, ts[0].shape, t.shape))
			}
		}
		shape[k] += t.shape[k]
	}
	be := ts[0].st.b
	out := Empty(be, scopeOf(ts...), shape...)
	st := contiguousStrides(shape)
	starts := make([]int, len(ts))
	at := 0
	for i, t := range ts {
		starts[i] = at
		if t.Len() > 0 {
			ob := out.buffer()
			be.CopyView(View{Buf: ob.Slice(at*st[k], ob.Len-at*st[k]), Strides: st}, denseView(t), t.shape, false)
		}
		at += t.shape[k]
	}
	inputs := slices.Clone(ts)
	record(out, "concat", func(g *Tensor, e *engine) {
		for i, t := range inputs {
			if t.requiresGrad {
				e.pass(t, g.Detach().Slice(k, starts[i], starts[i]+t.shape[k], 1))
			}
		}
	}, inputs...)
	return out
}

// Stack joins ts (all of one shape) along a new axis, as torch.stack.
func Stack(axis int, ts ...*Tensor) *Tensor {
	if len(ts) == 0 {
		panic("tensor: Stack of no tensors")
	}
	k := axisOf("Stack", ts[0].shape, axis, len(ts[0].shape)+1)
	us := make([]*Tensor, len(ts))
	for i, t := range ts {
		if !sameShape(t.shape, ts[0].shape) {
			panic(fmt.Sprintf("tensor: Stack of %v with %v", ts[0].shape, t.shape))
		}
		us[i] = t.Unsqueeze(k)
	}
	return Concat(k, us...)
}

// Split cuts t along axis into views of the given sizes (summing to the
// axis), as torch.split with a list.
func (t *Tensor) Split(axis int, sizes ...int) []*Tensor {
	k := axisOf("Split", t.shape, axis, len(t.shape))
	total := 0
	for _, s := range sizes {
		if s < 0 {
			panic(fmt.Sprintf("tensor: Split of %v into %v", t.shape, sizes))
		}
		total += s
	}
	if total != t.shape[k] {
		panic(fmt.Sprintf("tensor: Split of %v axis %d into %v: sizes sum to %d", t.shape, axis, sizes, total))
	}
	out := make([]*Tensor, len(sizes))
	at := 0
	for i, s := range sizes {
		out[i] = t.Slice(k, at, at+s, 1)
		at += s
	}
	return out
}

// Chunk cuts t along axis into n views of ⌈dim/n⌉ elements (the last
// smaller), as torch.chunk (which may return fewer than n).
func (t *Tensor) Chunk(n, axis int) []*Tensor {
	k := axisOf("Chunk", t.shape, axis, len(t.shape))
	if n < 1 {
		panic(fmt.Sprintf("tensor: Chunk of %v into %d", t.shape, n))
	}
	d := t.shape[k]
	size := (d + n - 1) / n
	var sizes []int
	for at := 0; at < d; at += size {
		sizes = append(sizes, min(size, d-at))
	}
	return t.Split(k, sizes...)
}

// Pad pads t with value, as torch.nn.functional.pad(mode="constant"):
// pads holds (before, after) pairs starting from the last axis.
func Pad(t *Tensor, pads []int, value float32) *Tensor {
	if len(pads)%2 != 0 || len(pads)/2 > len(t.shape) {
		panic(fmt.Sprintf("tensor: Pad of %v by %v: want pairs for at most %d axes", t.shape, pads, len(t.shape)))
	}
	shape := t.Shape()
	lo := make([]int, len(shape))
	for i := 0; i < len(pads); i += 2 {
		k := len(shape) - 1 - i/2
		if pads[i] < 0 || pads[i+1] < 0 {
			panic(fmt.Sprintf("tensor: Pad of %v by %v: negative padding", t.shape, pads))
		}
		lo[k] = pads[i]
		shape[k] += pads[i] + pads[i+1]
	}
	be := t.st.b
	out := Full(be, t.scope, value, shape...)
	st := contiguousStrides(shape)
	start := 0
	for k := range lo {
		start += lo[k] * st[k]
	}
	if t.Len() > 0 {
		ob := out.buffer()
		be.CopyView(View{Buf: ob.Slice(start, ob.Len-start), Strides: st}, denseView(t), t.shape, false)
	}
	in := t
	record(out, "pad", func(g *Tensor, e *engine) {
		v := g.Detach()
		for k := range lo {
			v = v.Slice(k, lo[k], lo[k]+in.shape[k], 1)
		}
		e.pass(in, v)
	}, in)
	return out
}

// FlattenRange folds axes start..end (inclusive; negative from the end)
// into one, as torch.flatten(x, start, end). Flatten is FlattenRange(1,
// -1) for a batch.
func (t *Tensor) FlattenRange(start, end int) *Tensor {
	r := max(len(t.shape), 1)
	i, j := axisOf("FlattenRange", t.shape, start, r), axisOf("FlattenRange", t.shape, end, r)
	if len(t.shape) == 0 {
		return t.Reshape(1)
	}
	if i > j {
		panic(fmt.Sprintf("tensor: FlattenRange of %v from axis %d to %d", t.shape, start, end))
	}
	shape := append(slices.Clone(t.shape[:i]), numel(t.shape[i:j+1]))
	return t.Reshape(append(shape, t.shape[j+1:]...)...)
}

// Unsqueeze inserts an axis of size 1 at axis (of the result's rank).
func (t *Tensor) Unsqueeze(axis int) *Tensor {
	k := axisOf("Unsqueeze", t.shape, axis, len(t.shape)+1)
	shape := slices.Insert(t.Shape(), k, 1)
	strides := slices.Insert(t.Strides(), k, 0)
	return t.restrided("unsqueeze", shape, strides)
}

// Squeeze removes the given axes, which must have size 1, or every axis of
// size 1 when none are given.
func (t *Tensor) Squeeze(axes ...int) *Tensor {
	drop := make([]bool, len(t.shape))
	if len(axes) == 0 {
		for k, d := range t.shape {
			drop[k] = d == 1
		}
	}
	for _, a := range axes {
		k := axisOf("Squeeze", t.shape, a, len(t.shape))
		if t.shape[k] != 1 {
			panic(fmt.Sprintf("tensor: Squeeze of %v: axis %d has size %d", t.shape, a, t.shape[k]))
		}
		drop[k] = true
	}
	var shape, strides []int
	for k := range t.shape {
		if !drop[k] {
			shape, strides = append(shape, t.shape[k]), append(strides, t.strides[k])
		}
	}
	return t.restrided("squeeze", shape, strides)
}

// restrided is a view of the same elements in the same order with
// size-1 axes added or removed; its gradient is the incoming one seen with
// t's shape.
func (t *Tensor) restrided(op string, shape, strides []int) *Tensor {
	out := t.view(t.off, shape, strides)
	in := t
	record(out, op, func(g *Tensor, e *engine) {
		e.pass(in, reshapedView(g, in.shape))
	}, in)
	return out
}
