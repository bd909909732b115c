package tensor

import "fmt"

// node records how a tensor was computed: its inputs and the function that
// turns the gradient of the output into gradients of the inputs.
type node struct {
	op       string
	inputs   []*Tensor
	backward func(g *Tensor, e *engine)
	saved    []*Tensor // buffers made for backward alone (saveFor)
	// outputUnread: backward does not read the output's memory, which
	// may go before it runs (Recompute's, which makes it again).
	outputUnread bool
	// unread are the inputs whose memory backward does not read
	// (readsNot).
	unread []*Tensor
	// unary, for a unary function's node, is how to make its output again
	// from its input (which backward reads, so it is kept).
	unary *unaryRecipe
	// reluOut: the output is a ReLU's, and backward skips the ReLU's mask
	// when every part of the output's gradient came already masked
	// (engine.sinkMasked): an operation that takes the output and makes
	// its gradient in a pass of its own can apply the mask there for free,
	// which saves the layer a pass over the gradient.
	reluOut bool
	// takesUniform: backward reads a uniform gradient (giveUniform) as it
	// is (through pass and give, or uniformSource), so it need not be
	// filled first.
	takesUniform bool
	// forward, when set, is a leaf whose gradient this node's output shares:
	// the output is the leaf itself seen from another scope (Scope.Borrow),
	// element for element, so every part of its gradient goes straight
	// into the leaf's rather than into a buffer of its own first.
	forward *Tensor
}

// RequiresGrad reports whether gradients flow to this tensor.
func (t *Tensor) RequiresGrad() bool { return t.requiresGrad }

// SetRequiresGrad marks a leaf tensor (a parameter) as one whose gradient
// Backward accumulates into Grad.
func (t *Tensor) SetRequiresGrad(on bool) *Tensor {
	if !t.IsLeaf() {
		panic("tensor: SetRequiresGrad on a computed tensor; only leaves can be marked")
	}
	t.requiresGrad = on
	return t
}

// Grad is the accumulated gradient of a leaf tensor, nil before the first
// Backward that reaches it. After ClearGrad it reads as zero: Grad writes
// the zeros itself when no Backward has written the gradient since.
func (t *Tensor) Grad() *Tensor {
	if t.gradCleared {
		t.gradCleared = false
		t.grad.st.b.Fill(t.grad.buffer(), 0)
	}
	return t.grad
}

// SetGrad installs g (same shape) as the gradient buffer of a leaf tensor:
// optimisers use it to place all gradients in one buffer.
func (t *Tensor) SetGrad(g *Tensor) {
	if g != nil {
		mustSameShape("SetGrad", t, g)
	}
	t.grad, t.gradCleared = g, false
}

// ClearGrad sets the accumulated gradient to zero without writing it: the
// next Backward that reaches t writes its first part over the buffer
// instead of adding it to zeros (as PyTorch's zero_grad(set_to_none=True)
// lets the next backward pass start afresh, with the memory kept). That
// spares a pass writing zeros over every gradient and, in the products
// that make them, a read of those zeros. Until then the gradient reads as
// zero (Grad writes the zeros if asked first).
func (t *Tensor) ClearGrad() {
	if t.grad != nil {
		t.gradCleared = true
	}
}

// GradCleared reports whether t's gradient is cleared (ClearGrad) and not
// written since.
func (t *Tensor) GradCleared() bool { return t.gradCleared }

// GradWrittenWhole reports whether the last Backward that reached t could
// have written its gradient over the buffer: the operation that gave its
// first part can write, rather than only add (a convolution's filter
// gradient or an embedding's scatter adds, and needs zeros under it). An
// optimiser clears (ClearGrad) rather than zeroes the gradients of
// parameters whose gradients are all written whole. False before the
// first Backward.
func (t *Tensor) GradWrittenWhole() bool { return t.gradWhole }

// GradWrittenAfresh reports whether the last Backward that reached t found
// its gradient cleared, so that the gradient it left does not depend on
// what the buffer held before (its first part was written over the
// buffer, or over zeros written for it then). A captured step whose
// update clears the gradients again replays correctly only if its
// backward pass did so.
func (t *Tensor) GradWrittenAfresh() bool { return t.gradFresh }

// RestoreGradCleared puts back the mark GradCleared reported earlier, for
// work recorded but never run (a failed graph capture, a rehearsal of one):
// the gradient's memory holds what it held then, so it must read as it did.
func (t *Tensor) RestoreGradCleared(cleared bool) { t.gradCleared = cleared && t.grad != nil }

