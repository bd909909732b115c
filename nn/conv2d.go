package nn

import (
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Conv2d is a 2-D convolution over [N, C, H, W] input, as nn.Conv2d with
// square kernels, equal stride and zero padding on both axes.
type Conv2d struct {
	Weight, Bias    *tensor.Tensor // [Out, In, K, K], [Out]
	Stride, Padding int
}

// NewConv2d makes a Conv2d layer on b with stride 1 and no padding,
// initialised as PyTorch does (uniform in ±1/sqrt(in·k·k)). A nil rng draws
// from a generator seeded with 1.
func NewConv2d(b tensor.Backend, rng *rand.Rand, in, out, k int) *Conv2d {
	rng = orDefault(rng)
	bound := kaimingBound(in * k * k)
	return &Conv2d{
		Weight: newParameter(b, rng, bound, out, in, k, k),
		Bias:   newParameter(b, rng, bound, out),
		Stride: 1,
	}
}

// Forward applies the convolution.
func (c *Conv2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.Conv2d(x, c.Weight, c.Bias, c.Stride, c.Padding)
}

// ForwardReLU applies the convolution followed by ReLU in one pass, which
// stores no pre-activation and saves a pass over the output.
func (c *Conv2d) ForwardReLU(x *tensor.Tensor) *tensor.Tensor {
	return tensor.Conv2dReLU(x, c.Weight, c.Bias, c.Stride, c.Padding)
}

// ForwardReLUMaxPool applies the convolution, ReLU and max pooling over
// disjoint k×k windows (stride k), as MaxPool2d{k, k} after ForwardReLU.
// Backends that fuse the three (the CUDA backend) store only the pooled
// output.
func (c *Conv2d) ForwardReLUMaxPool(x *tensor.Tensor, k int) *tensor.Tensor {
	return tensor.Conv2dReLUMaxPool(x, c.Weight, c.Bias, c.Stride, c.Padding, k)
}

// Parameters returns weight and bias.
func (c *Conv2d) Parameters() []Parameter {
	return []Parameter{{"weight", c.Weight}, {"bias", c.Bias}}
}
