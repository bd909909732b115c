package nn

import (
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Linear is y = x·Wᵀ + b for x [..., In], W [Out, In], b [Out], as
// nn.Linear: the leading dimensions of x are kept (a batch of sequences
// [B, T, In] gives [B, T, Out]).
type Linear struct {
	// Bias is nil for a layer without bias (NewLinearNoBias); it is then
	// not in the state dict, as torch's bias=False.
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

// NewLinearNoBias makes a Linear layer without bias (torch's bias=False),
// its weight drawn as NewLinear's.
func NewLinearNoBias(b tensor.Backend, rng *rand.Rand, in, out int) *Linear {
	return &Linear{Weight: newParameter(b, orDefault(rng), kaimingBound(in), out, in)}
}

// Forward applies the layer.
func (l *Linear) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.Linear(x, l.Weight, l.Bias)
}

// ForwardReLU applies the layer followed by ReLU; backends that fuse the
// bias with the activation (the CUDA backend) make it one pass. Input of
// other than two dimensions takes Forward and ReLU.
func (l *Linear) ForwardReLU(x *tensor.Tensor) *tensor.Tensor {
	if len(x.Shape()) != 2 {
		return tensor.ReLU(l.Forward(x))
	}
	return tensor.LinearReLU(x, l.Weight, l.Bias)
}

// CrossEntropyLoss is CrossEntropyLoss(l.Forward(x), labels) (the package's
// function, tensor.CrossEntropy): the layer as a classifier's last, with its
// loss. Backends that fuse the two (the CUDA
// backend, for up to 32 classes) run them as one operation each way.
func (l *Linear) CrossEntropyLoss(x, labels *tensor.Tensor) *tensor.Tensor {
	return tensor.LinearCrossEntropy(x, l.Weight, l.Bias, labels)
}

// Parameters returns weight and bias (weight alone for a layer without
// bias).
func (l *Linear) Parameters() []Parameter { return weightAndBias(l.Weight, l.Bias) }

func orDefault(rng *rand.Rand) *rand.Rand {
	if rng == nil {
		return rand.New(rand.NewPCG(1, 0))
	}
	return rng
}
