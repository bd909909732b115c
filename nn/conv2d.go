package nn

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Conv2d is a 2-D convolution over [N, C, H, W] input, as nn.Conv2d.
// NewConv2d makes LeNet's form (square kernel, one stride and padding for
// both axes); NewConv2dWith takes every option of the core's Conv2dWith
// (rectangular kernels, strides, paddings and dilations per axis, groups,
// no bias).
type Conv2d struct {
	// Weight is [Out, In/Groups, KH, KW]; Bias is [Out], or nil for a
	// layer without bias (then it is not in the state dict, as in torch).
	Weight, Bias *tensor.Tensor
	// Stride and Padding apply to both axes; they are used when Options is
	// nil (NewConv2d's layers).
	Stride, Padding int
	// Options, when not nil (NewConv2dWith's layers), holds the per-axis
	// settings and groups, and Stride and Padding are not used.
	Options *tensor.ConvOptions
}

// Conv2dOptions are the settings of NewConv2dWith, each pair (height,
// width) as nn.Conv2d's. Zero values are torch's defaults: stride 1, no
// padding, dilation 1, one group, a bias.
type Conv2dOptions struct {
	Kernel                    [2]int
	Stride, Padding, Dilation [2]int
	// Groups splits the channels into groups convolved separately (in
	// channels for a depthwise convolution); both channel counts must be
	// multiples of it.
	Groups int
	// NoBias leaves the bias out (torch's bias=False).
	NoBias bool
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

// NewConv2dWith makes a Conv2d layer on b from in to out channels with the
// options o, initialised as torch does: weight and bias uniform in
// ±1/sqrt(fan_in), fan_in = in/groups·kh·kw (kaiming_uniform with a = √5).
// Settings that cannot make a convolution (a kernel under 1, channels not
// divisible by the groups, ...) are a mistake of the calling program: it
// panics naming the setting, as torch raises.
func NewConv2dWith(b tensor.Backend, rng *rand.Rand, in, out int, o Conv2dOptions) *Conv2d {
	groups := max(o.Groups, 1)
	switch {
	case in < 1 || out < 1:
		panic(fmt.Sprintf("nn: Conv2d from %d to %d channels; want at least one each", in, out))
	case o.Kernel[0] < 1 || o.Kernel[1] < 1:
		panic(fmt.Sprintf("nn: Conv2d kernel %v; want both sizes >= 1", o.Kernel))
	case o.Groups < 0 || in%groups != 0 || out%groups != 0:
		panic(fmt.Sprintf("nn: Conv2d groups %d for %d in and %d out channels; want a divisor of both", o.Groups, in, out))
	case o.Stride[0] < 0 || o.Stride[1] < 0 || o.Padding[0] < 0 || o.Padding[1] < 0 || o.Dilation[0] < 0 || o.Dilation[1] < 0:
		panic(fmt.Sprintf("nn: Conv2d stride %v, padding %v, dilation %v; want no negative value", o.Stride, o.Padding, o.Dilation))
	}
	rng = orDefault(rng)
	bound := kaimingBound(in / groups * o.Kernel[0] * o.Kernel[1])
	c := &Conv2d{
		Weight:  newParameter(b, rng, bound, out, in/groups, o.Kernel[0], o.Kernel[1]),
		Stride:  1,
		Options: &tensor.ConvOptions{Stride: orOnes(o.Stride), Padding: o.Padding, Dilation: orOnes(o.Dilation), Groups: groups},
	}
	if !o.NoBias {
		c.Bias = newParameter(b, rng, bound, out)
	}
	return c
}

// orOnes is p with zeros (unset) read as 1, torch's default stride and
// dilation.
func orOnes(p [2]int) [2]int {
	for i, v := range p {
		if v == 0 {
			p[i] = 1
		}
	}
	return p
}

// Forward applies the convolution.
func (c *Conv2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	if c.Options != nil {
		return tensor.Conv2dWith(x, c.Weight, c.Bias, *c.Options)
	}
	return tensor.Conv2d(x, c.Weight, c.Bias, c.Stride, c.Padding)
}

// ForwardReLU applies the convolution followed by ReLU in one pass, which
// stores no pre-activation and saves a pass over the output.
func (c *Conv2d) ForwardReLU(x *tensor.Tensor) *tensor.Tensor {
	if c.Options != nil {
		return tensor.Conv2dWithReLU(x, c.Weight, c.Bias, *c.Options)
	}
	return tensor.Conv2dReLU(x, c.Weight, c.Bias, c.Stride, c.Padding)
}

// ForwardReLUMaxPool applies the convolution, ReLU and max pooling over
// disjoint k×k windows (stride k), as MaxPool2d{k, k} after ForwardReLU.
// Backends that fuse the three (the CUDA backend) store only the pooled
// output (for layers with per-axis settings, dilation or groups, it is
// ForwardReLU and the pooling).
func (c *Conv2d) ForwardReLUMaxPool(x *tensor.Tensor, k int) *tensor.Tensor {
	stride, pad := c.simpleGeometry()
	if stride == 0 {
		return tensor.MaxPool2d(c.ForwardReLU(x), k, k)
	}
	return tensor.Conv2dReLUMaxPool(x, c.Weight, c.Bias, stride, pad, k)
}

// Parameters returns weight and bias (weight alone for a layer without
// bias).
func (c *Conv2d) Parameters() []Parameter { return weightAndBias(c.Weight, c.Bias) }

// weightAndBias lists a layer's weight and, when it has one, its bias.
func weightAndBias(w, b *tensor.Tensor) []Parameter {
	if b == nil {
		return []Parameter{{"weight", w}}
	}
	return []Parameter{{"weight", w}, {"bias", b}}
}
