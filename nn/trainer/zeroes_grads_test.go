package trainer_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestCaptureStepZeroesGrads: with StepOptions.ZeroesGrads the first
// (eager, on the CPU) step clears the gradients, the later ones write them
// over instead of adding to zeros, and the training is bit for bit the one
// without it; after the steps every gradient of the two-layer MLP is left
// cleared (with a convolution in the model, none is, and the result is the
// same too).
func TestCaptureStepZeroesGrads(t *testing.T) {
	for _, conv := range []bool{false, true} {
		run := func(zeroes bool) (weights [][]float32, cleared []bool) {
			rng := rand.New(rand.NewPCG(3, 4))
			layers := []nn.Module{nn.Flatten{}, nn.NewLinear(tensor.CPU, rng, 16, 8), nn.ReLU{}, nn.NewLinear(tensor.CPU, rng, 8, 3)}
			if conv {
				layers = append([]nn.Module{nn.NewConv2d(tensor.CPU, rng, 1, 1, 1)}, layers...)
			}
			model := nn.NewSequential(layers...)
			sgd, err := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
			if err != nil {
				t.Fatal(err)
			}
			defer sgd.Release()
			x := tensor.Zeros(tensor.CPU, nil, 4, 1, 4, 4)
			y := tensor.EmptyOf(tensor.CPU, nil, tensor.Int32, 4)
			step, err := trainer.CaptureStep(tensor.CPU, func(s *tensor.Scope) *tensor.Tensor {
				loss := nn.CrossEntropyLoss(model.Forward(x), y)
				loss.Backward()
				sgd.StepAndZeroGrad()
				return loss
			}, trainer.StepOptions{Optimizer: sgd, ZeroesGrads: zeroes})
			if err != nil {
				t.Fatal(err)
			}
			defer step.Close()
			sgd.ZeroGrad()
			xs := make([]float32, 64)
			for i := range 5 {
				for j := range xs {
					xs[j] = rng.Float32()*2 - 1
				}
				x.CopyFrom(xs)
				tensor.CPU.Upload(y.Buffer(), []int32{int32(i % 3), 1, 2, 0})
				if _, err := step.Run(4); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range nn.Parameters(model) {
				cleared = append(cleared, p.Tensor.GradCleared())
				weights = append(weights, p.Tensor.Float32s())
			}
			return weights, cleared
		}
		want, _ := run(false)
		got, cleared := run(true)
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("conv=%v: parameter %d is %v with ZeroesGrads, %v without", conv, i, got[i], want[i])
			}
			if cleared[i] != !conv {
				t.Errorf("conv=%v: parameter %d's gradient cleared %v after the steps, want %v", conv, i, cleared[i], !conv)
			}
		}
	}
}
