package nn

import "github.com/ember-ml/ember/tensor"

// Activations as layers, to put in a Sequential; each is the tensor
// operation of the same name, with no parameters. (ReLU and Flatten are in
// layers.go.)

// GELU is x·Φ(x), as nn.GELU; Tanh set is its tanh approximation
// (torch's approximate="tanh", GPT-2's form).
type GELU struct{ Tanh bool }

// Forward applies the activation.
func (g GELU) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, g.Tanh) }

// SiLU is x·sigmoid(x) (swish), as nn.SiLU.
type SiLU struct{}

// Forward applies the activation.
func (SiLU) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.SiLU(x) }

// Tanh is the hyperbolic tangent, as nn.Tanh.
type Tanh struct{}

// Forward applies the activation.
func (Tanh) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.Tanh(x) }

// Sigmoid is 1/(1+e^-x), as nn.Sigmoid.
type Sigmoid struct{}

// Forward applies the activation.
func (Sigmoid) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.Sigmoid(x) }

// LeakyReLU is x for x > 0 and Slope·x otherwise, as nn.LeakyReLU. The
// zero value has slope 0 (it is ReLU); torch's default slope is
// DefaultLeakySlope.
type LeakyReLU struct{ Slope float32 }

// DefaultLeakySlope is nn.LeakyReLU's default negative_slope.
const DefaultLeakySlope = 0.01

// NewLeakyReLU returns a LeakyReLU with the given negative slope
// (DefaultLeakySlope for torch's default).
func NewLeakyReLU(slope float32) LeakyReLU { return LeakyReLU{Slope: slope} }

// Forward applies the activation.
func (l LeakyReLU) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.LeakyReLU(x, l.Slope) }

// Identity returns its input, as nn.Identity: a placeholder where a
// layer is optional.
type Identity struct{}

// Forward returns x.
func (Identity) Forward(x *tensor.Tensor) *tensor.Tensor { return x }
