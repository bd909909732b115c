package tensortest

import "github.com/ember-ml/ember/tensor"

// CoreOnly returns b seen through the tensor.Backend interface alone: every
// optional interface of b (tensor.CompleteBackend's parts, the fused and
// layer-level ones) is hidden, so that the tensor layer and the packages
// above it take the fallbacks they compose from the core: b behaves as a
// new backend that implements nothing more than the core. Running RunBackend,
// RunAutograd or a model on it checks those fallbacks against the same
// references and tolerances as b's own kernels; the suite compares
// CoreOnly(tensor.CPU) with its float64 references, as it does tensor.CPU.
func CoreOnly(b tensor.Backend) tensor.Backend { return coreOnly{b} }

// coreOnly promotes exactly the methods of tensor.Backend.
type coreOnly struct{ tensor.Backend }

func (c coreOnly) Name() string { return "core-only " + c.Backend.Name() }

// hostReference reports whether b computes on the host with the CPU
// backend's core, so that the float64 references are its check rather than
// a comparison with tensor.CPU.
func hostReference(b tensor.Backend) bool {
	if c, ok := b.(coreOnly); ok {
		b = c.Backend
	}
	return b == tensor.CPU
}
