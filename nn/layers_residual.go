package nn

import "github.com/ember-ml/ember/tensor"

// Residual is x + Fn(x) for any module Fn whose output has x's shape: a
// skip connection around a block. Its child is named "fn", as in the
// PyTorch module
//
//	class Residual(nn.Module):
//	    def __init__(self, fn): super().__init__(); self.fn = fn
//	    def forward(self, x): return x + self.fn(x)
//
// so the state dict keys are fn.0.weight, ... for a Sequential Fn.
//
// When Fn is a Sequential ending in activations (ReLU, GELU's tanh form,
// SiLU, ...), the skip connection is added in the generated kernel of
// those activations (nn's fusion; Unfused turns it off).
type Residual struct {
	Fn Module
	// Unfused adds the skip connection as an operation of its own.
	Unfused bool
}

// NewResidual returns x + f(x).
func NewResidual(f Module) *Residual { return &Residual{Fn: f} }

// Forward returns x + Fn(x).
func (r *Residual) Forward(x *tensor.Tensor) *tensor.Tensor {
	if !r.Unfused {
		if y, ok := residualForward(r.Fn, x); ok {
			return y
		}
	}
	return addReleasing(x, r.Fn.Forward(x))
}

// SetFusion turns the fused skip connection on or off (nn.SetFusion
// reaches Fn's layers through the model tree).
func (r *Residual) SetFusion(on bool) { r.Unfused = !on }
