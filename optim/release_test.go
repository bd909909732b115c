package optim_test

import (
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestReleaseLeavesNoLeaks runs the README's training loop, then releases
// the model's parameters and the optimiser: nothing is left for the garbage
// collector to free (tensor.Leaks stays where it was).
func TestReleaseLeavesNoLeaks(t *testing.T) {
	// Other tests of the package leave long-lived tensors to the
	// collector: let it find those first.
	settleGC()
	before := tensor.Leaks()
	func() {
		m := nn.NewSequential(nn.NewLinear(tensor.CPU, nil, 4, 8), nn.ReLU{}, nn.NewLinear(tensor.CPU, nil, 8, 2))
		sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		if err != nil {
			t.Fatal(err)
		}
		defer sgd.Release()
		defer func() {
			for _, p := range nn.Parameters(m) {
				p.Tensor.Release()
			}
		}()
		scope := tensor.NewScope()
		defer scope.Release()
		for range 3 {
			scope.Reset()
			x := tensor.FromFloat32(tensor.CPU, scope, make([]float32, 8), 2, 4)
			y := tensor.FromInt32(tensor.CPU, scope, []int32{0, 1}, 2)
			loss := nn.CrossEntropyLoss(m.Forward(x), y)
			sgd.ZeroGrad()
			loss.Backward()
			sgd.Step()
		}
	}()
	settleGC()
	if d := tensor.Leaks() - before; d != 0 {
		t.Errorf("%d storages left to the garbage collector", d)
	}
}

// settleGC runs the collector until the cleanups of what was garbage have
// run.
func settleGC() {
	for range 3 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoBiasParameter: a layer without bias (a nil parameter) is left out,
// not a panic.
func TestNoBiasParameter(t *testing.T) {
	c := nn.NewConv2d(tensor.CPU, nil, 1, 2, 3)
	c.Bias = nil
	sgd, err := optim.NewSGD(c.Parameters(), optim.SGDConfig{LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	if ps := sgd.Parameters(); len(ps) != 1 || ps[0].Name != "weight" {
		t.Errorf("parameters %v", ps)
	}
	if _, err := optim.NewSGD([]nn.Parameter{{Name: "bias"}}, optim.SGDConfig{LR: 0.1}); err == nil {
		t.Error("no error for nothing to optimise")
	}
}

func TestNonFiniteConfig(t *testing.T) {
	p := param(1)
	defer p.Release()
	ps := []nn.Parameter{{Name: "p", Tensor: p}}
	inf := math.Inf(1)
	for _, c := range []struct {
		cfg  optim.SGDConfig
		want string
	}{
		{optim.SGDConfig{LR: inf}, "learning rate +Inf"},
		{optim.SGDConfig{LR: math.NaN()}, "learning rate NaN"},
		{optim.SGDConfig{LR: 0.1, Momentum: inf}, "momentum +Inf"},
		{optim.SGDConfig{LR: 0.1, Dampening: math.NaN()}, "dampening NaN"},
		{optim.SGDConfig{LR: 0.1, WeightDecay: inf}, "weight decay +Inf"},
	} {
		if _, err := optim.NewSGD(ps, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestReleaseWithDeviceLR: an SGD whose learning rate went to the device
// (SetLR, for schedules) leaves nothing to the collector either.
func TestReleaseWithDeviceLR(t *testing.T) {
	settleGC()
	before := tensor.Leaks()
	func() {
		l := nn.NewLinear(tensor.CPU, nil, 3, 2)
		defer func() {
			for _, p := range nn.Parameters(l) {
				p.Tensor.Release()
			}
		}()
		sgd, err := optim.NewSGD(nn.Parameters(l), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		if err != nil {
			t.Fatal(err)
		}
		sgd.SetLR(0.05)
		sgd.Step()
		sgd.Release()
	}()
	settleGC()
	if d := tensor.Leaks() - before; d != 0 {
		t.Errorf("%d storages left to the garbage collector", d)
	}
}
