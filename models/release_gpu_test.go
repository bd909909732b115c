package models_test

import (
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestReleaseInBackwardGPU trains a narrow ResNet-9 for a few steps on the
// GPU four ways: eagerly and captured as a CUDA graph, each with the step's
// activations kept until the next step (StepOptions.KeepIntermediates) and
// given back during Backward (the default). Giving memory back changes no
// kernel, only which addresses later tensors get (from the caching
// allocator, or the graph's private pool), so the weights must agree bit
// for bit between kept and released; and the steps' peak of allocated
// memory must fall. The side stream's weight gradients, which read
// activations that the main stream frees meanwhile, run only while a graph
// is captured: the captured runs check that the allocator holds such memory
// back until the side stream is done.
func TestReleaseInBackwardGPU(t *testing.T) {
	requireGPU(t)
	const bs, steps, side = 64, 5, 28
	images, labels := randomBatches(6, steps, bs, side)
	run := func(eager, keep bool) (w []float32, peak int) {
		b := newGPUWithoutCuDNN(t) // the four runs issue the same kernels
		defer b.Close()
		cfg := models.DefaultResNet9Config()
		cfg.Width = 16
		m := models.NewResNet9(b, 1, cfg)
		defer m.Release()
		sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4})
		if err != nil {
			t.Fatal(err)
		}
		defer sgd.Release()
		x, y := tensor.Zeros(b, nil, bs, 1, side, side), tensor.FromInt32(b, nil, make([]int32, bs), bs)
		defer x.Release()
		defer y.Release()
		sgd.ZeroGrad()
		peak = runCapturedSteps(t, b, func(s *tensor.Scope) *tensor.Tensor {
			loss := m.Loss(s.Borrow(x), y)
			loss.Backward()
			sgd.StepAndZeroGrad()
			return loss
		}, trainer.StepOptions{Optimizer: sgd, Eager: eager, KeepIntermediates: keep, Logf: t.Logf}, bs, steps, func(i int) {
			b.Upload(x.Buffer(), images[i*bs*side*side:(i+1)*bs*side*side])
			b.Upload(y.Buffer(), labels[i*bs:(i+1)*bs])
		})
		return flatWeights(m), peak
	}
	for _, eager := range []bool{true, false} {
		wk, pk := run(eager, true)
		wr, pr := run(eager, false)
		sameWeightsLowerPeak(t, eager, wk, wr, pk, pr, "with the activations kept", "with the activations given back")
	}
}
