package optim

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// ClipGradNorm scales the gradients grads (a packed gradient buffer: an
// optimiser's Gradients()) so that their global Euclidean norm is at most
// maxNorm, as torch.nn.utils.clip_grad_norm_ does:
//
//	clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1
//	g = g · clip_coef
//
// (the 1e-6 keeps a zero norm from dividing by zero; a NaN or infinite norm
// makes every gradient NaN, as torch's does with error_if_nonfinite off).
// It returns the norm before clipping as a one-element tensor in scope s
// without waiting for the device: the coefficient is computed and applied
// there, so the whole clip is three launches on a GPU, and can be captured.
func ClipGradNorm(s *tensor.Scope, grads *tensor.Tensor, maxNorm float64) *tensor.Tensor {
	if !(maxNorm >= 0) {
		panic(fmt.Sprintf("optim: ClipGradNorm: max norm %g", maxNorm))
	}
	b := grads.Backend()
	norm := tensor.Empty(b, s, 1)
	coef := tensor.Empty(b, nil, 1)
	defer coef.Release()
	g := grads.Buffer()
	if ob, ok := b.(tensor.OptimBackend); ok {
		ob.ClipCoef(norm.Buffer(), coef.Buffer(), g, float32(maxNorm))
	} else {
		onHost(b, []tensor.Buffer{norm.Buffer(), coef.Buffer(), g}, func(x []tensor.Buffer) {
			cpuOptim.ClipCoef(x[0], x[1], x[2], float32(maxNorm))
		})
	}
	tensor.Complete(b).ScaleBy(g, g, coef.Buffer(), false)
	return norm
}
