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
// long-lived tensors (parameters): what it draws from a RandomSource is
// drawn again at the same positions (the source is put back where the
// first run found it, and forward again after), batch norm updates its
// running statistics in the first run only, and autocast is the inputs'
// scope's. The gradients reach the inputs and every parameter fn reads
// (their SetGradReadyHook functions run once the second run's backward is
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
	// The first run records its graph, to learn which parameters fn reads
	// and whether the result needs a gradient; the graph and every tensor
	// of it but the result go with tmp.
	run := &recomputeRun{keep: s}
	tmp := recomputeScope(s, run)
	defer tmp.Release()
	views := leafViews(inputs, tmp)
	defer dropViews(inputs)
	y := fn(views...)
	if y == nil {
		panic("tensor: Recompute's function returned nil")
	}
	needsGrad := y.requiresGrad
	hidden := readLeaves(y, views)
	if adopt(y, tmp, s) {
		y.st.refs = 1 // the other Tensor values over it are tmp's, gone
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
		rs := recomputeScope(s, &recomputeRun{replay: true})
		defer rs.Release()
		rs.early = true // nothing reads the second run's tensors after its pass
		// Each source to where the first run found it; back to where it
		// stands now once the second run has drawn.
		now := make([]func(), len(run.draws))
		for i, d := range run.draws {
			now[i] = d.src.snapshot(rs)
		}
		for _, d := range run.draws {
			d.restore()
		}
		views := leafViews(inputs, rs)
		defer dropViews(inputs)
		y2 := fn(views...)
		for _, put := range now {
			put()
		}
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
	return y
}

// recomputeRun is what one Recompute keeps between its two runs: where
// each RandomSource its function drew from stood before the first draw.
type recomputeRun struct {
	replay bool   // the second run: nothing to note
	keep   *Scope // holds the snapshots until the second run
	draws  []recomputeDraw
}

type recomputeDraw struct {
	src     RandomSource
	restore func()
}

// noteDraw records, in a Recompute's first run on s, where gen stands
// before its first draw there.
func noteDraw(s *Scope, gen RandomSource) {
	if s == nil || s.run == nil || s.run.replay {
		return
	}
	for _, d := range s.run.draws {
		if d.src == gen {
			return
		}
	}
	s.run.draws = append(s.run.draws, recomputeDraw{src: gen, restore: gen.snapshot(s.run.keep)})
}

// replaying reports whether s is Recompute's second run.
func (s *Scope) replaying() bool { return s != nil && s.run != nil && s.run.replay }

// Recomputing reports whether t belongs to the second run of a Recompute's
// function (the one Backward makes): a layer with a side effect of its
// own, such as running statistics it updates itself, skips it there, as
// BatchNorm does.
func Recomputing(t *Tensor) bool { return t != nil && t.scope.replaying() }

// recomputeScope is a scope for one run of a Recompute under s: it records
// gradients with s's autocast.
func recomputeScope(s *Scope, run *recomputeRun) *Scope {
	rs := NewScope()
	rs.autocast = s.Autocast()
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

// dropViews uncounts the views leafViews made of inputs, which are gone
// with their run: Backward may free the inputs' memory again.
func dropViews(inputs []*Tensor) {
	for _, in := range inputs {
		in.st.refs--
	}
}

// readLeaves lists the leaves that need a gradient in y's graph, other
// than views: the parameters a Recompute's function read.
func readLeaves(y *Tensor, views []*Tensor) []*Tensor {
	var out []*Tensor
	seen := map[*Tensor]bool{}
	for _, v := range views {
		seen[v] = true
	}
	for _, u := range topoOrder(y) {
		for _, in := range u.node.inputs {
			if in != nil && in.requiresGrad && in.node == nil && !seen[in] {
				seen[in] = true
				out = append(out, in)
			}
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
