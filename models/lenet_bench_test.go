package models

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// BenchmarkLeNetStepCPU times one training step (forward, backward, SGD) at
// batch 64 on the CPU backend; multiply by 937 for seconds per epoch.
func BenchmarkLeNetStepCPU(b *testing.B) {
	be := tensor.CPU
	m := NewLeNet(be, 1)
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.01, Momentum: 0.9})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 64*28*28)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int32, 64)
	for i := range y {
		y[i] = int32(rng.IntN(10))
	}
	s := tensor.NewScope()
	defer s.Release()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.Reset()
		xt := tensor.FromFloat32(be, s, x, 64, 1, 28, 28)
		yt := tensor.FromInt32(be, s, y, 64)
		loss := m.Loss(xt, yt)
		sgd.ZeroGrad()
		loss.Backward()
		sgd.Step()
	}
}
