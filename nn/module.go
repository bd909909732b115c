package nn

import (
	"math"
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Module is a layer or a model: a function of one tensor. Its learnable
// parameters and its buffers (running statistics) are found in its struct
// fields (see Parameters), unless it lists them itself with a Parameters
// method (ParameterLister).
type Module interface {
	// Forward applies the module to a batch.
	Forward(x *tensor.Tensor) *tensor.Tensor
}

// ParameterLister is a module that lists its own learnable tensors, in a
// fixed order, named as in a PyTorch state_dict ("weight", "conv1.bias",
// ...). A module that has this method is not searched by reflection.
type ParameterLister interface {
	Parameters() []Parameter
}

// BufferLister is a module that lists its own buffers: state saved with
// the model that is not learnt (BatchNorm's running statistics).
type BufferLister interface {
	Buffers() []Parameter
}

// Parameter is a learnable tensor and its state_dict name.
type Parameter struct {
	Name   string
	Tensor *tensor.Tensor
}

// Prefixed returns params with "prefix." put before every name, the way a
// PyTorch module names the parameters of its children.
func Prefixed(prefix string, params []Parameter) []Parameter {
	out := make([]Parameter, len(params))
	for i, p := range params {
		out[i] = Parameter{Name: prefix + "." + p.Name, Tensor: p.Tensor}
	}
	return out
}

// ZeroGrad zeroes the gradients of all parameters of m.
func ZeroGrad(m Module) {
	for _, p := range Parameters(m) {
		p.Tensor.ZeroGrad()
	}
}

// NumParameters counts the learnable scalars of m.
func NumParameters(m Module) int {
	n := 0
	for _, p := range Parameters(m) {
		n += p.Tensor.Len()
	}
	return n
}

// newParameter makes a long-lived tensor that requires grad, drawn from
// U(-bound, bound) with rng, as PyTorch's default initialisers do.
func newParameter(b tensor.Backend, rng *rand.Rand, bound float64, shape ...int) *tensor.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	data := make([]float32, n)
	for i := range data {
		data[i] = float32((2*rng.Float64() - 1) * bound)
	}
	return tensor.FromFloat32(b, nil, data, shape...).SetRequiresGrad(true)
}

// kaimingBound is the bound of PyTorch's default weight initialisation for
// Linear and Conv2d: kaiming_uniform_ with a = sqrt(5), which works out to
// 1/sqrt(fan_in); the bias uses the same bound.
func kaimingBound(fanIn int) float64 { return 1 / math.Sqrt(float64(fanIn)) }
