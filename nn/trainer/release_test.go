package trainer_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestCaptureStepReleasesInBackward: a step's scope gives the activations
// back during Backward, so that after the step only its loss (and what the
// step function keeps) is live; the training is bit for bit the one that
// keeps every intermediate (KeepIntermediates), which holds them all.
func TestCaptureStepReleasesInBackward(t *testing.T) {
	run := func(keep bool) (weights []float32, losses []float32, afterStep int) {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(3, 4))
		model := nn.NewSequential(nn.NewLinear(c, rng, 16, 64), nn.ReLU{}, nn.NewLinear(c, rng, 64, 64), nn.ReLU{}, nn.NewLinear(c, rng, 64, 4))
		sgd, err := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		if err != nil {
			t.Fatal(err)
		}
		defer sgd.Release()
		const n = 32
		xs := make([]float32, n*16)
		ys := make([]int32, n)
		for i := range xs {
			xs[i] = float32(rng.NormFloat64())
		}
		for i := range ys {
			ys[i] = int32(i % 4)
		}
		x, y := tensor.FromFloat32(c, nil, xs, n, 16), tensor.FromInt32(c, nil, ys, n)
		defer x.Release()
		defer y.Release()
		var scope *tensor.Scope
		step, err := trainer.CaptureStep(c, func(s *tensor.Scope) *tensor.Tensor {
			scope = s
			loss := nn.CrossEntropyLoss(model.Forward(s.Borrow(x)), y)
			loss.Backward()
			sgd.StepAndZeroGrad()
			return loss
		}, trainer.StepOptions{Optimizer: sgd, KeepIntermediates: keep})
		if err != nil {
			t.Fatal(err)
		}
		defer step.Close()
		sgd.ZeroGrad()
		for range 5 {
			loss, err := step.Run(n)
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, loss.Item())
		}
		// What the last step's scope still holds.
		live := c.Live()
		scope.Reset()
		afterStep = live - c.Live()
		if scope.ReleasesInBackward() == keep {
			t.Errorf("KeepIntermediates %v: the step's scope releases in backward: %v", keep, scope.ReleasesInBackward())
		}
		for _, p := range nn.Parameters(model) {
			weights = append(weights, p.Tensor.Float32s()...)
		}
		if c.BadFrees() != 0 {
			t.Errorf("%d double frees", c.BadFrees())
		}
		return weights, losses, afterStep
	}
	wk, lk, kept := run(true)
	we, le, early := run(false)
	for i := range lk {
		if math.Float32bits(lk[i]) != math.Float32bits(le[i]) {
			t.Fatalf("losses %v releasing in backward, %v keeping", le, lk)
		}
	}
	for i := range wk {
		if math.Float32bits(wk[i]) != math.Float32bits(we[i]) {
			t.Fatalf("weight %d: %v releasing in backward, %v keeping", i, we[i], wk[i])
		}
	}
	// Keeping: the previous step's tensors are freed and this one's kept,
	// [32, 64] activations and more. Releasing: the loss and its seed.
	t.Logf("live after a step: %d B releasing, %d B keeping", early, kept)
	if early > 64 || kept < 4*32*64*4 {
		t.Errorf("a step leaves %d B live releasing in backward, %d B keeping", early, kept)
	}
}
