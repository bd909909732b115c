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
