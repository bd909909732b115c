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

// The state dict of zoo.py's airbench net, written out from its
// definition: the first convolution (with bias) is entry 0, its GELU 1,
// cg(24, 64), cg(64, 256) and cg(256, 256) entries 2 to 4 (in each, the
// convolutions are 0 and 4, the BatchNorms 2 and 5), the MaxPool2d(3) 5,
// Flatten 6 and the Linear 7.
func airbenchTorchKeys() []string {
	keys := []string{
		"0.weight [24,3,2,2]", "0.bias [24]",
		"2.0.weight [64,24,3,3]", "2.4.weight [64,64,3,3]",
		"3.0.weight [256,64,3,3]", "3.4.weight [256,256,3,3]",
		"4.0.weight [256,256,3,3]", "4.4.weight [256,256,3,3]",
		"7.weight [10,256]",
	}
	keys = append(keys, batchNormKeys("2.2", 64)...)
	keys = append(keys, batchNormKeys("2.5", 64)...)
	keys = append(keys, batchNormKeys("3.2", 256)...)
	keys = append(keys, batchNormKeys("3.5", 256)...)
	keys = append(keys, batchNormKeys("4.2", 256)...)
	keys = append(keys, batchNormKeys("4.5", 256)...)
	return keys
}

func TestAirbenchStateDict(t *testing.T) {
	m := models.NewAirbench(tensor.CPU, 1, models.DefaultAirbenchConfig())
	defer m.Release()
	sameKeys(t, "airbench", zooKeys(m), airbenchTorchKeys())
	// 288 + 24 (first convolution) + 13824 + 36864 + 147456 + 589824 +
	// 2·589824 (3×3 convolutions) + 2560 (linear) + 2·2·(64 + 256 + 256).
	if n := nn.NumParameters(m); n != 1972792 {
		t.Errorf("%d parameters, want 1972792", n)
	}
}

// A few steps of zoo.py's optimiser (SGD, Nesterov momentum 0.85, weight
// decay 5e-4, label smoothing 0.2, logits / 9) on 4 random 3×32×32 images
// make the loss fall; training and evaluation differ by BatchNorm.
func TestAirbenchTrains(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	m := models.NewAirbench(tensor.CPU, 1, models.DefaultAirbenchConfig())
	defer m.Release()
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1, Momentum: 0.85, Nesterov: true, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	const n, steps = 4, 8
	xv, yv := normals(rng, n*3*32*32), randomLabels(rng, n, 10)
	s := tensor.NewScope()
	var losses []float32
	for range steps {
		s.Reset()
		loss := m.Loss(tensor.FromFloat32(tensor.CPU, s, xv, n, 3, 32, 32), tensor.FromInt32(tensor.CPU, s, yv, n))
		sgd.ZeroGrad()
		loss.Backward()
		sgd.Step()
		losses = append(losses, loss.Item())
	}
	s.Release()
	// The scale 1/9 keeps the logits small, so the loss starts near ln 10
	// and falls slowly; 8 steps on 4 images take off more than 5%.
	if first, last := losses[0], losses[steps-1]; !(last < 0.95*first) {
		t.Errorf("loss %v after %d steps from %v: %v", last, steps, first, losses)
	}

	logits := func() []float32 {
		s := tensor.NewNoGradScope()
		defer s.Release()
		y := m.Logits(tensor.FromFloat32(tensor.CPU, s, xv, n, 3, 32, 32))
		if !slices.Equal(y.Shape(), []int{n, 10}) {
			t.Fatalf("logits %v, want [%d 10]", y.Shape(), n)
		}
		return y.Float32s()
	}
	train := logits()
	nn.SetTraining(m, false)
	if d := maxAbsDiff(train, logits()); d < 1e-4 {
		t.Errorf("training and evaluation logits differ by %v only", d)
	}
	wrong := tensor.Zeros(tensor.CPU, nil, 1, 3, 28, 28)
	defer wrong.Release()
	mustPanic(t, "[N, 3, 32, 32]", func() { m.Logits(wrong) })
}

// Under autocast the first convolution reads its input rounded to
// bfloat16, so images kept in bfloat16 and widened into the float32 batch
// (the zoo's benchmark keeps them so) give the loss and every gradient of
// the float32 images, bit for bit.
func TestAirbenchAutocastSameBitsFromBFloat16Images(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 2))
	const n = 2
	xv, yv := normals(rng, n*3*32*32), randomLabels(rng, n, 10)
	m := models.NewAirbench(tensor.CPU, 1, models.DefaultAirbenchConfig())
	defer m.Release()
	run := func(half bool) (float32, [][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		x := tensor.FromFloat32(tensor.CPU, s, xv, n, 3, 32, 32)
		if half {
			h := tensor.EmptyOf(tensor.CPU, s, tensor.BFloat16, x.Shape()...)
			tensor.CopyTensor(h, x)
			x = tensor.Zeros(tensor.CPU, s, x.Shape()...)
			tensor.CopyTensor(x, h)
		}
		nn.ZeroGrad(m)
		loss := m.Loss(x, tensor.FromInt32(tensor.CPU, s, yv, n))
		loss.Backward()
		var grads [][]float32
		for _, p := range nn.Parameters(m) {
			grads = append(grads, p.Tensor.Grad().Float32s())
		}
		return loss.Item(), grads
	}
	l32, g32 := run(false)
	l16, g16 := run(true)
	if l32 != l16 {
		t.Errorf("loss %v from float32 images, %v from bfloat16 ones", l32, l16)
	}
	for i := range g32 {
		if !slices.Equal(g32[i], g16[i]) {
			t.Errorf("gradient %d differs (max %g)", i, maxAbsDiff(g32[i], g16[i]))
		}
	}
}
