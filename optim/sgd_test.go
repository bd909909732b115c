package optim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// The expected values below are torch.optim.SGD's, worked out by hand from
// its update rule (with d the gradient after weight decay, v the momentum
// buffer):
//
//	d = g + weight_decay·p
//	v = d                              (first step: buffer := clone(d))
//	v = momentum·v + (1 − dampening)·d (later steps)
//	d = d + momentum·v (nesterov)  or  d = v
//	p = p − lr·d
//
// float32 arithmetic: compared to 1e-6 relative.

const tol = 1e-6

func near(a, b float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b)) }

// param makes a one-element parameter.
func param(v float32) *tensor.Tensor {
	return tensor.FromFloat32(tensor.CPU, nil, []float32{v}, 1).SetRequiresGrad(true)
}

func release(opt *optim.SGD) {
	ps := opt.Parameters()
	ps[0].Tensor.Grad().Release()
	ps[0].Tensor.Release()
	if m := opt.MomentumBuffer(); m != nil {
		m.Release()
	}
}

// run applies steps with the given gradients to a parameter starting at p0
// and returns the parameter after each step.
func run(t *testing.T, cfg optim.SGDConfig, p0 float32, grads ...float32) []float64 {
	t.Helper()
	p := param(p0)
	opt, err := optim.NewSGD([]nn.Parameter{{Name: "p", Tensor: p}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer release(opt)
	var out []float64
	for _, g := range grads {
		p.Grad().CopyFrom([]float32{g})
		opt.Step()
		out = append(out, float64(p.Item()))
	}
	if opt.Steps() != len(grads) {
		t.Errorf("Steps() = %d after %d steps", opt.Steps(), len(grads))
	}
	return out
}

func TestSGDTorchSemantics(t *testing.T) {
	cases := []struct {
		name  string
		cfg   optim.SGDConfig
		p0    float32
		grads []float32
		want  []float64
	}{
		// p = 1 − 0.1·0.5 = 0.95; then 0.95 − 0.05 = 0.9.
		{"plain", optim.SGDConfig{LR: 0.1}, 1, []float32{0.5, 0.5}, []float64{0.95, 0.9}},
		// step 1: v = g = 1 (no momentum term yet), p = 1 − 0.1 = 0.9.
		// step 2: v = 0.9·1 + 0.5 = 1.4, p = 0.9 − 0.14 = 0.76.
		{"momentum", optim.SGDConfig{LR: 0.1, Momentum: 0.9}, 1, []float32{1, 0.5}, []float64{0.9, 0.76}},
		// step 1: v = g = 1 — dampening is NOT applied to the first step
		// (it would give v = 0.5 and p = 0.95), p = 0.9.
		// step 2: v = 0.9·1 + (1 − 0.5)·0.5 = 1.15, p = 0.9 − 0.115 = 0.785.
		{"dampening", optim.SGDConfig{LR: 0.1, Momentum: 0.9, Dampening: 0.5}, 1, []float32{1, 0.5}, []float64{0.9, 0.785}},
		// step 1: v = 1, d = g + 0.9·v = 1.9, p = 1 − 0.19 = 0.81.
		// step 2: v = 0.9·1 + 0.5 = 1.4, d = 0.5 + 0.9·1.4 = 1.76,
		// p = 0.81 − 0.176 = 0.634.
		{"nesterov", optim.SGDConfig{LR: 0.1, Momentum: 0.9, Nesterov: true}, 1, []float32{1, 0.5}, []float64{0.81, 0.634}},
		// step 1: d = 1 + 0.1·2 = 1.2, v = 1.2, p = 2 − 0.12 = 1.88.
		// step 2: d = 0.5 + 0.1·1.88 = 0.688, v = 0.9·1.2 + 0.688 = 1.768,
		// p = 1.88 − 0.1768 = 1.7032.
		{"weight decay + momentum", optim.SGDConfig{LR: 0.1, Momentum: 0.9, WeightDecay: 0.1}, 2, []float32{1, 0.5}, []float64{1.88, 1.7032}},
		// A zero gradient still decays: p = 1 − 0.1·(0 + 0.01·1) = 0.999,
		// then 0.999 − 0.1·0.00999 = 0.998001.
		{"weight decay alone", optim.SGDConfig{LR: 0.1, WeightDecay: 0.01}, 1, []float32{0, 0}, []float64{0.999, 0.998001}},
		// step 1: d = 1 + 0.5·1 = 1.5, v = 1.5, d = 1.5 + 0.9·1.5 = 2.85,
		// p = 1 − 0.285 = 0.715.
		// step 2: d = −1 + 0.5·0.715 = −0.6425, v = 0.9·1.5 − 0.6425 = 0.7075,
		// d = −0.6425 + 0.9·0.7075 = −0.00575, p = 0.715 + 0.000575 = 0.715575.
		{"nesterov + weight decay", optim.SGDConfig{LR: 0.1, Momentum: 0.9, Nesterov: true, WeightDecay: 0.5}, 1, []float32{1, -1}, []float64{0.715, 0.715575}},
		// Zero learning rate: nothing moves.
		{"lr 0", optim.SGDConfig{LR: 0, Momentum: 0.9}, 3, []float32{1, 1}, []float64{3, 3}},
	}
	for _, c := range cases {
		got := run(t, c.cfg, c.p0, c.grads...)
		for i := range c.want {
			if !near(got[i], c.want[i]) {
				t.Errorf("%s: after step %d p = %.7g, torch gives %.7g", c.name, i+1, got[i], c.want[i])
			}
		}
	}
}

// The momentum buffer holds v after each step (step 1: g; step 2:
// 0.9·g1 + (1 − 0.1)·g2 = 0.9·2 + 0.9·(−1) = 0.9).
func TestSGDMomentumBuffer(t *testing.T) {
	p := param(0)
	opt, err := optim.NewSGD([]nn.Parameter{{Name: "p", Tensor: p}}, optim.SGDConfig{LR: 0.1, Momentum: 0.9, Dampening: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	defer release(opt)
	p.Grad().CopyFrom([]float32{2})
	opt.Step()
	if v := opt.MomentumBuffer().Float32s()[0]; !near(float64(v), 2) {
		t.Errorf("momentum after step 1 = %v, want 2", v)
	}
	p.Grad().CopyFrom([]float32{-1})
	opt.Step()
	if v := opt.MomentumBuffer().Float32s()[0]; !near(float64(v), 0.9) {
		t.Errorf("momentum after step 2 = %v, want 0.9", v)
	}
	// Without momentum there is no buffer.
	q := param(0)
	o2, err := optim.NewSGD([]nn.Parameter{{Name: "q", Tensor: q}}, optim.SGDConfig{LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	defer release(o2)
	if o2.MomentumBuffer() != nil {
		t.Errorf("SGD without momentum has a momentum buffer")
	}
}

// Several parameters of different shapes are packed but updated each with
// its own values; gradients that existed before NewSGD are kept; the
// gradients Backward computes land where Step reads them; ZeroGrad zeroes
// them all.
func TestSGDPackedParameters(t *testing.T) {
	l := nn.NewLinear(tensor.CPU, rand.New(rand.NewPCG(1, 1)), 3, 2) // weight [2,3], bias [2]
	w0, b0 := l.Weight.Float32s(), l.Bias.Float32s()
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, []float32{1, 2, 3}, 1, 3)
	tensor.Sum(l.Forward(x)).Backward() // dW = [[1,2,3],[1,2,3]], db = [1,1]
	opt, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	defer release(opt)
	if got := l.Weight.Float32s(); got[0] != w0[0] || got[5] != w0[5] {
		t.Fatalf("NewSGD changed the weights: %v, were %v", got, w0)
	}
	opt.Step() // uses the gradient computed before NewSGD
	check := func(step int, wantW, wantB []float32) {
		t.Helper()
		gw, gb := l.Weight.Float32s(), l.Bias.Float32s()
		for i := range wantW {
			if !near(float64(gw[i]), float64(wantW[i])) {
				t.Fatalf("step %d: weight %v, want %v", step, gw, wantW)
			}
		}
		for i := range wantB {
			if !near(float64(gb[i]), float64(wantB[i])) {
				t.Fatalf("step %d: bias %v, want %v", step, gb, wantB)
			}
		}
	}
	w1 := []float32{w0[0] - 0.5, w0[1] - 1, w0[2] - 1.5, w0[3] - 0.5, w0[4] - 1, w0[5] - 1.5}
	b1 := []float32{b0[0] - 0.5, b0[1] - 0.5}
	check(1, w1, b1)

	opt.ZeroGrad()
	for _, p := range l.Parameters() {
		for _, v := range p.Tensor.Grad().Float32s() {
			if v != 0 {
				t.Fatalf("%s gradient not zeroed: %v", p.Name, p.Tensor.Grad().Float32s())
			}
		}
	}
	x2 := tensor.FromFloat32(tensor.CPU, s, []float32{-1, 0, 2}, 1, 3)
	tensor.Sum(l.Forward(x2)).Backward() // dW rows = [-1,0,2], db = [1,1]
	opt.Step()
	check(2, []float32{w1[0] + 0.5, w1[1], w1[2] - 1, w1[3] + 0.5, w1[4], w1[5] - 1}, []float32{b1[0] - 0.5, b1[1] - 0.5})
}

// SetState restores the step count and momentum so that training resumes
// exactly: an optimiser restored after step 1 of another gives the same
// step 2.
func TestSGDSetState(t *testing.T) {
	cfg := optim.SGDConfig{LR: 0.1, Momentum: 0.9, Dampening: 0.2}
	pa := param(1)
	a, _ := optim.NewSGD([]nn.Parameter{{Name: "p", Tensor: pa}}, cfg)
	defer release(a)
	pa.Grad().CopyFrom([]float32{1})
	a.Step() // v = 1, p = 0.9

	pb := param(0.9)
	b, _ := optim.NewSGD([]nn.Parameter{{Name: "p", Tensor: pb}}, cfg)
	defer release(b)
	if err := b.SetState(a.Steps(), a.MomentumBuffer().Float32s()); err != nil {
		t.Fatal(err)
	}
	if err := b.SetState(1, []float32{1, 2}); err == nil {
		t.Errorf("SetState with 2 momentum values for 1 parameter: no error")
	}
	_ = b.SetState(1, []float32{1})
	for _, o := range []struct {
		opt *optim.SGD
		p   *tensor.Tensor
	}{{a, pa}, {b, pb}} {
		o.p.Grad().CopyFrom([]float32{0.5})
		o.opt.Step()
	}
	// v = 0.9·1 + 0.8·0.5 = 1.3, p = 0.9 − 0.13 = 0.77.
	if ga, gb := pa.Item(), pb.Item(); ga != gb || !near(float64(ga), 0.77) {
		t.Errorf("resumed optimiser: p = %v, original %v, want 0.77", gb, ga)
	}
}

func TestSGDConfigErrors(t *testing.T) {
	p := param(1)
	defer p.Release()
	ps := []nn.Parameter{{Name: "p", Tensor: p}}
	for _, cfg := range []optim.SGDConfig{
		{LR: -0.1},
		{LR: math.NaN()},
		{LR: 0.1, Momentum: -0.9},
		{LR: 0.1, WeightDecay: -1},
		{LR: 0.1, Nesterov: true}, // nesterov needs momentum
		{LR: 0.1, Momentum: 0.9, Dampening: 0.1, Nesterov: true}, // and no dampening
	} {
		if _, err := optim.NewSGD(ps, cfg); err == nil {
			t.Errorf("NewSGD(%+v): no error", cfg)
		}
	}
	if _, err := optim.NewSGD(nil, optim.SGDConfig{LR: 0.1}); err == nil {
		t.Errorf("NewSGD with no parameters: no error")
	}
}

// StepLR: lr = base·gamma^⌊epoch/step⌋, as torch.optim.lr_scheduler.StepLR.
func TestStepLR(t *testing.T) {
	s := optim.StepLR{BaseLR: 0.1, StepSize: 30, Gamma: 0.1}
	for _, c := range []struct {
		epoch int
		want  float64
	}{{0, 0.1}, {1, 0.1}, {29, 0.1}, {30, 0.01}, {59, 0.01}, {60, 0.001}, {95, 0.0001}} {
		if got := s.LR(c.epoch); math.Abs(got-c.want) > 1e-12*c.want {
			t.Errorf("StepLR(0.1, 30, 0.1).LR(%d) = %g, want %g", c.epoch, got, c.want)
		}
	}
	h := optim.StepLR{BaseLR: 1, StepSize: 1, Gamma: 0.5}
	if got := h.LR(3); got != 0.125 {
		t.Errorf("StepLR(1, 1, 0.5).LR(3) = %g, want 0.125", got)
	}
	if got := (optim.StepLR{BaseLR: 0.3, StepSize: 0, Gamma: 0.1}).LR(100); got != 0.3 {
		t.Errorf("StepLR with step size 0: LR %g, want the base 0.3", got)
	}
	// The scheduled rate drives the optimiser: with lr 0.01 from epoch 1
	// the parameter moves 0.1·1 then 0.01·1.
	p := param(1)
	opt, _ := optim.NewSGD([]nn.Parameter{{Name: "p", Tensor: p}}, optim.SGDConfig{LR: 0.1})
	defer release(opt)
	sched := optim.StepLR{BaseLR: 0.1, StepSize: 1, Gamma: 0.1}
	for epoch := 0; epoch < 2; epoch++ {
		opt.LR = sched.LR(epoch)
		p.Grad().CopyFrom([]float32{1})
		opt.Step()
	}
	if got := p.Item(); !near(float64(got), 0.89) {
		t.Errorf("p after two scheduled steps = %v, want 1 − 0.1 − 0.01 = 0.89", got)
	}
}

// A second optimiser on the same parameters (to change hyper-parameters
// or restart momentum) must work: the parameters keep their values and the
// new optimiser updates them.
func TestSGDTwiceOnSameParameters(t *testing.T) {
	l := nn.NewLinear(tensor.CPU, nil, 4, 3)
	w0 := l.Weight.Float32s()
	a, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	_ = a
	b, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	defer release(b)
	equalVals(t, "weights after a second NewSGD", l.Weight.Float32s(), w0)
	for _, p := range l.Parameters() {
		p.Tensor.Grad().CopyFrom(make([]float32, p.Tensor.Len()))
	}
	l.Bias.Grad().CopyFrom([]float32{1, 1, 1})
	b0 := l.Bias.Float32s()
	b.Step()
	got := l.Bias.Float32s()
	for i := range got {
		if !near(float64(got[i]), float64(b0[i])-0.1) {
			t.Fatalf("bias after a step of the second optimiser: %v, want %v − 0.1", got, b0)
		}
	}
	equalVals(t, "weights after a zero-gradient step", l.Weight.Float32s(), w0)
}

func equalVals(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
}

// StepAndZeroGrad is Step then ZeroGrad: the same parameters and momentum,
// and zero gradients afterwards.
func TestSGDStepAndZeroGrad(t *testing.T) {
	run := func(fused bool) (params, grads, momentum []float32) {
		l := nn.NewLinear(tensor.CPU, nil, 3, 2)
		opt, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9, WeightDecay: 0.01})
		if err != nil {
			t.Fatal(err)
		}
		x := tensor.FromFloat32(tensor.CPU, nil, []float32{1, -2, 3, 0.5, 0, -1}, 2, 3)
		for step := 0; step < 3; step++ {
			tensor.Sum(l.Forward(x)).Backward()
			if fused {
				opt.StepAndZeroGrad()
			} else {
				opt.Step()
				opt.ZeroGrad()
			}
		}
		params = append(l.Weight.Float32s(), l.Bias.Float32s()...)
		grads = append(l.Weight.Grad().Float32s(), l.Bias.Grad().Float32s()...)
		return params, grads, opt.MomentumBuffer().Float32s()
	}
	p1, g1, v1 := run(false)
	p2, g2, v2 := run(true)
	for i := range p1 {
		if p1[i] != p2[i] {
			t.Errorf("parameter %d: %g after StepAndZeroGrad, %g after Step and ZeroGrad", i, p2[i], p1[i])
		}
	}
	for i := range v1 {
		if v1[i] != v2[i] {
			t.Errorf("momentum %d: %g after StepAndZeroGrad, %g after Step and ZeroGrad", i, v2[i], v1[i])
		}
	}
	for i, g := range g2 {
		if g != 0 || g1[i] != 0 {
			t.Errorf("gradient %d not zeroed: %g (fused), %g", i, g, g1[i])
		}
	}
}
