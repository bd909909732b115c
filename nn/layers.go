package nn

import (
	"strconv"

	"github.com/ember-ml/ember/tensor"
)

// MaxPool2d takes the maximum over Kernel×Kernel windows moved by Stride, as
// nn.MaxPool2d. NewMaxPool2d makes LeNet's form (no padding);
// NewMaxPool2dWith takes per-axis windows, strides, padding and ceil mode.
type MaxPool2d struct {
	// Kernel and Stride apply to both axes; they are used when Options is
	// nil.
	Kernel, Stride int
	// Options, when not nil (NewMaxPool2dWith's layers), holds the
	// per-axis settings, and Kernel and Stride are not used.
	Options *tensor.PoolOptions
}

// NewMaxPool2d returns a pooling layer whose stride equals its window, the
// PyTorch default.
func NewMaxPool2d(k int) *MaxPool2d { return &MaxPool2d{Kernel: k, Stride: k} }

// NewMaxPool2dWith returns a pooling layer with the options o (a zero
// stride is the window, as torch's default; padding, -inf, at most half
// the window; CeilMode rounds the output size up).
func NewMaxPool2dWith(o tensor.PoolOptions) *MaxPool2d { return &MaxPool2d{Options: &o} }

// Forward applies the pooling.
func (m *MaxPool2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	if m.Options != nil {
		return tensor.MaxPool2dWith(x, *m.Options)
	}
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

// SetRandomSource gives src to every layer that draws random numbers
// (see the package's SetRandomSource).
func (s *Sequential) SetRandomSource(src tensor.RandomSource) {
	for _, l := range s.Layers {
		SetRandomSource(l.Module, src)
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
