package optim_test

import (
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// plainBackend is the CPU backend without its optional interfaces (only
// tensor.Backend's methods are promoted), as a device without fused
// optimiser kernels would be.
type plainBackend struct{ tensor.CompleteBackend }

// On a backend without tensor.OptimBackend the optimisers run the CPU's
// kernels on host copies: the same bits as on the CPU itself.
func TestFallbackMatchesFused(t *testing.T) {
	plain := plainBackend{tensor.Complete(tensor.CPU)}
	if _, ok := tensor.Backend(plain).(tensor.OptimBackend); ok {
		t.Fatal("plainBackend has the optimiser kernels")
	}
	run := func(b tensor.Backend, mk func(ps []nn.Parameter) (optim.Optimizer, error)) []float32 {
		l := nn.NewLinear(b, nil, 3, 2)
		opt, err := mk(l.Parameters())
		if err != nil {
			t.Fatal(err)
		}
		x := tensor.FromFloat32(b, nil, []float32{1, -2, 3, 0.5, 0, -1}, 2, 3)
		for step := 0; step < 3; step++ {
			opt.SetLR(0.1 / float64(step+1))
			tensor.Sum(tensor.Mul(l.Forward(x), l.Forward(x))).Backward()
			norm := optim.ClipGradNorm(nil, opt.Gradients(), 2)
			norm.Release()
			opt.StepAndZeroGrad()
		}
		return append(l.Weight.Float32s(), l.Bias.Float32s()...)
	}
	for name, mk := range map[string]func(ps []nn.Parameter) (optim.Optimizer, error){
		"adamw amsgrad": func(ps []nn.Parameter) (optim.Optimizer, error) {
			c := optim.DefaultAdamWConfig()
			c.AMSGrad = true
			return optim.NewAdamGroups(optim.DecayGroups(ps, 0.1, 0.1), c, true)
		},
		"sgd": func(ps []nn.Parameter) (optim.Optimizer, error) {
			return optim.NewSGD(ps, optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		},
	} {
		bitsEqual(t, name+" on a backend without the optimiser kernels", run(plain, mk), run(tensor.CPU, mk))
	}
}