// SetGradReadyHook makes every later Backward call fn(t) as soon as the
// gradient of the leaf t is complete for that pass: every operation that
// used t has added its part into t.Grad, and nothing later in the pass
// will (PyTorch's register_post_accumulate_grad_hook). Data-parallel
// training starts a bucket's all-reduce from it while the backward pass of
// the layers before goes on. A leaf that a Backward does not reach gets no
// call. fn runs on Backward's goroutine, in the order the gradients become
// ready; nil removes the hook.
func (t *Tensor) SetGradReadyHook(fn func(*Tensor)) {
	if !t.IsLeaf() {
		panic("tensor: SetGradReadyHook on a computed tensor; only leaves have a gradient to be ready")
	}
	t.gradHook = fn
}

// Function records out as computed from inputs by an operation this
// package does not know (a collective across processes, say), so that
// Backward goes through it: backward maps out's gradient g to one
// gradient per input, of its shape (nil for none; an input that needs no
// gradient ignores its entry). out must be a tensor made for this result,
// with no history of its own. It returns out, which requires a gradient
// when an input does.
//
// The gradients backward returns belong to Function: each is added into
// its input's gradient and then released (as soon as the pass is through
// this operation), so backward should return tensors made for them. One
// that shares its memory with g, out or an input (backward returned g
// itself, say) is left alone, and one returned for several inputs is
// released once; g itself belongs to Backward and must not be released.
func Function(op string, out *Tensor, backward func(g *Tensor) []*Tensor, inputs ...*Tensor) *Tensor {
	if out.node != nil || out.requiresGrad {
		panic("tensor: Function of a tensor that already has a history or requires grad; give it a new tensor")
	}
	record(out, op, func(g *Tensor, e *engine) {
		gs := backward(g)
		for i, in := range inputs {
			if i < len(gs) && gs[i] != nil && in != nil && in.requiresGrad {
				mustSameShape(op+" backward", in, gs[i])
				e.pass(in, gs[i])
			}
		}
		// Passed (copied or added) into the inputs' gradients: the
		// returned tensors are not needed any more.
		kept := map[*storage]bool{g.st: true, out.st: true}
		for _, in := range inputs {
			if in != nil {
				kept[in.st] = true
			}
		}
		for _, gi := range gs {
			if gi != nil && !kept[gi.st] {
				kept[gi.st] = true
				gi.st.release()
			}
		}
	}, inputs...)
	return out
}

// ZeroGrad sets the accumulated gradient to zero (keeping its memory, so
// that the next step allocates nothing), writing the zeros now; ClearGrad
// leaves them to the next Backward.
func (t *Tensor) ZeroGrad() {
	if t.grad != nil {
		t.gradCleared = false
		t.st.b.Fill(t.grad.buffer(), 0)
	}
}

// IsLeaf reports whether the tensor was not produced by a recorded operation.
func (t *Tensor) IsLeaf() bool { return t.node == nil && !t.consumed }

// Detach returns a view of t that records no history.
func (t *Tensor) Detach() *Tensor {
	t.st.refs++ // a holder outside the graph: Backward keeps the memory
	return &Tensor{st: t.st, off: t.off, shape: t.Shape(), strides: t.Strides(), scope: t.scope}
}

// record attaches a node to out when any input needs a gradient and the
// scope records graphs.
func record(out *Tensor, op string, backward func(g *Tensor, e *engine), inputs ...*Tensor) {
	if !out.scope.GradEnabled() {
		return
	}
	for _, in := range inputs {
		if in != nil && in.requiresGrad {
			out.requiresGrad = true
			out.node = &node{op: op, inputs: inputs, backward: backward}
			countReaders(out, inputs)
			return
		}
	}
}

// takesUniform marks out's node as one whose backward reads a uniform
// gradient as it is (node.takesUniform).
func takesUniform(out *Tensor) {
	if out.node != nil {
		out.node.takesUniform = true
	}
}

