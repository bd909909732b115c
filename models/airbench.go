package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// AirbenchConfig sets the loss of an Airbench network (its layers are
// fixed: those of zoo.py).
type AirbenchConfig struct {
	// OutputScale multiplies the logits inside Loss only (zoo.py's
	// net(x) / 9), for the reason given at ResNet9Config.
	OutputScale float32
	// LabelSmoothing is Loss's label smoothing (zoo.py's 0.2).
	LabelSmoothing float32
}

// DefaultAirbenchConfig is zoo.py's: logits divided by 9 and label
// smoothing 0.2 in the loss.
func DefaultAirbenchConfig() AirbenchConfig {
	return AirbenchConfig{OutputScale: 1.0 / 9, LabelSmoothing: 0.2}
}

// Airbench is the network of Keller Jordan's airbench94 CIFAR-10 speed
// runs, as zoo.py writes it:
//
//	def cg(ci, co): return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(co), nn.GELU(),
//	                                     nn.Conv2d(co, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.GELU())
//	net = nn.Sequential(nn.Conv2d(3, 24, 2, padding=0, bias=True), nn.GELU(), cg(24, 64), cg(64, 256), cg(256, 256),
//	                    nn.MaxPool2d(3), nn.Flatten(), nn.Linear(256, 10, bias=False))
//
// It takes 3×32×32 images (31, 15, 7, 3 and 1 pixels wide after the
// first convolution and each pooling); its state dict is the Sequential's
// (0.weight, 0.bias, 2.0.weight, 2.2.running_mean, ..., 7.weight).
type Airbench struct {
	Net    *nn.Sequential
	Config AirbenchConfig `nn:"-"`
}

// convPoolGELU is zoo.py's cg.
func convPoolGELU(b tensor.Backend, rng *rand.Rand, in, out int) *nn.Sequential {
	conv3 := func(ci, co int) *nn.Conv2d {
		return nn.NewConv2dWith(b, rng, ci, co, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, NoBias: true})
	}
	return nn.NewSequential(
		conv3(in, out), nn.NewMaxPool2d(2), nn.NewBatchNorm2d(b, out), nn.GELU{},
		conv3(out, out), nn.NewBatchNorm2d(b, out), nn.GELU{},
	)
}

// NewAirbench builds the network on b with PyTorch's default
// initialisation, drawing from a PCG generator seeded with seed.
func NewAirbench(b tensor.Backend, seed uint64, cfg AirbenchConfig) *Airbench {
	rng := rand.New(rand.NewPCG(seed, 0xa1b))
	return &Airbench{Config: cfg, Net: nn.NewSequential(
		nn.NewConv2dWith(b, rng, 3, 24, nn.Conv2dOptions{Kernel: [2]int{2, 2}}),
		nn.GELU{},
		convPoolGELU(b, rng, 24, 64),
		convPoolGELU(b, rng, 64, 256),
		convPoolGELU(b, rng, 256, 256),
		nn.NewMaxPool2d(3),
		nn.Flatten{},
		nn.NewLinearNoBias(b, rng, 256, 10),
	)}
}

// CheckInput returns an error saying what was expected when x is not a
// batch of float32 images [N, 3, 32, 32].
func (m *Airbench) CheckInput(x *tensor.Tensor) error {
	s := x.Shape()
	if len(s) != 4 || s[0] < 1 || s[1] != 3 || s[2] != 32 || s[3] != 32 {
		return fmt.Errorf("models: Airbench takes images [N, 3, 32, 32] (N >= 1), not %v", s)
	}
	if x.DType() != tensor.Float32 {
		return fmt.Errorf("models: Airbench takes normalised float32 images, not %s", x.DType())
	}
	return nil
}

// Forward is Logits.
func (m *Airbench) Forward(x *tensor.Tensor) *tensor.Tensor { return m.Logits(x) }

// Logits maps images [N, 3, 32, 32] to logits [N, 10], as torch's net(x)
// (without OutputScale). It panics, saying what it expects, for a batch of
// another shape.
func (m *Airbench) Logits(x *tensor.Tensor) *tensor.Tensor {
	if err := m.CheckInput(x); err != nil {
		panic(err.Error())
	}
	return m.Net.Forward(x)
}

// Loss is zoo.py's training loss: the mean cross entropy, with
// Config.LabelSmoothing, of Logits(x)·Config.OutputScale against int32
// labels [N].
func (m *Airbench) Loss(x, labels *tensor.Tensor) *tensor.Tensor {
	return scaledLoss(m.Logits(x), labels, m.Config.OutputScale, m.Config.LabelSmoothing)
}

// Parameters lists the learnable tensors under the Sequential's keys.
func (m *Airbench) Parameters() []nn.Parameter { return m.Net.Parameters() }

// Buffers lists the BatchNorm statistics under the Sequential's keys.
func (m *Airbench) Buffers() []nn.Parameter { return m.Net.Buffers() }

// Release frees the parameters, their gradients and the statistics.
func (m *Airbench) Release() { releaseState(m) }
