package models_test

import (
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestRecomputeGPU trains a small GPT (dropout drawn on the device) for a
// few steps on the GPU, eagerly and captured, with its blocks recomputed
// in the backward pass (nn.RecomputeBlocks) and without: the same kernels
// on the same inputs, so the weights agree bit for bit, and the steps'
// peak of allocated memory falls.
func TestRecomputeGPU(t *testing.T) {
	requireGPU(t)
	const bs, steps = 8, 3
	cfg := models.GPTConfig{Layers: 4, Heads: 4, Channels: 128, Context: 64, Vocab: 37, Dropout: 0.2}
	run := func(eager, recompute bool) (w []float32, peak int) {
		b := newGPUWithoutCuDNN(t)
		defer b.Close()
		m := models.NewGPT(b, 1, cfg)
		defer m.Release()
		if recompute && nn.RecomputeBlocks(m) != cfg.Layers {
			t.Fatal("RecomputeBlocks did not wrap every block")
		}
		dev := tensor.NewDeviceGenerator(b, 7)
		defer dev.Release()
		nn.SetRandomSource(m, dev)
		adam, err := optim.NewAdamW(nn.Parameters(m), optim.DefaultAdamWConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer adam.Release()
		ids, next := make([]int32, bs*cfg.Context), make([]int32, bs*cfg.Context)
		for i := range ids {
			ids[i], next[i] = int32(i*7%cfg.Vocab), int32((i*7+5)%cfg.Vocab)
		}
		x, y := tensor.FromInt32(b, nil, ids, bs, cfg.Context), tensor.FromInt32(b, nil, next, bs, cfg.Context)
		defer x.Release()
		defer y.Release()
		adam.ZeroGrad()
		peak = runCapturedSteps(t, b, func(s *tensor.Scope) *tensor.Tensor {
			loss := m.Loss(s.Borrow(x), s.Borrow(y))
			loss.Backward()
			adam.StepAndZeroGrad()
			return loss
		}, trainer.StepOptions{Optimizer: adam, Eager: eager, Logf: t.Logf}, bs, steps, nil)
		return flatWeights(m), peak
	}
	for _, eager := range []bool{true, false} {
		wp, pp := run(eager, false)
		wr, pr := run(eager, true)
		sameWeightsLowerPeak(t, eager, wp, wr, pp, pr, "without", "with recomputed blocks")
	}
}