// Backward computes the gradient of the scalar t with respect to every leaf
// that requires one, adding it into their Grad (as PyTorch accumulates).
// The graph is consumed: calling Backward twice on it, or on another root
// whose graph shares a part with it, panics before anything is computed.
// In a scope that releases in backward (SetReleaseInBackward) the memory
// of the graph's intermediate tensors is given back during the pass
// (release.go).
func (t *Tensor) Backward() {
	if t.Len() != 1 {
		panic(fmt.Sprintf("tensor: Backward of a non-scalar of shape %v", t.shape))
	}
	if !t.requiresGrad {
		panic("tensor: Backward of a tensor that does not require grad")
	}
	if t.consumed {
		panic("tensor: Backward through a graph that was already consumed")
	}
	if t.Released() {
		panic("tensor: Backward of a released tensor (its scope was reset or released)")
	}
	t.backwardFrom(nil, true)
}

// backwardFrom is Backward from t with seed as t's gradient (ones when
// nil; the caller keeps a seed it gives). hooks says whether the leaves'
// SetGradReadyHook functions run: not in Recompute's inner pass, whose
// outer node counts the leaves fn reads as its own inputs.
func (t *Tensor) backwardFrom(seed *Tensor, hooks bool) {
	order := topoOrder(t)
	mustNotBeConsumed(order)
	e := &engine{grads: make(map[*Tensor]*Tensor, len(order)), scope: t.scope}
	if seed == nil {
		// The seed is ones, filled only if a backward function reads it:
		// those that know it is one (isOne) skip a fill per step.
		seed = newTensor(t.st.b, Float32, e.scopeFor(t), t.shape...)
		seed.isOne, seed.st.onesPending = true, true
	}
	if t.node == nil {
		e.pass(t, seed)
		if hooks && t.gradHook != nil {
			t.gradHook(t)
		}
		return
	}
	var pending map[*Tensor]int
	if hooks {
		pending = hookedLeafUses(order)
	}
	plan := newReleasePlan(t, order)
	e.grads[t] = seed
	for i := len(order) - 1; i >= 0; i-- {
		u := order[i]
		g := e.grads[u]
		delete(e.grads, u)
		n := u.node
		u.node = nil // consumed; lets the inputs be collected
		u.consumed = true
		e.gradMasked = e.masked[u]
		delete(e.masked, u)
		if g != nil && !g.IsContiguous() && !n.takesUniform {
			// A uniform gradient held as a view (giveUniform), filled
			// for a backward function that reads memory.
			g = filledUniform(g, e.scopeFor(u))
		}
		if g != nil {
			e.current, e.keepCurrent = g.st, false
			if n.outputUnread {
				plan.releaseOutput(u)
			}
			plan.before()
			n.backward(g, e)
			plan.after(e, n)
		}
		if pending != nil {
			gradsReady(pending, n.inputs)
		}
		// Nothing reads u's gradient after this (unless a view of it became
		// an input's gradient): give its memory back now rather than at the
		// end of the step, which keeps the peak of a backward pass near one
		// activation's gradient at a time.
		if g != nil && g != seed && g.scope != nil && g.st != t.st && !e.keepCurrent && g.IsContiguous() {
			g.st.release()
		}
		plan.done(e, u, n)
	}
}

// mustNotBeConsumed panics when a node of order reads a tensor whose own
// node an earlier Backward used up: that part of the graph has no history
// left (and, in a scope that releases in backward, no memory).
func mustNotBeConsumed(order []*Tensor) {
	for _, u := range order {
		for _, in := range u.node.inputs {
			if in != nil && in.requiresGrad && in.consumed {
				panic(fmt.Sprintf("tensor: Backward through a graph that was already consumed: the input of %s was computed by a graph an earlier Backward went through", u.node.op))
			}
		}
	}
}

// hookedLeafUses counts, for each leaf with a SetGradReadyHook, the inputs
// of the nodes of order that are that leaf: its gradient is complete when
// all of those nodes have run. nil when no leaf has a hook.
func hookedLeafUses(order []*Tensor) map[*Tensor]int {
	var pending map[*Tensor]int
	for _, u := range order {
		for _, in := range u.node.inputs {
			if in != nil && in.gradHook != nil && in.node == nil && in.requiresGrad {
				if pending == nil {
					pending = map[*Tensor]int{}
				}
				pending[in]++
			}
		}
	}
	return pending
}

// gradsReady counts down the uses of the hooked leaves among inputs (those
// of a node whose backward just ran) and calls the hook of each leaf whose
// last use that was.
func gradsReady(pending map[*Tensor]int, inputs []*Tensor) {
	for _, in := range inputs {
		n, ok := pending[in]
		if !ok {
			continue
		}
		if n--; n > 0 {
			pending[in] = n
			continue
		}
		delete(pending, in)
		if in.grad != nil { // nil: no gradient flowed (a zero path)
			in.gradHook(in)
		}
	}
}

