package models_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// The state dict of zoo.py's resnet9 as torch lists it (print({k: v.shape
// for k, v in net.state_dict().items()})), written out from the module's
// definition: cbr(1, 64) is entry 0, cbr(64, 128) 1, the pools 2, 5, 7 and
// 9, Res(128) 3 (children a and b), cbr(128, 256) 4, cbr(256, 512) 6,
// Res(512) 8, the Linear 11.
func resnet9TorchKeys() []string {
	keys := []string{
		"0.0.weight [64,1,3,3]",
		"1.0.weight [128,64,3,3]",
		"3.a.0.weight [128,128,3,3]",
		"3.b.0.weight [128,128,3,3]",
		"4.0.weight [256,128,3,3]",
		"6.0.weight [512,256,3,3]",
		"8.a.0.weight [512,512,3,3]",
		"8.b.0.weight [512,512,3,3]",
		"11.weight [10,512]",
	}
	keys = append(keys, batchNormKeys("0.1", 64)...)
	keys = append(keys, batchNormKeys("1.1", 128)...)
	keys = append(keys, batchNormKeys("3.a.1", 128)...)
	keys = append(keys, batchNormKeys("3.b.1", 128)...)
	keys = append(keys, batchNormKeys("4.1", 256)...)
	keys = append(keys, batchNormKeys("6.1", 512)...)
	keys = append(keys, batchNormKeys("8.a.1", 512)...)
	keys = append(keys, batchNormKeys("8.b.1", 512)...)
	return keys
}

func TestResNet9StateDict(t *testing.T) {
	m := models.NewResNet9(tensor.CPU, 1, models.DefaultResNet9Config())
	defer m.Release()
	sameKeys(t, "resnet9", zooKeys(m), resnet9TorchKeys())
	// 576 + 73728 + 2·147456 + 294912 + 1179648 + 2·2359296 (convolutions)
	// + 5120 (linear) + 2·(64 + 3·128 + 256 + 3·512) (BatchNorm affine).
	if n := nn.NumParameters(m); n != 6571968 {
		t.Errorf("%d parameters, want 6571968", n)
	}
	// Torch's defaults: BatchNorm weight 1, bias 0, running statistics 0
	// and 1; convolutions uniform within ±1/sqrt(fan_in).
	bn := m.Net.Layers[0].Module.(*nn.Sequential).Layers[1].Module.(*nn.BatchNorm2d)
	if w, rv := bn.Weight.Float32s(), bn.RunningVar.Float32s(); w[0] != 1 || rv[63] != 1 || bn.Bias.Float32s()[0] != 0 {
		t.Errorf("BatchNorm starts at weight %v, running_var %v", w[0], rv[63])
	}
	conv := m.Net.Layers[1].Module.(*nn.Sequential).Layers[0].Module.(*nn.Conv2d)
	if d := maxAbsDiff(conv.Weight.Float32s(), make([]float32, conv.Weight.Len())); d > 1/24.0 || d < 0.9/24 {
		t.Errorf("conv 64→128 weights up to %v, want close to 1/sqrt(576) = 1/24", d)
	}

	rgb := models.NewResNet9(tensor.CPU, 1, models.ResNet9Config{InChannels: 3, Classes: 100, Width: 64})
	defer rgb.Release()
	keys := zooKeys(rgb)
	if !slices.Contains(keys, "0.0.weight [64,3,3,3]") || !slices.Contains(keys, "11.weight [100,512]") {
		t.Errorf("3 channels, 100 classes: state dict %v", keys)
	}
	mustPanic(t, "want each >= 1", func() { models.NewResNet9(tensor.CPU, 1, models.ResNet9Config{InChannels: 1, Classes: 10}) })
}

// smallResNet9 is the benchmark's layout at width 8 (8, 16, 32, 64
// channels), small enough to train on the CPU in a test.
func smallResNet9(channels int) *models.ResNet9 {
	cfg := models.DefaultResNet9Config()
	cfg.InChannels, cfg.Width = channels, 8
	return models.NewResNet9(tensor.CPU, 1, cfg)
}

