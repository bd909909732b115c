package optim_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// besideCPU is the CPU backend with tensor.BesideOptimBackend: the update
// runs at once, and the calls are counted, so that the in-backward
// updates' bookkeeping is tested without a second stream.
type besideCPU struct {
	tensor.Backend
	calls *int
}

func (b besideCPU) SGDBeside(p, g, v, _ tensor.Buffer, h tensor.SGDStep) {
	*b.calls++
	tensor.Complete(b).SGD(p, g, v, h)
}

// inBackwardNet is two layers and a third that the forward pass never
// uses (its parameters get no gradient and no hook call).
type inBackwardNet struct {
	Body   *nn.Sequential
	Unused *nn.Linear
}

// trainInBackward runs steps of a small net on b from one seed and
// returns its parameters after each step.
func trainInBackward(t *testing.T, b tensor.Backend, cfg optim.SGDConfig, inBackwardMin int, deviceScalars bool, steps int) [][]float32 {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	net := &inBackwardNet{
		Body:   nn.NewSequential(nn.NewLinear(b, rng, 5, 7), nn.ReLU{}, nn.NewLinear(b, rng, 7, 3)),
		Unused: nn.NewLinear(b, rng, 2, 2),
	}
	opt, err := optim.NewSGD(nn.Parameters(net), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Release()
	if deviceScalars {
		opt.SetLR(cfg.LR)
	}
	opt.InBackwardMin = inBackwardMin
	opt.UpdateInBackward(inBackwardMin > 0)
	var out [][]float32
	for step := range steps {
		x := make([]float32, 4*5)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		labels := []int32{0, 2, 1, int32(step % 3)}
		s := tensor.NewScope()
		loss := tensor.CrossEntropy(net.Body.Forward(tensor.FromFloat32(b, s, x, 4, 5)), tensor.FromInt32(b, s, labels, 4))
		opt.BeginGradients()
		loss.Backward()
		opt.StepAndZeroGrad()
		s.Release()
		var ps []float32
		for _, p := range nn.Parameters(net) {
			ps = append(ps, p.Tensor.Float32s()...)
		}
		out = append(out, ps)
	}
	return out
}

// TestSGDUpdateInBackwardSameBits: the updates queued by the backward
// pass, and StepAndZeroGrad's of the parameters it did not reach, give the
// bits of StepAndZeroGrad after Backward, with momentum, weight decay,
// dampening or Nesterov, on host and device scalars; and the backward
// pass queued as many as the threshold says. The net's packed parameters:
// the first layer's weight (35) and bias (7), the second's (21 and 3), the
// unused layer's (4 and 2), which no pass reaches.
func TestSGDUpdateInBackwardSameBits(t *testing.T) {
	const steps = 3
	for _, cfg := range []optim.SGDConfig{
		{LR: 0.1},
		{LR: 0.05, Momentum: 0.9, WeightDecay: 1e-2},
		{LR: 0.05, Momentum: 0.9, Dampening: 0.3},
		{LR: 0.05, Momentum: 0.9, Nesterov: true},
	} {
		for _, dev := range []bool{false, true} {
			calls := 0
			b := besideCPU{tensor.CPU, &calls}
			want := trainInBackward(t, b, cfg, 0, dev, steps)
			if calls != 0 {
				t.Fatalf("%+v: %d updates beside the backward pass with UpdateInBackward off", cfg, calls)
			}
			for _, c := range []struct{ min, perStep int }{
				{1, 4},    // each parameter alone
				{24, 2},   // a layer's weight and bias together
				{66, 1},   // both layers at once
				{1000, 0}, // all left to StepAndZeroGrad
			} {
				calls = 0
				got := trainInBackward(t, b, cfg, c.min, dev, steps)
				if calls != c.perStep*steps {
					t.Errorf("%+v device scalars %v, at least %d elements: %d updates beside the backward pass, want %d", cfg, dev, c.min, calls, c.perStep*steps)
				}
				for s := range want {
					for i := range want[s] {
						if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
							t.Fatalf("%+v device scalars %v, at least %d elements: step %d parameter value %d = %v, want %v", cfg, dev, c.min, s+1, i, got[s][i], want[s][i])
						}
					}
				}
			}
		}
	}
}

// TestSGDUpdateInBackwardStepPanics: Step (which keeps the gradients)
// after a pass that updated parameters and zeroed their gradients is a
// misuse, said as such.
func TestSGDUpdateInBackwardStepPanics(t *testing.T) {
	calls := 0
	b := besideCPU{tensor.CPU, &calls}
	l := nn.NewLinear(b, rand.New(rand.NewPCG(1, 2)), 3, 2)
	opt, err := optim.NewSGD(nn.Parameters(l), optim.SGDConfig{LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Release()
	opt.InBackwardMin = 1
	opt.UpdateInBackward(true)
	s := tensor.NewScope()
	defer s.Release()
	tensor.Sum(l.Forward(tensor.FromFloat32(b, s, []float32{1, 2, 3}, 1, 3))).Backward()
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, "StepAndZeroGrad") {
			t.Errorf("Step after an updating pass: recovered %v; want a panic that names StepAndZeroGrad", r)
		}
	}()
	opt.Step()
}