// topoOrder lists the computed tensors reachable from root, inputs before
// the tensors made from them.
func topoOrder(root *Tensor) []*Tensor {
	var order []*Tensor
	seen := map[*Tensor]bool{}
	type frame struct {
		t    *Tensor
		next int
	}
	stack := []frame{{t: root}}
	seen[root] = true
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.t.node == nil || f.next == len(f.t.node.inputs) {
			if f.t.node != nil {
				order = append(order, f.t)
			}
			stack = stack[:len(stack)-1]
			continue
		}
		in := f.t.node.inputs[f.next]
		f.next++
		if in != nil && in.requiresGrad && in.node != nil && !seen[in] {
			seen[in] = true
			stack = append(stack, frame{t: in})
		}
	}
	return order
}

// engine accumulates gradients during one Backward.
type engine struct {
	grads map[*Tensor]*Tensor
	scope *Scope
	// current is the memory of the gradient being propagated; keepCurrent
	// records that a view of it was handed on (Reshape), so it must outlive
	// this node.
	current     *storage
	keepCurrent bool
	// masked holds the computed tensors of reluOut nodes whose every
	// gradient part so far came through their ReLU's mask; gradMasked
	// says so of the gradient being propagated.
	masked     map[*Tensor]bool
	gradMasked bool
	// leaves are the leaves whose gradient has had a part in this pass.
	leaves map[*Tensor]bool
}

func (e *engine) scopeFor(t *Tensor) *Scope {
	if t.scope != nil {
		return t.scope
	}
	return e.scope
}

// sink returns the buffer where the gradient of t goes and whether the
// caller must add into it (true) or may overwrite it (false). It returns an
// empty buffer when t needs no gradient.
func (e *engine) sink(t *Tensor) (Buffer, bool) { return e.sinkMasked(t, false) }

// sinkMasked is sink for a caller that writes a gradient already through
// t's ReLU mask (g·[t > 0]) when masked: t's backward may then skip the
// mask if every other part of t's gradient comes masked too (reluOut).
func (e *engine) sinkMasked(t *Tensor, masked bool) (Buffer, bool) {
	return e.sinkAs(t, masked, true)
}

// sinkAs is sinkMasked for a caller that can overwrite the buffer (whole)
// or can only add into it (sinkZeroed's callers).
func (e *engine) sinkAs(t *Tensor, masked, whole bool) (Buffer, bool) {
	t = forwarded(t)
	if t == nil || !t.requiresGrad {
		return Buffer{}, false
	}
	if t.node == nil {
		if t.consumed {
			panic("tensor: Backward through a graph that was already consumed")
		}
		if t.grad == nil { // a scoped leaf's gradient goes with its scope
			t.grad = Zeros(t.st.b, t.scope, t.shape...)
		}
		if !e.leaves[t] { // the pass's first part decides GradWrittenWhole and GradWrittenAfresh
			if e.leaves == nil {
				e.leaves = map[*Tensor]bool{}
			}
			e.leaves[t] = true
			t.gradWhole, t.gradFresh = whole, t.gradCleared
		}
		if t.gradCleared { // zero: this first part is written, not added
			t.gradCleared = false
			return t.grad.buffer(), false
		}
		return t.grad.buffer(), true
	}
	if g := e.grads[t]; g != nil {
		if !masked {
			delete(e.masked, t)
		}
		if !g.IsContiguous() { // uniform: filled before another part adds in
			g = filledUniform(g, e.scopeFor(t))
			e.grads[t] = g
		}
		return g.buffer(), true
	}
	g := Empty(t.st.b, e.scopeFor(t), t.shape...)
	e.grads[t] = g
	e.markMasked(t, masked)
	return g.buffer(), false
}

