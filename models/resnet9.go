package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// ResNet9Config sets the size of a ResNet9. DefaultResNet9Config is the
// network of the benchmark (zoo.py's resnet9, on Fashion-MNIST).
type ResNet9Config struct {
	// InChannels is the number of channels of the input images (1 for
	// Fashion-MNIST, 3 for CIFAR); Classes the number of logits.
	InChannels, Classes int
	// Width is the channel count of the first layer; the later layers
	// have 2, 4 and 8 times as many. 64 is the benchmark's network; a
	// smaller width keeps the layout (and the state dict's keys) for
	// quick tests.
	Width int
	// OutputScale multiplies the logits inside Loss only (zoo.py trains on
	// cross_entropy(net(x) * 0.125)): it tempers the loss's gradients
	// without changing which class is predicted, and Logits stays what
	// torch's net(x) returns, so that checkpoints compare as they are.
	OutputScale float32
	// LabelSmoothing is Loss's label smoothing (zoo.py's 0.1).
	LabelSmoothing float32
}

// DefaultResNet9Config is zoo.py's resnet9: one input channel (28×28
// Fashion-MNIST), 10 classes, width 64, logits scaled by 0.125 and label
// smoothing 0.1 in the loss.
func DefaultResNet9Config() ResNet9Config {
	return ResNet9Config{InChannels: 1, Classes: 10, Width: 64, OutputScale: 0.125, LabelSmoothing: 0.1}
}

// ResNet9 is the ResNet-9 of the DAWNBench CIFAR-10 entries, as zoo.py
// writes it in PyTorch:
//
//	def cbr(ci, co): return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU())
//	class Res(nn.Module):  # a, b = cbr(c, c), cbr(c, c); forward: x + b(a(x))
//	net = nn.Sequential(cbr(1, 64), cbr(64, 128), nn.MaxPool2d(2), Res(128), cbr(128, 256), nn.MaxPool2d(2),
//	                    cbr(256, 512), nn.MaxPool2d(2), Res(512), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(512, 10, bias=False))
//
// Its state dict is that Sequential's: 0.0.weight, 0.1.weight,
// 0.1.running_mean, ..., 3.a.0.weight, ..., 11.weight, so that it loads
// into the PyTorch module with strict=True and back.
type ResNet9 struct {
	Net    *nn.Sequential
	Config ResNet9Config `nn:"-"`
}

// ResidualBlock is zoo.py's Res: x + B(A(x)), its children named a and b.
type ResidualBlock struct{ A, B *nn.Sequential }

// Forward returns x + B(A(x)). In a scope that releases early A's and B's
// outputs are given back as soon as the next operation has read them
// where no backward pass reads them (tensor.ReleaseInput: always in
// evaluation), as a Sequential gives back its layers'.
func (r *ResidualBlock) Forward(x *tensor.Tensor) *tensor.Tensor {
	a := r.A.Forward(x)
	b := r.B.Forward(a)
	if a != x { // a half may give its input back as it is (Identity)
		tensor.ReleaseInput(a, b)
	}
	y := tensor.Add(x, b)
	if b != x {
		tensor.ReleaseInput(b, y)
	}
	return y
}

// ConvBNReLU is zoo.py's cbr: a 3×3 convolution without bias (padding 1,
// so the size is kept), BatchNorm2d and ReLU, as a Sequential (keys 0.weight,
// 1.weight, 1.bias, 1.running_mean, ...).
func ConvBNReLU(b tensor.Backend, rng *rand.Rand, in, out int) *nn.Sequential {
	return nn.NewSequential(
		nn.NewConv2dWith(b, rng, in, out, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, NoBias: true}),
		nn.NewBatchNorm2d(b, out),
		nn.ReLU{},
	)
}

