package tensor

import "slices"

// Giving memory back during the backward pass.
//
// A training step keeps every activation of its forward pass until the
// backward pass has read it. Without more, they all stay until the step's
// scope is reset, so the step's peak is every activation plus the largest
// gradients of the backward pass. In a scope with SetReleaseInBackward,
// Backward gives each one back as soon as nothing later in the pass reads
// it, as PyTorch frees a graph's saved tensors while backward runs:
//
//   - a computed tensor's memory once the backward function of the
//     operation that made it has run (every operation that read it ran
//     its own before, being later in the graph), when every Tensor over
//     that memory is in the graph: a view or Detach taken outside it, a
//     leaf sharing it, or Retain keeps it;
//   - the buffers an operation made for its backward pass alone (saveFor:
//     batch statistics, the positions of maxima, dropout masks) once that
//     backward has run;
//   - whatever a backward function made in the scope and did not hand on
//     as a gradient (a product it reduced, a copy it added), as soon as
//     it returns.
//
// During the forward pass ReleaseInput (below) gives back a layer's input
// once the next layer has run, where no backward function reads it: with
// autocast, a float32 activation that only products (which keep their
// bfloat16 copies), additions, dropouts or a ReLU took. Each operation
// counts as a reader of its inputs' and output's memory unless it says
// otherwise (readsNot), so an operation that says nothing keeps them.
//
// Gradients were already given back as they are consumed (Backward). The
// root (the loss), leaves (parameters, inputs), Retain'd tensors and
// memory the scope does not own (Borrow's view of a long-lived tensor) are
// never freed. A tensor freed this way that is read later panics saying
// so; a second Backward through the same graph panics before it starts.

// SetReleaseInBackward makes Backward give back the memory of the scope's
// intermediate tensors as soon as the pass is through with them (above),
// instead of at Reset. A training step that only reads its loss after
// Backward (nn/trainer's CaptureStep) keeps about one activation's worth
// less at its peak. The scope's owner promises not to read the
// intermediate tensors of a graph after its Backward, except those marked
// with Retain (say, logits whose accuracy is counted); the loss Backward
// starts from stays readable. Backward scans what each backward function
// allocates in this scope: no other goroutine may allocate in it during
// Backward. Reset keeps the setting.
func (s *Scope) SetReleaseInBackward(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.early = on
}

// ReleasesInBackward reports whether Backward gives the memory of this
// scope's intermediate tensors back as it goes (false for a nil scope).
func (s *Scope) ReleasesInBackward() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.early
}

// ownedSince is a copy of the storages the scope took from position mark
// of its list on (Len before).
func (s *Scope) ownedSince(mark int) []*storage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mark >= len(s.owned) {
		return nil
	}
	return append([]*storage(nil), s.owned[mark:]...)
}

// Retain keeps t's memory (shared with its views) through Backward in a
// scope that releases in backward (SetReleaseInBackward), until the scope
// frees it: for an intermediate result read after Backward. Elsewhere it
// changes nothing. It returns t.
func (t *Tensor) Retain() *Tensor {
	t.st.kept = true
	return t
}

// saveFor gives ts, buffers that an operation made for out's backward
// pass alone, to out's node: freed once that backward has run where the
// scope releases in backward (at Reset elsewhere), and at once when out
// records no backward pass that would read them.
func saveFor(out *Tensor, ts ...*Tensor) {
	if out.node == nil {
		for _, t := range ts {
			if t != nil {
				t.Release()
			}
		}
		return
	}
	for _, t := range ts {
		if t != nil {
			out.node.saved = append(out.node.saved, t)
		}
	}
}

// releasing reports whether Backward may free st early: memory of a scope
// that releases in backward, not retained, not freed yet.
func releasing(st *storage) bool {
	return st.owner != nil && !st.kept && !st.h.released.Load() && st.owner.ReleasesInBackward()
}

// releasePlan is one Backward's bookkeeping of what it gives back early.
type releasePlan struct {
	// left counts, for each storage that may go, the tensors of the graph
	// over it whose backward functions have not run yet.
	left  map[*storage]int
	scope *Scope // the root's: what backward functions allocate there is scanned
	mark  int    // the scope's Len before the running backward function
}

// newReleasePlan is the plan of a Backward from root through order, nil
// unless root's scope releases in backward.
func newReleasePlan(root *Tensor, order []*Tensor) *releasePlan {
	if !root.scope.ReleasesInBackward() {
		return nil
	}
	p := &releasePlan{left: map[*storage]int{}, scope: root.scope}
	for _, u := range order {
		if u.st != root.st && releasing(u.st) {
			p.left[u.st]++
		}
	}
	// A storage that some Tensor outside the graph also sees (a leaf, a
	// view or Detach the caller holds) stays.
	for st, n := range p.left {
		if st.refs != n {
			delete(p.left, st)
		}
	}
	return p
}

// before notes where the scope's allocations stand before a backward
// function runs.
func (p *releasePlan) before() {
	if p != nil {
		p.mark = p.scope.Len()
	}
}

// after frees what the backward function of n (which just ran) allocated
// in the scope and did not hand on: every new storage but the gradients
// pending in e and those of n's leaf inputs.
func (p *releasePlan) after(e *engine, n *node) {
	if p == nil {
		return
	}
	for _, st := range p.scope.ownedSince(p.mark) {
		if st.kept || st.h.released.Load() || e.holds(st) || leafGradOf(n, st) {
			continue
		}
		freeEarly(st)
	}
}

