package models_test

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestCapturedStepMatchesEagerGPU trains a narrow ResNet-9 for a few steps
// under OneCycleLR, which changes the learning rate and the momentum
// (SGD's, AdamW's beta1) every step, once with the step captured as a CUDA
// graph and replayed (trainer.CaptureStep) and once eagerly, on fresh
// backends from the same weights and batches. The replay reads the
// schedule's values from the optimiser's device scalars; a replay that
// kept the values of its capture would drift from the eager run at the
// second step. The two runs issue the same kernels with the same
// arguments (convolutions through im2col + cuBLAS, see below), so the
// weights must agree to the bit; the tolerance below (1e-6 relative) only
// leaves room for a library that reorders a sum between a captured and an
// eager launch, and the test logs which of the two held.
func TestCapturedStepMatchesEagerGPU(t *testing.T) {
	requireGPU(t)
	const bs, steps, side = 32, 6, 28
	images, labels := randomBatches(4, steps, bs, side)
	for _, name := range []string{"sgd", "adamw"} {
		t.Run(name, func(t *testing.T) {
			run := func(eager bool) ([]float32, []float32) {
				b := newGPUWithoutCuDNN(t) // captured and eager issue the same kernels
				defer b.Close()
				cfg := models.DefaultResNet9Config()
				cfg.Width = 8
				m := models.NewResNet9(b, 1, cfg)
				defer m.Release()
				var o trainer.Optimizer
				var err error
				if name == "sgd" {
					o, err = optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.2, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4})
				} else {
					o, err = optim.NewAdamW(nn.Parameters(m), optim.DefaultAdamWConfig())
				}
				if err != nil {
					t.Fatal(err)
				}
				sched := optim.NewOneCycleLR(0.2, steps)
				sched.PctStart, sched.AnnealLinear = 0.25, true
				if name == "adamw" {
					sched.MaxLR = 1e-2
				}
				x, y := tensor.Zeros(b, nil, bs, 1, side, side), tensor.FromInt32(b, nil, make([]int32, bs), bs)
				defer x.Release()
				defer y.Release()
				o.ZeroGrad()
				st, err := trainer.CaptureStep(b, func(s *tensor.Scope) *tensor.Tensor {
					loss := m.Loss(s.Borrow(x), y)
					loss.Backward()
					o.StepAndZeroGrad()
					return loss
				}, trainer.StepOptions{Optimizer: o, Eager: eager, Logf: t.Logf})
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				var losses []float32
				for i := range steps {
					b.Upload(x.Buffer(), images[i*bs*side*side:(i+1)*bs*side*side])
					b.Upload(y.Buffer(), labels[i*bs:(i+1)*bs])
					o.SetLR(sched.LR(i))
					mom, _ := sched.MomentumAt(i)
					if err := o.(optim.MomentumSetter).SetMomentum(mom); err != nil {
						t.Fatal(err)
					}
					loss, err := st.Run(bs)
					if err != nil {
						t.Fatal(err)
					}
					losses = append(losses, loss.Item())
				}
				if !eager && !st.Captured(bs) {
					t.Fatalf("the step was not captured: %s", st.Reason())
				}
				if o.Steps() != steps {
					t.Errorf("%d steps counted, want %d", o.Steps(), steps)
				}
				return flatWeights(m), losses
			}
			wc, lc := run(false)
			we, le := run(true)
			t.Logf("losses captured %v, eager %v", lc, le)
			diff, worst := 0, 0.0
			for i := range we {
				if math.Float32bits(wc[i]) != math.Float32bits(we[i]) {
					diff++
					worst = max(worst, math.Abs(float64(wc[i])-float64(we[i]))/math.Max(1, math.Abs(float64(we[i]))))
				}
			}
			t.Logf("%d of %d weights differ in their bits (worst %.3g relative)", diff, len(we), worst)
			if worst > 1e-6 {
				t.Errorf("captured and eager weights differ by %.3g relative after %d steps; want ≤ 1e-6", worst, steps)
			}
			for i := range le {
				if lc[i] != le[i] && math.Abs(float64(lc[i]-le[i])) > 1e-5*math.Abs(float64(le[i])) {
					t.Errorf("step %d: loss %v captured, %v eager", i+1, lc[i], le[i])
				}
			}
		})
	}
}
