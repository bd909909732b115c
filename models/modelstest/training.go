// Package modelstest holds checks that train whole models, shared by the
// tests of several packages: TrainingCurve trains LeNet on synthetic data so
// that the loss curves of two backends can be compared.
package modelstest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// Training-curve settings: those of the MNIST example.
const (
	curveBatch    = 64
	curveLR       = 0.01
	curveMomentum = 0.9
)

// syntheticBatch returns batch step of the deterministic synthetic data set
// of TrainingCurve: 64 28×28 images [64·784] and their labels. Each image is
// Gaussian noise (σ 0.3) plus a bright (+6) 6×6 square whose place depends
// on its class, so that LeNet learns it within a few steps; 40% of the
// labels are then replaced by random ones, so that the loss cannot fall
// towards 0 (the best achievable is about 1.44) and stays a well-conditioned
// quantity to compare between backends over many steps (a loss near 1e-5
// is dominated by float32 cancellation in log-sum-exp − z). It depends only
// on seed and step (PCG and NormFloat64 give the same numbers on every
// platform).
func syntheticBatch(seed uint64, step int) ([]float32, []int32) {
	rng := rand.New(rand.NewPCG(seed, 0x5ca1ab1e+uint64(step)))
	images := make([]float32, curveBatch*28*28)
	labels := make([]int32, curveBatch)
	for i := range labels {
		y := rng.IntN(10)
		labels[i] = int32(y)
		img := images[i*784 : (i+1)*784]
		for j := range img {
			img[j] = float32(0.3 * rng.NormFloat64())
		}
		r0, c0 := 3+(y/5)*13, 1+(y%5)*5
		for r := r0; r < r0+6; r++ {
			for c := c0; c < c0+6; c++ {
				img[r*28+c] += 6
			}
		}
		if rng.Float64() < 0.4 { // label noise
			labels[i] = int32(rng.IntN(10))
		}
	}
	return images, labels
}

// TrainingCurve trains models.NewLeNet(b, seed) with optim.NewSGD (lr 0.01,
// momentum 0.9) for steps steps on deterministic synthetic batches of 64
// 28×28 images generated on the host from seed, and returns the loss of
// every step (computed before that step's update). A device error is
// returned, as is a loss that is not finite (with the losses up to it). All
// device memory is freed on return.
//
// Two backends that agree give the same curve up to float32 rounding, which
// the training dynamics amplify over the steps: on the CPU, perturbing every
// parameter by 1e-6 relative after each step (a stand-in for another
// backend's different rounding) moves the losses by under 5e-6 relative
// over the first 50 steps and by up to about 6e-4 by step 100 (seed 1).
// A comparison at 1e-3 relative is therefore meaningful for up to about 100
// steps; longer curves need a looser bound.
func TrainingCurve(b tensor.Backend, steps int, seed uint64) (losses []float32, err error) {
	if steps < 0 {
		return nil, fmt.Errorf("modelstest: TrainingCurve with %d steps", steps)
	}
	err = tensor.Guard(func() { losses, err = trainingCurve(b, steps, seed) })
	if err == nil {
		err = b.Synchronize()
	}
	return losses, err
}

func trainingCurve(b tensor.Backend, steps int, seed uint64) ([]float32, error) {
	m := models.NewLeNet(b, seed)
	params := nn.Parameters(m)
	opt, err := optim.NewSGD(params, optim.SGDConfig{LR: curveLR, Momentum: curveMomentum})
	if err != nil {
		return nil, err
	}
	scope := tensor.NewScope()
	defer func() {
		scope.Release()
		// Parameters, gradients and momentum are each one packed buffer.
		params[0].Tensor.Release()
		params[0].Tensor.Grad().Release()
		if v := opt.MomentumBuffer(); v != nil {
			v.Release()
		}
	}()
	losses := make([]float32, 0, steps)
	for step := 0; step < steps; step++ {
		scope.Reset()
		images, labels := syntheticBatch(seed, step)
		x := tensor.FromFloat32(b, scope, images, curveBatch, 1, 28, 28)
		y := tensor.FromInt32(b, scope, labels, curveBatch)
		loss := m.Loss(x, y)
		opt.ZeroGrad()
		loss.Backward()
		opt.Step()
		l := loss.Item()
		losses = append(losses, l)
		if math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
			return losses, fmt.Errorf("modelstest: TrainingCurve on %s: loss %g at step %d", b.Name(), l, step)
		}
	}
	return losses, nil
}
