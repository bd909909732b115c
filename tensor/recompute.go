package tensor

import (
	"fmt"
	"slices"
)

// Recompute returns fn(inputs...) without keeping what fn computes inside
// for the backward pass: Backward runs fn again on the same inputs when it
// reaches the result, and goes back through that second run (activation
// recomputation, as torch.utils.checkpoint and jax.checkpoint do it). A
// network whose blocks run through Recompute holds, between its forward
// and backward passes, the blocks' inputs and outputs instead of every
// activation inside them, for about one more forward pass of compute.
//
// fn must compute the same thing both times from its inputs and from
// long-lived tensors (parameters); a tensor of the step's graph that it
// reads by closure instead of as an input makes Recompute panic, saying
// so. What it draws from a RandomSource is drawn again at the same
// positions (the source is put back where the first run found it, and
// forward again after; no other goroutine may draw from it meanwhile),
// batch norm updates its running statistics in the first run only, and
// both runs take the autocast the first found. Recomputes may nest. The
// gradients reach the inputs and every parameter fn reads (their
// SetGradReadyHook functions run once the second run's backward is
// through). The tensors fn makes are given back when Recompute returns,
// except its result; fn must not keep them.
//
// Outside a scope that records gradients (a NewNoGradScope, or inputs that
// are all long-lived) Recompute is fn(inputs...).
func Recompute(fn func(in ...*Tensor) *Tensor, inputs ...*Tensor) *Tensor {
	s := scopeOf(inputs...)
	if s == nil || !s.GradEnabled() {
		return fn(inputs...)
	}
	autocast := s.Autocast() // the second run follows the first's choice
	s.mu.Lock()
	planar := s.planar
	s.mu.Unlock()
	// The first run records its graph, to learn which parameters fn reads
	// and whether the result needs a gradient; the graph and every tensor
	// of it but the result go with tmp.
	run := &recomputeRun{parent: s.run, keep: s}
	tmp := recomputeScope(autocast, planar, run)
	defer tmp.Release()
	defer keepRefs(inputs)()
	views := leafViews(inputs, tmp)
	y := fn(views...)
	if y == nil {
		panic("tensor: Recompute's function returned nil")
	}
	needsGrad := y.requiresGrad
	hidden := readLeaves(y, views, tmp)
	if adopt(y, tmp, s) {
		// The other Tensor values over it are tmp's, and the first run's
		// nodes that read it, all gone.
		y.st.refs = 1
		y.st.internal.Store(0)
		y.st.readers.Store(0)
		y.node, y.consumed = nil, false
	} else {
		y = y.copyDense(s) // a view of an input or of a long-lived tensor
	}
	if !needsGrad {
		return y
	}
	y.requiresGrad = true
	shape := slices.Clone(y.shape)
	// The backward function makes the result again: where the scope
	// releases in backward, Backward frees the first one before it runs.
	y.node = &node{op: "recompute", inputs: append(slices.Clone(inputs), hidden...), outputUnread: true, backward: func(g *Tensor, e *engine) {
		rs := recomputeScope(autocast, planar, &recomputeRun{parent: s.run, replay: true})
		defer rs.Release()
		rs.early = true // nothing reads the second run's tensors after its pass
		defer keepRefs(inputs)()
		// Each source to where the first run found it; back to where it
		// stands now once the second run has drawn (or failed).
		for _, d := range run.draws {
			defer d.src.snapshot(rs)()
		}
		for _, d := range run.draws {
			d.restore()
		}
		views := leafViews(inputs, rs)
		y2 := fn(views...)
		if y2 == nil || !slices.Equal(y2.shape, shape) {
			panic(fmt.Sprintf("tensor: Recompute's function gave %v the second time, %v the first", shapeOf(y2), shape))
		}
		if y2.requiresGrad {
			y2.backwardFrom(g, false)
		}
		for i, v := range views {
			if v.grad == nil {
				continue
			}
			// A first gradient of a computed input is handed on as it is.
			if in := inputs[i]; in.node != nil && e.grads[in] == nil && adopt(v.grad, rs, e.scopeFor(in)) {
				e.give(in, v.grad)
			} else {
				e.pass(in, v.grad)
			}
		}
	}}
	// The second run reads the inputs (and hidden tensors), not y.
	countReaders(nil, y.node.inputs)
	return y
}

