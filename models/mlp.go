package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// MLP is a multilayer perceptron of two hidden layers with ReLU: fc1
// in→1024, fc2 1024→1024, fc3 1024→classes (784-1024-1024-10 on MNIST).
// The input is flattened after the batch dimension, so it takes images
// [N, 1, 28, 28] as LeNet does. Its state dict is that of the PyTorch
// module with attributes fc1, fc2, fc3 (nn.Linear each).
type MLP struct {
	FC1, FC2, FC3 *nn.Linear
	in            int
}

// MLPHidden is the width of both hidden layers.
const MLPHidden = 1024

// NewMLP builds an MLP for inputs of in values and classes outputs on b
// with PyTorch's default initialisation, drawing from a PCG generator
// seeded with seed.
func NewMLP(b tensor.Backend, seed uint64, in, classes int) *MLP {
	rng := rand.New(rand.NewPCG(seed, 0x3e1b))
	return &MLP{
		FC1: nn.NewLinear(b, rng, in, MLPHidden),
		FC2: nn.NewLinear(b, rng, MLPHidden, MLPHidden),
		FC3: nn.NewLinear(b, rng, MLPHidden, classes),
		in:  in,
	}
}

// CheckInput returns an error saying what was expected when x is not a
// float32 batch [N, ...] of N >= 1 examples of the MLP's input size.
func (m *MLP) CheckInput(x *tensor.Tensor) error {
	s := x.Shape()
	if len(s) < 2 || s[0] < 1 || x.Len()/s[0] != m.in {
		return fmt.Errorf("models: the MLP takes a batch [N, ...] of N >= 1 examples of %d values each, not %v", m.in, s)
	}
	if x.DType() != tensor.Float32 {
		return fmt.Errorf("models: the MLP takes float32 inputs, not %s", x.DType())
	}
	return nil
}

// features is the input of the last layer, fc2's activations [N, 1024].
func (m *MLP) features(x *tensor.Tensor) *tensor.Tensor {
	if err := m.CheckInput(x); err != nil {
		panic(err.Error())
	}
	x = x.Reshape(x.Dim(0), m.in)
	return m.FC2.ForwardReLU(m.FC1.ForwardReLU(x))
}

// Forward maps a batch to logits [N, classes].
func (m *MLP) Forward(x *tensor.Tensor) *tensor.Tensor { return m.FC3.Forward(m.features(x)) }

// LossSum is the mean cross entropy of the logits against int32 labels
// [N], also added into sum (one float32 element outside the graph), with
// the last layer and the loss as one operation where the backend fuses
// them (see LeNet.LossSum).
func (m *MLP) LossSum(x, labels, sum *tensor.Tensor) *tensor.Tensor {
	return tensor.LinearCrossEntropySum(m.features(x), m.FC3.Weight, m.FC3.Bias, labels, sum)
}

// Parameters lists fc1.weight, fc1.bias, fc2.*, fc3.*.
func (m *MLP) Parameters() []nn.Parameter {
	var ps []nn.Parameter
	ps = append(ps, nn.Prefixed("fc1", m.FC1.Parameters())...)
	ps = append(ps, nn.Prefixed("fc2", m.FC2.Parameters())...)
	ps = append(ps, nn.Prefixed("fc3", m.FC3.Parameters())...)
	return ps
}
