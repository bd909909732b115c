package models

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// LeNet is the LeNet-style MNIST network: conv 1→20 k5, max-pool 2,
// conv 20→50 k5, max-pool 2, fc 800→500, fc 500→10, with ReLUs. Its
// parameter names and shapes are those of the PyTorch module
//
//	class Net(nn.Module):
//	    def __init__(self):
//	        super().__init__()
//	        self.conv1, self.conv2 = nn.Conv2d(1, 20, 5), nn.Conv2d(20, 50, 5)
//	        self.pool = nn.MaxPool2d(2, 2)
//	        self.fc1, self.fc2 = nn.Linear(800, 500), nn.Linear(500, 10)
//
// so that its state dict loads into that module and back. It is a plain
// nn.Sequential of those layers: the fused operations its steps run
// (convolution + ReLU + pooling, fc1 + ReLU, fc2 + the loss) are what the
// Sequential's fusion picks for them.
type LeNet struct {
	Conv1, Conv2 *nn.Conv2d
	Pool         *nn.MaxPool2d
	FC1, FC2     *nn.Linear
	// net is the layers in order; features all but fc2 (the same layers).
	net, features *nn.Sequential
}

// NewLeNet builds LeNet on b with PyTorch's default initialisation, drawing
// from a PCG generator seeded with seed.
func NewLeNet(b tensor.Backend, seed uint64) *LeNet {
	rng := rand.New(rand.NewPCG(seed, 0x1e1e7))
	m := &LeNet{
		Conv1: nn.NewConv2d(b, rng, 1, 20, 5),
		Conv2: nn.NewConv2d(b, rng, 20, 50, 5),
		Pool:  nn.NewMaxPool2d(2),
		FC1:   nn.NewLinear(b, rng, 800, 500),
		FC2:   nn.NewLinear(b, rng, 500, 10),
	}
	m.layers()
	return m
}

// layers returns the network as a Sequential, made on first use (for a
// LeNet built from its fields).
func (m *LeNet) layers() *nn.Sequential {
	if m.net == nil {
		m.features = &nn.Sequential{Layers: []nn.Layer{
			{Name: "conv1", Module: m.Conv1}, {Name: "relu1", Module: nn.ReLU{}}, {Name: "pool1", Module: m.Pool},
			{Name: "conv2", Module: m.Conv2}, {Name: "relu2", Module: nn.ReLU{}}, {Name: "pool2", Module: m.Pool},
			{Name: "flatten", Module: nn.Flatten{}},
			{Name: "fc1", Module: m.FC1}, {Name: "relu3", Module: nn.ReLU{}},
		}}
		m.net = &nn.Sequential{Layers: append(slices.Clip(m.features.Layers), nn.Layer{Name: "fc2", Module: m.FC2})}
	}
	return m.net
}

// SetFusion turns the fusion of LeNet's layers on or off (nn.SetFusion).
func (m *LeNet) SetFusion(on bool) {
	m.layers().SetFusion(on)
	m.features.SetFusion(on)
}

// FusionPlan is how the layers run (nn.Sequential.FusionPlan).
func (m *LeNet) FusionPlan() []string { return m.layers().FusionPlan() }

// InputShape is the shape of one input image, [1, 28, 28]: LeNet's layers
// fit 28×28 images only (fc1 takes the 50×4×4 features they leave).
func (m *LeNet) InputShape() []int { return []int{1, Side, Side} }

// Side is the width and height of the images LeNet takes.
const Side = 28

// CheckInput returns an error saying what was expected when x is not a
// batch of float32 images [N, 1, 28, 28] with N >= 1.
func (m *LeNet) CheckInput(x *tensor.Tensor) error {
	s := x.Shape()
	if len(s) != 4 || s[0] < 1 || s[1] != 1 || s[2] != Side || s[3] != Side {
		return fmt.Errorf("models: LeNet takes images [N, 1, %d, %d] (N >= 1, one channel, %dx%d pixels), not %v", Side, Side, Side, Side, s)
	}
	if x.DType() != tensor.Float32 {
		return fmt.Errorf("models: LeNet takes normalised float32 images, not %s", x.DType())
	}
	return nil
}

// mustFit panics with CheckInput's message: a batch of the wrong shape is a
// mistake of the calling program (as a shape mismatch in package tensor
// is), and without the check it would be reshaped into wrong answers.
func (m *LeNet) mustFit(x *tensor.Tensor) {
	if err := m.CheckInput(x); err != nil {
		panic(err.Error())
	}
}

// Forward maps a batch of images [N, 1, 28, 28] to logits [N, 10]. It
// panics, saying what it expects, for a batch of any other shape.
func (m *LeNet) Forward(x *tensor.Tensor) *tensor.Tensor {
	m.mustFit(x)
	return m.layers().Forward(x)
}

// Loss is the mean cross entropy of the logits of images x against int32
// labels [N]: CrossEntropy(Forward(x), labels), with the last layer and the
// loss as one operation on backends that fuse them.
func (m *LeNet) Loss(x, labels *tensor.Tensor) *tensor.Tensor {
	m.mustFit(x)
	return m.layers().CrossEntropyLoss(x, labels)
}

// LossSum is Loss that also adds the loss into sum (one float32 element,
// outside the graph): a running total on the device, such as a training
// epoch's, in the same operation where the backend fuses them.
func (m *LeNet) LossSum(x, labels, sum *tensor.Tensor) *tensor.Tensor {
	m.mustFit(x)
	return m.layers().LossSum(x, labels, sum)
}

// Features maps a batch of images to the input of the last layer, fc1's
// activations [N, 500].
func (m *LeNet) Features(x *tensor.Tensor) *tensor.Tensor {
	m.mustFit(x)
	m.layers()
	return m.features.Forward(x)
}

// Parameters lists conv1.weight, conv1.bias, conv2.*, fc1.*, fc2.*: the
// Sequential's names, its layers without parameters naming none.
func (m *LeNet) Parameters() []nn.Parameter { return m.layers().Parameters() }