// giveUniform hands x the gradient of a reduction of all of x to the one
// element of g: every element of x's gradient is g's. It goes as a view of
// g with all strides 0, which a computed x with no gradient yet adopts at
// no cost: the view is filled only when a backward function reads x's
// gradient as memory, and Add and Borrow hand it on unfilled, so that the
// gradient of sum(a + b) for leaves a and b is one pass a leaf. Any other x
// has it written or added in one pass (Backend.Broadcast). It reports
// whether x adopted the view, which then needs g's memory.
func giveUniform(e *engine, x, g *Tensor) (adopted bool) {
	if x = forwarded(x); x == nil || !x.requiresGrad {
		return false
	}
	adopted = x.node != nil && e.grads[x] == nil
	e.give(x, g.view(g.off, x.shape, make([]int, len(x.shape))))
	return adopted
}

// isUniform says whether t is a view of one element (every stride 0) with
// more than one element: every element of it is that one.
func (t *Tensor) isUniform() bool {
	if t.IsContiguous() || t.DType() != Float32 {
		return false
	}
	for _, s := range t.strides {
		if s != 0 {
			return false
		}
	}
	return true
}

// uniformSource is the one element of a uniform t (isUniform), as a
// one-element buffer.
func (t *Tensor) uniformSource() (Buffer, bool) {
	if !t.isUniform() {
		return Buffer{}, false
	}
	t.mustBeLive()
	t.fillPendingOnes()
	return t.st.buf.Slice(t.off, 1), true
}

// filledUniform is a dense copy of t (made for a uniform one) in scope s.
func filledUniform(t *Tensor, s *Scope) *Tensor {
	src, ok := t.uniformSource()
	if !ok {
		return t.copyDense(s)
	}
	out := newTensor(t.st.b, Float32, s, t.shape...)
	Complete(t.st.b).Broadcast(out.buffer(), src, false)
	return out
}

// forwarded is the tensor whose gradient t's is: the leaf that a
// borrowed view of it stands for (node.forward), else t.
func forwarded(t *Tensor) *Tensor {
	for t != nil && t.node != nil && t.node.forward != nil {
		t = t.node.forward
	}
	return t
}

// markMasked records whether the first part of t's gradient came through
// its ReLU's mask.
func (e *engine) markMasked(t *Tensor, masked bool) {
	if masked && t.node != nil && t.node.reluOut {
		if e.masked == nil {
			e.masked = map[*Tensor]bool{}
		}
		e.masked[t] = true
		return
	}
	delete(e.masked, t)
}

// unmasked records that a part of t's gradient was added without the
// mask.
func (e *engine) unmasked(t *Tensor) { delete(e.masked, t) }

// sinkZeroed is sink for operations that can only add into their output.
func (e *engine) sinkZeroed(t *Tensor) Buffer {
	buf, acc := e.sinkAs(t, false, false)
	if !buf.Empty() && !acc {
		t.st.b.Fill(buf, 0)
	}
	return buf
}

// pass adds a computed gradient g (shape of t, possibly strided or shared)
// into the gradient of t.
func (e *engine) pass(t *Tensor, g *Tensor) { e.passMasked(t, g, false) }

// passMasked is pass for a gradient already through t's ReLU mask when
// masked (sinkMasked).
func (e *engine) passMasked(t *Tensor, g *Tensor, masked bool) {
	if t == nil || !t.requiresGrad {
		return
	}
	b := t.st.b
	if src, ok := g.uniformSource(); ok {
		dst, acc := e.sinkMasked(t, masked)
		Complete(b).Broadcast(dst, src, acc)
		return
	}
	if !g.IsContiguous() {
		// A dense copy for this pass alone: its memory goes back once the
		// addition is queued.
		g = g.copyDense(e.scopeFor(t))
		defer g.Release()
	}
	dst, acc := e.sinkMasked(t, masked)
	if acc {
		Complete(b).Axpy(dst, 1, g.buffer())
	} else {
		b.Copy(dst, g.buffer())
	}
}

// give hands t a gradient that nothing else references, adopting its memory
// when t has no gradient yet instead of copying it.
func (e *engine) give(t *Tensor, g *Tensor) { e.giveMasked(t, g, false) }

// giveMasked is give for a gradient already through t's ReLU mask when
// masked (sinkMasked).
func (e *engine) giveMasked(t *Tensor, g *Tensor, masked bool) {
	t = forwarded(t)
	if t == nil || !t.requiresGrad {
		return
	}
	if t.node != nil && e.grads[t] == nil && (g.IsContiguous() || g.isUniform()) && !g.isOne {
		e.grads[t] = g
		e.markMasked(t, masked)
		if g.st == e.current {
			e.keepCurrent = true
		}
		return
	}
	e.passMasked(t, g, masked)
}
