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
type Residual struct{ Fn Module }

// NewResidual returns x + f(x).
func NewResidual(f Module) *Residual { return &Residual{Fn: f} }

// Forward returns x + Fn(x).
func (r *Residual) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.Add(x, r.Fn.Forward(x)) }
