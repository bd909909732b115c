package trainer_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// besideCPU is the CPU backend with tensor.BesideOptimBackend, its updates
// run at once and counted.
type besideCPU struct {
	tensor.Backend
	calls *int
}

func (b besideCPU) SGDBeside(p, g, v, _ tensor.Buffer, h tensor.SGDStep) {
	*b.calls++
	tensor.Complete(b).SGD(p, g, v, h)
}

// TestUpdateInBackwardSameBits: a run with Config.UpdateInBackward
// updates the parameters from the backward pass (the backend is asked to)
// and ends with the weights of a run without it.
func TestUpdateInBackwardSameBits(t *testing.T) {
	train := func(on bool) (map[string][]float32, int) {
		calls := 0
		b := besideCPU{tensor.CPU, &calls}
		rng := rand.New(rand.NewPCG(3, 1))
		m := &tiny{FC1: nn.NewLinear(b, rng, side*side, 16), FC2: nn.NewLinear(b, rng, 16, classes)}
		src, err := trainer.NewImages(b, syntheticSet(nTrain, 1), batchSize, 1.0/255, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Release()
		opt, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 1e-3})
		if err != nil {
			t.Fatal(err)
		}
		defer opt.Release()
		opt.InBackwardMin = 1 // each parameter as soon as it is ready
		cfg := trainer.Config{Model: m, Optimizer: opt, Data: src, Epochs: 2, Seed: 5, UpdateInBackward: on, Eager: true}
		if _, err := trainer.Run(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		return params(m), calls
	}
	want, offCalls := train(false)
	got, onCalls := train(true)
	steps := 2 * nTrain / batchSize
	if offCalls != 0 || onCalls != 4*steps {
		t.Errorf("updates from the backward pass: %d without UpdateInBackward, %d with it; want 0 and %d (four parameters, %d steps)", offCalls, onCalls, 4*steps, steps)
	}
	sameBits(t, "UpdateInBackward against StepAndZeroGrad after Backward", got, want)
}
