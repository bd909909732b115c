package tensor

import "fmt"

// IndexSelect returns the entries of x at the int32 indices idx (1-D) along
// axis, as torch.index_select: the result has idx.Len() entries on that
// axis. Its gradient adds back into the selected entries (repeated indices
// add up).
func IndexSelect(x *Tensor, axis int, idx *Tensor) *Tensor {
	if idx.DType() != Int32 || len(idx.shape) != 1 {
		panic(fmt.Sprintf("tensor: IndexSelect of %v by %s indices %v; want 1-D int32 indices", x.shape, idx.DType(), idx.shape))
	}
	outer, n, inner := axisView("IndexSelect", x.shape, axis)
	if axis < 0 {
		axis += len(x.shape)
	}
	shape := x.Shape()
	shape[axis] = idx.Len()
	return gatherRows("index_select", x, idx, shape, outer, n, inner)
}

// Embedding returns the rows of weight [V, D] named by the int32 ids (of
// any shape), shaped [ids..., D], as nn.Embedding. The gradient of weight
// adds up the gradients of the rows each id selected.
func Embedding(weight, ids *Tensor) *Tensor {
	if len(weight.shape) != 2 || ids.DType() != Int32 {
		panic(fmt.Sprintf("tensor: Embedding of weight %v by %s ids %v; want [V, D] and int32 ids", weight.shape, ids.DType(), ids.shape))
	}
	return gatherRows("embedding", weight, ids, append(ids.Shape(), weight.shape[1]), 1, weight.shape[0], weight.shape[1])
}

// gatherRows gathers x viewed as [outer, n, inner] along its middle axis by
// idx into a tensor of shape, recording IndexAdd as its backward pass.
func gatherRows(op string, x, idx *Tensor, shape []int, outer, n, inner int) *Tensor {
	sameBackend(x, idx)
	x, idx = x.Contiguous(), idx.Contiguous()
	be := x.st.b
	// The result belongs to a step's scope whichever operand carries it:
	// an embedding's weight is long-lived, its ids are the step's.
	out := Empty(be, scopeOf(x, idx), shape...)
	be.IndexSelect(out.buffer(), x.buffer(), idx.buffer(), outer, n, inner)
	record(out, op, func(g *Tensor, e *engine) {
		if dx := e.sinkZeroed(x); !dx.Empty() {
			be.IndexAdd(dx, g.buffer(), idx.buffer(), outer, n, inner)
		}
	}, x)
	alsoReads(out, idx)
	readsNot(out, true, x) // the indices are what it reads
	return out
}

// OneHot returns float32 [labels..., classes] with 1 at each int32 label's
// class and 0 elsewhere (rows of the identity gathered by the labels, on
// the labels' device). A label outside [0, classes) is an error as in
// IndexSelect.
func OneHot(labels *Tensor, classes int) *Tensor {
	if labels.DType() != Int32 || classes < 1 {
		panic(fmt.Sprintf("tensor: OneHot of %s labels %v into %d classes", labels.DType(), labels.shape, classes))
	}
	eye := make([]float32, classes*classes)
	for c := 0; c < classes; c++ {
		eye[c*classes+c] = 1
	}
	s := labels.scope
	id := FromFloat32(labels.st.b, s, eye, classes, classes)
	out := Empty(labels.st.b, s, append(labels.Shape(), classes)...)
	labels.st.b.IndexSelect(out.buffer(), id.buffer(), labels.Contiguous().buffer(), 1, classes, classes)
	if s == nil {
		id.Release()
	}
	return out
}
