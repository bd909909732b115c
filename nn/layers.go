package nn

import (
	"fmt"
	"strconv"
	"strings"

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
//
// Consecutive layers that a fused operation covers run as that operation
// (Conv2d→ReLU→MaxPool2d, Conv2d→ReLU, Linear→ReLU: see fuse.go and
// FusionPlan), and CrossEntropyLoss runs a last Linear layer with the loss;
// the results are those of the layers one by one.
type Sequential struct {
	Layers []Layer
	// Unfused runs every layer on its own (SetFusion(s, false)): for
	// debugging, or to compare with the fused run.
	Unfused bool
	// Segments, above 1, splits the layers into that many consecutive
	// groups of about equal length and runs each but the last through
	// tensor.Recompute, as torch.utils.checkpoint.checkpoint_sequential
	// does: training keeps the groups' inputs and outputs, and the
	// backward pass computes each group's activations again (the last
	// group's, which it reads first, are kept).
	Segments int
}

// NewSequential names the layers "0", "1", ..., as torch.nn.Sequential does.
func NewSequential(ms ...Module) *Sequential {
	s := &Sequential{}
	for i, m := range ms {
		s.Layers = append(s.Layers, Layer{Name: strconv.Itoa(i), Module: m})
	}
	return s
}

// Forward applies every layer in turn, groups that a fused operation
// covers as that operation.
func (s *Sequential) Forward(x *tensor.Tensor) *tensor.Tensor {
	return s.run(s.Layers, x)
}

// run is runLayers over layers (s.Layers or its first ones), in s.Segments
// groups where the step records a graph.
func (s *Sequential) run(layers []Layer, x *tensor.Tensor) *tensor.Tensor {
	if sc := x.Scope(); sc == nil || !sc.GradEnabled() {
		return runLayers(layers, s.Unfused, x) // one chain, which gives each input back (evaluation)
	}
	groups := s.segments(layers)
	for _, group := range groups[:len(groups)-1] {
		x = tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor { return runLayers(group, s.Unfused, in[0]) }, x)
	}
	return runLayers(groups[len(groups)-1], s.Unfused, x)
}

// segments splits layers into min(Segments, len(layers)) consecutive
// groups of about equal length (one group when Segments is below 2).
func (s *Sequential) segments(layers []Layer) [][]Layer {
	n := max(min(s.Segments, len(layers)), 1)
	groups := make([][]Layer, 0, n)
	start := 0
	for i := range n {
		end := (i + 1) * len(layers) / n
		groups = append(groups, layers[start:end])
		start = end
	}
	return groups
}

// CrossEntropyLoss is CrossEntropyLoss(s.Forward(x), labels) (the
// package's function), with a last Linear layer and the loss as one
// operation each way where the backend fuses them (tensor.LinearCrossEntropy).
func (s *Sequential) CrossEntropyLoss(x, labels *tensor.Tensor) *tensor.Tensor {
	return s.crossEntropy(x, labels, nil)
}

// LossSum is CrossEntropyLoss that also adds the loss into sum (one
// float32 element outside the graph, a running total on the device), in
// the same operation where the backend fuses them: the trainer's
// LossSummer, so that nn/trainer trains a Sequential classifier this way.
func (s *Sequential) LossSum(x, labels, sum *tensor.Tensor) *tensor.Tensor {
	if sum.DType() != tensor.Float32 || sum.Len() != 1 {
		panic(fmt.Sprintf("nn: Sequential.LossSum into %s %v; want one float32", sum.DType(), sum.Shape()))
	}
	return s.crossEntropy(x, labels, sum)
}

func (s *Sequential) crossEntropy(x, labels, sum *tensor.Tensor) *tensor.Tensor {
	if s.Unfused {
		return crossEntropyOf(unfusedModule{s}, x, labels, sum)
	}
	return crossEntropyOf(s, x, labels, sum)
}

// unfusedModule hides a module's type from crossEntropyOf.
type unfusedModule struct{ Module }

// SetFusion turns fusion on or off for s and the layers inside it.
func (s *Sequential) SetFusion(on bool) {
	s.Unfused = !on
	for _, l := range s.Layers {
		SetFusion(l.Module, on)
	}
}

// FusionPlan says how Forward runs the layers: one entry per operation,
// the names of the layers it covers joined by "+", followed by the rule's
// name in parentheses for a fused group ("0+1+2 (conv2d+relu+maxpool2d)",
// "3", ...). Layers inside a child container are planned by that child.
// With Segments the plan is the training step's, whose groups no fused
// operation spans (evaluation runs the layers as one chain).
func (s *Sequential) FusionPlan() []string {
	var out []string
	for _, group := range s.segments(s.Layers) { // no group fuses across Segments
		for _, st := range plan(group, s.Unfused) {
			names := make([]string, st.n)
			for i := range names {
				names[i] = group[st.start+i].Name
			}
			e := strings.Join(names, "+")
			if st.rule != nil {
				e += " (" + st.rule.name + ")"
			}
			out = append(out, e)
		}
	}
	return out
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
