package tensor

// Borrow returns t for one step of s: a view of the same memory whose
// derived tensors (the outputs of operations on it, and their gradients)
// belong to s and are freed by s.Reset, while t keeps its memory. Operations
// put their results in the scope of their inputs, so a loop whose inputs
// stay on the device (a benchmark's operands, an evaluation set) borrows
// them each step; without it every output would wait for Go's collector.
//
// In a scope that records gradients, the gradient reaching the view flows
// on to t as through any view; for a leaf t it is added into t's Grad
// directly, with no buffer of the view's own in between. In a no-grad
// scope the view records nothing. A nil s returns t itself.
func (s *Scope) Borrow(t *Tensor) *Tensor {
	if s == nil {
		return t
	}
	out := t.view(t.off, t.Shape(), t.Strides())
	out.scope = s
	in := t
	record(out, "borrow", func(g *Tensor, e *engine) { e.give(in, g) }, in)
	takesUniform(out)
	if out.node != nil && in.node == nil {
		// A leaf's gradient is written where the view's would be.
		out.node.forward = in
	}
	return out
}