// A few steps of zoo.py's optimiser (SGD, Nesterov momentum 0.9, weight
// decay 5e-4, label smoothing 0.1 and the 0.125 scale) on one batch of 8
// random images make its loss fall, on Fashion-MNIST's 1×28×28 and
// CIFAR's 3×32×32; every step advances the BatchNorm counts.
func TestResNet9Trains(t *testing.T) {
	for _, shape := range [][3]int{{1, 28, 28}, {3, 32, 32}} {
		rng := rand.New(rand.NewPCG(5, uint64(shape[0])))
		m := smallResNet9(shape[0])
		sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.2, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4})
		if err != nil {
			t.Fatal(err)
		}
		const n, steps = 8, 12
		xv, yv := normals(rng, n*shape[0]*shape[1]*shape[2]), randomLabels(rng, n, 10)
		s := tensor.NewScope()
		var losses []float32
		for range steps {
			s.Reset()
			x := tensor.FromFloat32(tensor.CPU, s, xv, n, shape[0], shape[1], shape[2])
			loss := m.Loss(x, tensor.FromInt32(tensor.CPU, s, yv, n))
			sgd.ZeroGrad()
			loss.Backward()
			sgd.Step()
			losses = append(losses, loss.Item())
		}
		s.Release()
		// A uniform prediction's loss is ln 10 = 2.30 with or without
		// smoothing; memorising 8 labels takes it well below.
		if first, last := losses[0], losses[steps-1]; !(last < 0.8*first) {
			t.Errorf("%v images: loss %v after %d steps from %v; want a fall of 20%%: %v", shape, last, steps, first, losses)
		}
		bn := m.Net.Layers[0].Module.(*nn.Sequential).Layers[1].Module.(*nn.BatchNorm2d)
		if c := countOf(bn); c != steps {
			t.Errorf("num_batches_tracked %v after %d steps", c, steps)
		}
		sgd.Release()
		m.Release()
	}
}

// In training BatchNorm uses the batch's statistics and updates the
// running ones; in evaluation it uses the running ones and changes
// nothing: the same images give other logits, and evaluation repeats
// itself exactly.
func TestResNet9TrainEval(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	m := smallResNet9(1)
	defer m.Release()
	xv := normals(rng, 4*28*28)
	logits := func() []float32 {
		s := tensor.NewNoGradScope()
		defer s.Release()
		y := m.Logits(tensor.FromFloat32(tensor.CPU, s, xv, 4, 1, 28, 28))
		if !slices.Equal(y.Shape(), []int{4, 10}) {
			t.Fatalf("logits %v, want [4 10]", y.Shape())
		}
		return y.Float32s()
	}
	bn := m.Net.Layers[0].Module.(*nn.Sequential).Layers[1].Module.(*nn.BatchNorm2d)
	train := logits()
	if countOf(bn) != 1 || slices.Equal(bn.RunningMean.Float32s(), make([]float32, 8)) {
		t.Fatal("a training forward pass did not update the running statistics")
	}
	nn.SetTraining(m, false)
	before := bn.RunningMean.Float32s()
	eval := logits()
	if d := maxAbsDiff(train, eval); d < 1e-3 {
		t.Errorf("training and evaluation logits differ by %v only", d)
	}
	if again := logits(); !slices.Equal(again, eval) || !slices.Equal(bn.RunningMean.Float32s(), before) || countOf(bn) != 1 {
		t.Error("evaluation changed the running statistics or did not repeat itself")
	}
	wrong := tensor.Zeros(tensor.CPU, nil, 2, 3, 28, 28)
	defer wrong.Release()
	mustPanic(t, "[N, 1, H, W]", func() { m.Logits(wrong) })
}

// ResNet-9's evaluation in a no-grad scope that releases early gives each
// activation back once the next operation has read it: after the forward
// pass only the batch and the logits are left (the residual blocks' halves
// included).
func TestResNet9EvaluationGivesActivationsBack(t *testing.T) {
	c := tensor.NewCountingCPU()
	cfg := models.DefaultResNet9Config()
	cfg.Width = 8
	m := models.NewResNet9(c, 1, cfg)
	defer m.Release()
	s := tensor.NewNoGradScope()
	s.SetReleaseInBackward(true)
	defer s.Release()
	start := c.Live()
	x := tensor.Zeros(c, s, 4, 1, 28, 28)
	y := m.Forward(x)
	if left, want := c.Live()-start, 4*(x.Len()+y.Len()); left > want+1024 {
		t.Errorf("%d B left after the evaluation's forward pass; want the batch and the logits, %d B", left, want)
	}
}

// A residual block whose halves give their input back as it is (empty
// Sequentials) leaves the caller's input alone in evaluation.
func TestResidualBlockIdentityHalvesKeepTheInput(t *testing.T) {
	c := tensor.NewCountingCPU()
	r := &models.ResidualBlock{A: nn.NewSequential(), B: nn.NewSequential()}
	s := tensor.NewNoGradScope()
	s.SetReleaseInBackward(true)
	defer s.Release()
	x := tensor.Full(c, s, 1.5, 2, 3)
	y := r.Forward(x)
	if got := x.Float32s()[0]; got != 1.5 || y.Float32s()[0] != 3 {
		t.Errorf("input %v and output %v after x + B(A(x)) with identity halves; want 1.5 and 3", got, y.Float32s()[0])
	}
}