// recomputeRun is what one Recompute keeps between its two runs: where
// each RandomSource its function drew from stood before the first draw.
// parent is the run of an enclosing Recompute (nested ones).
type recomputeRun struct {
	parent *recomputeRun
	replay bool   // the second run: nothing to note
	keep   *Scope // holds the snapshots until the second run
	draws  []recomputeDraw
}

type recomputeDraw struct {
	src     RandomSource
	restore func()
}

// noteDraw records where gen stands before its first draw in each
// Recompute's first run that s is in (an enclosing one's too, which
// replays the draws of the Recomputes nested in it), up to the first
// second run.
func noteDraw(s *Scope, gen RandomSource) {
	if s == nil {
		return
	}
	for r := s.run; r != nil && !r.replay; r = r.parent {
		if !slices.ContainsFunc(r.draws, func(d recomputeDraw) bool { return d.src == gen }) {
			r.draws = append(r.draws, recomputeDraw{src: gen, restore: gen.snapshot(r.keep)})
		}
	}
}

// replaying reports whether s is in a Recompute's second run (a nested
// Recompute's first run inside its enclosing one's second run too).
func (s *Scope) replaying() bool {
	if s == nil {
		return false
	}
	for r := s.run; r != nil; r = r.parent {
		if r.replay {
			return true
		}
	}
	return false
}

// Recomputing reports whether t belongs to the second run of a Recompute's
// function (the one Backward makes): a layer with a side effect of its
// own, such as running statistics it updates itself, skips it there, as
// BatchNorm does.
func Recomputing(t *Tensor) bool { return t != nil && t.scope.replaying() }

// recomputeScope is a scope for one run of a Recompute: it records
// gradients with the given autocast.
func recomputeScope(autocast DType, planar bool, run *recomputeRun) *Scope {
	rs := NewScope()
	rs.autocast, rs.planar = autocast, planar
	rs.run = run
	return rs
}

// leafViews are views of inputs in s with no history: the leaves of one
// run, needing a gradient where their input does.
func leafViews(inputs []*Tensor, s *Scope) []*Tensor {
	views := make([]*Tensor, len(inputs))
	for i, in := range inputs {
		v := in.view(in.off, in.Shape(), in.Strides())
		v.scope = s
		v.requiresGrad = in.requiresGrad
		views[i] = v
	}
	return views
}

// keepRefs notes how many Tensor values see each input's memory (and how
// many of them operations hold for themselves, heldInternally) and returns
// what puts those counts back: the views a run makes of its inputs
// (leafViews', and fn's own, a Reshape say) are gone with the run, and
// Backward may free the inputs' memory again. The readers the run's
// operations counted stay: the inputs are held a little longer, never
// freed too soon.
func keepRefs(inputs []*Tensor) func() {
	type counts struct{ refs, internal int32 }
	kept := map[*storage]counts{}
	for _, in := range inputs {
		if _, ok := kept[in.st]; !ok {
			kept[in.st] = counts{int32(in.st.refs), in.st.internal.Load()}
		}
	}
	return func() {
		for st, c := range kept {
			st.refs = int(c.refs)
			st.internal.Store(c.internal)
		}
	}
}

// readLeaves lists the leaves that need a gradient in y's graph (y itself
// when it is one), other than views: the parameters a Recompute's function
// read. It panics when the graph reaches a tensor computed outside the
// run's scope tmp (read by closure, not through the inputs): the second
// run's backward pass would go on through the enclosing graph.
func readLeaves(y *Tensor, views []*Tensor, tmp *Scope) []*Tensor {
	var out []*Tensor
	seen := map[*Tensor]bool{}
	for _, v := range views {
		seen[v] = true
	}
	note := func(t *Tensor) {
		if t != nil && t.requiresGrad && t.node == nil && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	note(y)
	for _, u := range topoOrder(y) {
		if u.scope != nil && u.scope != tmp {
			panic(fmt.Sprintf("tensor: Recompute's function read a tensor made outside it (by %s) other than through its inputs; pass it as an input", u.node.op))
		}
		for _, in := range u.node.inputs {
			note(in)
		}
	}
	return out
}

// adopt moves the memory of t, which scope from owns, to scope to; false
// (nothing moved) when from does not own it or to is nil.
func adopt(t *Tensor, from, to *Scope) bool {
	if to == nil || t.st.owner != from || !from.disown(t.st) {
		return false
	}
	t.st.owner = to
	to.own(t.st)
	t.scope = to
	return true
}

func shapeOf(t *Tensor) any {
	if t == nil {
		return "nil"
	}
	return t.shape
}
