package nn

import (
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Linear is y = x·Wᵀ + b for x [N, In], W [Out, In], b [Out], as nn.Linear.
type Linear struct {
	Weight, Bias *tensor.Tensor
}

// NewLinear makes a Linear layer on b initialised as PyTorch does
// (weights and bias uniform in ±1/sqrt(in)). A nil rng draws from a
// generator seeded with 1.
func NewLinear(b tensor.Backend, rng *rand.Rand, in, out int) *Linear {
	rng = orDefault(rng)
	bound := kaimingBound(in)
	return &Linear{
		Weight: newParameter(b, rng, bound, out, in),
		Bias:   newParameter(b, rng, bound, out),
	}
}

// Forward applies the layer.
func (l *Linear) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.Linear(x, l.Weight, l.Bias)
}

// ForwardReLU applies the layer followed by ReLU; backends that fuse the
// bias with the activation (the CUDA backend) make it one pass.
func (l *Linear) ForwardReLU(x *tensor.Tensor) *tensor.Tensor {
	return tensor.LinearReLU(x, l.Weight, l.Bias)
}

// Parameters returns weight and bias.
func (l *Linear) Parameters() []Parameter {
	return []Parameter{{"weight", l.Weight}, {"bias", l.Bias}}
}

func orDefault(rng *rand.Rand) *rand.Rand {
	if rng == nil {
		return rand.New(rand.NewPCG(1, 0))
	}
	return rng
}