// NewResNet9 builds a ResNet9 on b with PyTorch's default initialisation,
// drawing from a PCG generator seeded with seed. A config with a size
// below one is a mistake of the calling program: it panics saying so.
func NewResNet9(b tensor.Backend, seed uint64, cfg ResNet9Config) *ResNet9 {
	if cfg.InChannels < 1 || cfg.Classes < 1 || cfg.Width < 1 {
		panic(fmt.Sprintf("models: ResNet9 with %d input channels, %d classes, width %d; want each >= 1", cfg.InChannels, cfg.Classes, cfg.Width))
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e59))
	w := cfg.Width
	res := func(c int) *ResidualBlock {
		return &ResidualBlock{A: ConvBNReLU(b, rng, c, c), B: ConvBNReLU(b, rng, c, c)}
	}
	return &ResNet9{Config: cfg, Net: nn.NewSequential(
		ConvBNReLU(b, rng, cfg.InChannels, w),
		ConvBNReLU(b, rng, w, 2*w),
		nn.NewMaxPool2d(2),
		res(2*w),
		ConvBNReLU(b, rng, 2*w, 4*w),
		nn.NewMaxPool2d(2),
		ConvBNReLU(b, rng, 4*w, 8*w),
		nn.NewMaxPool2d(2),
		res(8*w),
		nn.NewAdaptiveMaxPool2d(1, 1),
		nn.Flatten{},
		nn.NewLinearNoBias(b, rng, 8*w, cfg.Classes),
	)}
}

// CheckInput returns an error saying what was expected when x is not a
// batch of float32 images [N, InChannels, H, W] with H and W at least 8
// (the three poolings halve them).
func (m *ResNet9) CheckInput(x *tensor.Tensor) error {
	s := x.Shape()
	c := m.Config.InChannels
	if len(s) != 4 || s[0] < 1 || s[1] != c || s[2] < 8 || s[3] < 8 {
		return fmt.Errorf("models: ResNet9 takes images [N, %d, H, W] (N >= 1, H and W >= 8), not %v", c, s)
	}
	if x.DType() != tensor.Float32 {
		return fmt.Errorf("models: ResNet9 takes normalised float32 images, not %s", x.DType())
	}
	return nil
}

// Forward is Logits: nn.Module's name for it.
func (m *ResNet9) Forward(x *tensor.Tensor) *tensor.Tensor { return m.Logits(x) }

// Logits maps images [N, InChannels, H, W] to logits [N, Classes], as
// torch's net(x) (without OutputScale). It panics, saying what it
// expects, for a batch of another shape.
func (m *ResNet9) Logits(x *tensor.Tensor) *tensor.Tensor {
	if err := m.CheckInput(x); err != nil {
		panic(err.Error())
	}
	return m.Net.Forward(x)
}

// Loss is zoo.py's training loss: the mean cross entropy, with
// Config.LabelSmoothing, of Logits(x)·Config.OutputScale against int32
// labels [N].
func (m *ResNet9) Loss(x, labels *tensor.Tensor) *tensor.Tensor {
	return scaledLoss(m.Logits(x), labels, m.Config.OutputScale, m.Config.LabelSmoothing)
}

// scaledLoss is cross_entropy(logits·scale, labels, label_smoothing);
// a scale of 0 or 1 leaves the logits as they are.
func scaledLoss(logits, labels *tensor.Tensor, scale, smoothing float32) *tensor.Tensor {
	if scale != 0 && scale != 1 {
		logits = tensor.MulScalar(logits, scale)
	}
	return tensor.CrossEntropyLoss(logits, labels, tensor.CrossEntropyOptions{LabelSmoothing: smoothing})
}

// Parameters lists the learnable tensors under the Sequential's keys.
func (m *ResNet9) Parameters() []nn.Parameter { return m.Net.Parameters() }

// Buffers lists the BatchNorm statistics under the Sequential's keys.
func (m *ResNet9) Buffers() []nn.Parameter { return m.Net.Buffers() }

// Release frees the parameters, their gradients and the statistics.
func (m *ResNet9) Release() { releaseState(m) }
