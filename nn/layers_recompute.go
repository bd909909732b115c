package nn

import "github.com/ember-ml/ember/tensor"

// Recompute runs its module through tensor.Recompute: training keeps the
// module's input and output for the backward pass instead of every
// activation inside it, and Backward runs the module again to go back
// through it (torch.utils.checkpoint around a block). Wrapping each block
// of a deep network trades about one more forward pass for most of the
// activation memory. The module is embedded: its parameters, buffers and
// state-dict names are the wrapper's own, so a checkpoint saved with or
// without the wrapper loads into either.
//
// The module must compute the same thing when run twice on the same input:
// its dropout layers draw the same masks the second time, and batch norm
// (nn's BatchNorm, synchronised or not) updates its running statistics in
// the first run only. Outside a scope that records gradients (evaluation)
// it is the module itself.
type Recompute struct {
	Module
}

// NewRecompute wraps m.
func NewRecompute(m Module) *Recompute { return &Recompute{Module: m} }

// Forward is the module's Forward, its activations recomputed in Backward.
func (r *Recompute) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor { return r.Module.Forward(in[0]) }, x)
}

// Recomputer is a block that recomputes its own parts in the backward
// pass when asked, more finely than Recompute around it would
// (TransformerBlock: its two halves).
type Recomputer interface {
	SetRecompute(on bool)
	Recomputes() bool
}

// RecomputeBlocks makes every block of m recompute its activations in the
// backward pass: a Recomputer anywhere in m is asked to; every other layer
// of a Sequential in m that has layers of its own (a Sequential, a
// residual block) is wrapped in Recompute; single layers (a Linear, a
// pooling, batch norm), whose recomputation would save nothing, are left
// alone. It does not look inside those blocks, and returns how many it
// set or wrapped (0 for a Sequential of single layers, such as an MLP's).
// State-dict names do not change.
func RecomputeBlocks(m any) int {
	n := 0
	ask := func(r Recomputer) {
		if !r.Recomputes() {
			r.SetRecompute(true)
			n++
		}
	}
	walk(m, "", func(_ string, v any) bool {
		switch v := v.(type) {
		case *Recompute:
			return false
		case Recomputer:
			ask(v)
			return false
		case *Sequential:
			for i, l := range v.Layers {
				switch lm := l.Module.(type) {
				case *Recompute:
				case Recomputer:
					ask(lm)
				default:
					if hasLayers(lm) {
						v.Layers[i].Module = NewRecompute(lm)
						n++
					}
				}
			}
			return false
		}
		return true
	}, func(string, *tensor.Tensor) {})
	return n
}

// hasLayers reports whether m holds a named child module (an embedded one,
// BatchNorm2d's BatchNorm, is m itself): a Sequential of two layers or
// more, or of one that has layers.
func hasLayers(m Module) bool {
	if s, ok := m.(*Sequential); ok {
		return len(s.Layers) > 1 || len(s.Layers) == 1 && hasLayers(s.Layers[0].Module)
	}
	found := false
	walk(m, "", func(prefix string, _ any) bool {
		found = found || prefix != ""
		return !found
	}, func(string, *tensor.Tensor) {})
	return found
}
