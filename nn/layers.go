package nn

import (
	"strconv"

	"github.com/ember-ml/ember/tensor"
)

// MaxPool2d takes the maximum over Kernel×Kernel windows moved by Stride, as
// nn.MaxPool2d (no padding).
type MaxPool2d struct{ Kernel, Stride int }

// NewMaxPool2d returns a pooling layer whose stride equals its window, the
// PyTorch default.
func NewMaxPool2d(k int) *MaxPool2d { return &MaxPool2d{Kernel: k, Stride: k} }

// Forward applies the pooling.
func (m *MaxPool2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.MaxPool2d(x, m.Kernel, m.Stride)
}

// Parameters returns none.
func (*MaxPool2d) Parameters() []Parameter { return nil }

// ReLU is max(x, 0).
type ReLU struct{}

// Forward applies the activation.
func (ReLU) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.ReLU(x) }

// Parameters returns none.
func (ReLU) Parameters() []Parameter { return nil }

// Flatten folds all dimensions after the batch into one.
type Flatten struct{}

// Forward flattens.
func (Flatten) Forward(x *tensor.Tensor) *tensor.Tensor { return x.Flatten() }

// Parameters returns none.
func (Flatten) Parameters() []Parameter { return nil }

// Layer is a named child of a Sequential.
type Layer struct {
	Name   string
	Module Module
}

// Sequential applies its layers in order. Parameter names are prefixed with
// each layer's name, so a Sequential with layers named "conv1", "fc1", ...
// produces the state_dict keys of the equivalent PyTorch module.
type Sequential struct{ Layers []Layer }

// NewSequential names the layers "0", "1", ..., as torch.nn.Sequential does.
func NewSequential(ms ...Module) *Sequential {
	s := &Sequential{}
	for i, m := range ms {
		s.Layers = append(s.Layers, Layer{Name: strconv.Itoa(i), Module: m})
	}
	return s
}

// Forward applies every layer in turn.
func (s *Sequential) Forward(x *tensor.Tensor) *tensor.Tensor {
	for _, l := range s.Layers {
		x = l.Module.Forward(x)
	}
	return x
}

// Buffers lists the buffers of every layer, prefixed by its name.
func (s *Sequential) Buffers() []Parameter {
	var bs []Parameter
	for _, l := range s.Layers {
		bs = append(bs, Prefixed(l.Name, Buffers(l.Module))...)
	}
	return bs
}

// SetTraining sets the mode of every layer.
func (s *Sequential) SetTraining(on bool) {
	for _, l := range s.Layers {
		SetTraining(l.Module, on)
	}
}

// Parameters lists the parameters of every layer, prefixed by its name.
func (s *Sequential) Parameters() []Parameter {
	var ps []Parameter
	for _, l := range s.Layers {
		ps = append(ps, Prefixed(l.Name, Parameters(l.Module))...)
	}
	return ps
}

// CrossEntropyLoss is the mean over the batch of -log softmax(logits)[label],
// as nn.CrossEntropyLoss with mean reduction. labels is an int32 tensor.
func CrossEntropyLoss(logits, labels *tensor.Tensor) *tensor.Tensor {
	return tensor.CrossEntropy(logits, labels)
}