// releaseOutput frees u's memory before its node's backward function
// runs, where done would free it after (u is the last tensor of the graph
// over it), for a backward function that does not read it.
func (p *releasePlan) releaseOutput(u *Tensor) {
	if p != nil && p.left[u.st] == 1 && releasing(u.st) {
		freeEarly(u.st)
	}
}

// done counts u's node as run: u's memory goes when it was the last
// tensor of the graph over it, and so do the node's saved buffers.
func (p *releasePlan) done(e *engine, u *Tensor, n *node) {
	if p == nil {
		return
	}
	if c, ok := p.left[u.st]; ok {
		if c > 1 {
			p.left[u.st] = c - 1
		} else {
			delete(p.left, u.st)
			if releasing(u.st) {
				freeEarly(u.st)
			}
		}
	}
	for _, t := range n.saved {
		// A saved buffer may have become a gradient (CrossEntropy hands
		// its dlogits on): that one goes with the gradient.
		if t.st.refs == 1 && releasing(t.st) && !e.holds(t.st) {
			freeEarly(t.st)
		}
	}
}

// holds reports whether st is the memory of a gradient pending in e.
func (e *engine) holds(st *storage) bool {
	for _, g := range e.grads {
		if g.st == st {
			return true
		}
	}
	return false
}

// leafGradOf reports whether st is the gradient of one of n's leaf
// inputs (a scoped leaf's, made by this pass).
func leafGradOf(n *node, st *storage) bool {
	for _, in := range n.inputs {
		if in != nil && in.grad != nil && in.grad.st == st {
			return true
		}
	}
	return false
}

// freeEarly gives st back during Backward.
func freeEarly(st *storage) {
	st.byBackward = true
	st.release()
}

// countReaders counts a new node's backward function as a reader of the
// memory of each of its inputs and of its output (out; nil for none).
func countReaders(out *Tensor, inputs []*Tensor) {
	if out != nil {
		out.st.readers.Add(1)
	}
	for _, in := range inputs {
		if in != nil {
			in.st.readers.Add(1)
		}
	}
}

// alsoReads counts out's backward function as a reader of ts, tensors it
// reads that are not among its recorded inputs (the indices of a gather,
// the condition of Where).
func alsoReads(out *Tensor, ts ...*Tensor) {
	if out.node != nil {
		countReaders(nil, ts)
	}
}

// readsNot notes that the backward function of out's node does not read
// the memory of the inputs ins, nor out's own when output is true (an
// addition, a reshape, a dropout's mask product, an autocast product's
// float32 operand), so that ReleaseInput may give it back during the
// forward pass. An operation whose backward function reads a Buffer taken
// during the forward pass must not say so of it.
func readsNot(out *Tensor, output bool, ins ...*Tensor) {
	n := out.node
	if n == nil {
		return
	}
	if output && !n.outputUnread {
		n.outputUnread = true
		out.st.readers.Add(-1)
	}
	for _, in := range ins {
		if in == nil || !slices.Contains(n.inputs, in) || slices.Contains(n.unread, in) {
			continue
		}
		n.unread = append(n.unread, in)
		in.st.readers.Add(-1)
	}
}

// heldInternally marks t, a tensor an operation makes over memory it was
// given (a view of an input) or over its own result (the result before
// its last reshape) and hands to no caller, so that the caller's tensor
// still counts as the memory's only holder in ReleaseInput. It returns t.
func heldInternally(t *Tensor) *Tensor {
	t.st.internal.Add(1)
	return t
}

// ReleaseInput gives back the memory of in, the input of one link of a
// chain of operations whose result is out (a layer of a Sequential, the
// layer after it done), when the caller will not read in again and
// nothing else can: in belongs to a scope that releases early
// (SetReleaseInBackward), no view or Detach was made of it (but for the
// operations' own, heldInternally), it is not retained, and out does not
// share its memory. In a scope that records no graph (an evaluation's
// NewNoGradScope) that is all: evaluation then holds about two layers'
// activations at a time instead of all of them until the scope is
// released, as PyTorch's no_grad frees each one when its last reference
// goes. With a graph recorded, in goes only when no backward function
// recorded so far reads its memory (readsNot: the operation that made it
// does not read its output, and those that took it do not read that
// input): a float32 activation that only autocast products, additions and
// dropouts took, each keeping what its backward pass needs, as PyTorch
// frees one whose last reference goes. It reports whether it freed in.
func ReleaseInput(in, out *Tensor) bool { return ReleaseInputs(out, in) }

// ReleaseInputs is ReleaseInput for memory the caller holds through several
// tensors, ins: an input and the views of it that the caller made (a
// reshape) and hands to no one, none of which it will read again. The
// memory goes when those are all its holders and ReleaseInput's other
// conditions hold.
func ReleaseInputs(out *Tensor, ins ...*Tensor) bool {
	var st *storage
	var holders []*Tensor
	for _, in := range ins {
		if in == nil || in == out || (st != nil && in.st != st) || (in.node == nil && in.requiresGrad) {
			return false
		}
		st = in.st
		if !slices.Contains(holders, in) {
			holders = append(holders, in)
		}
	}
	if st == nil || (out != nil && out.st == st) {
		return false
	}
	if st.refs-int(st.internal.Load()) != len(holders) || !releasing(st) {
		return false
	}
	if st.readers.Load() > 0 { // an operation recorded in any scope may read it
		return false
	}
	freeEarly(st)
	return true
}
