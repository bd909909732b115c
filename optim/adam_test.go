package optim_test

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// The expected values are torch.optim.Adam's and AdamW's, written out step
// by step from torch's update rule (torch/optim/adam.py, single-tensor
// path) with t the step number:
//
//	g = g + wd·p (Adam)            p = p·(1 − lr·wd) (AdamW)
//	m = m + (1 − β1)·(g − m)       (exp_avg.lerp_(g, 1 − β1))
//	v = β2·v + (1 − β2)·g²
//	denom = √v / √(1 − β2^t) + eps (amsgrad: √max(v) over the steps)
//	p = p − lr/(1 − β1^t) · m / denom
//
// with β1 = 0.9, β2 = 0.999, eps = 1e-8, so 1 − β1^t is 0.1, 0.19, 0.271
// and 1 − β2^t is 0.001, 0.001999, 0.002997001. The arithmetic below is
// float64; the optimiser's is float32, so values are compared to 2e-6
// relative (a few float32 roundings per step, over up to three steps).

const adamTol = 2e-6

func adamNear(a, b float64) bool { return math.Abs(a-b) <= adamTol*math.Max(1, math.Abs(b)) }

// runAdam applies one step per gradient to a one-element parameter starting
// at p0 and returns the parameter after each step; lrAt, if not nil, gives
// the learning rate set (SetLR) before each step.
func runAdam(t *testing.T, cfg optim.AdamConfig, decoupled bool, p0 float32, grads []float32, lrAt func(step int) float64) []float64 {
	t.Helper()
	p := param(p0)
	ps := []nn.Parameter{{Name: "p", Tensor: p}}
	var opt *optim.Adam
	var err error
	if decoupled {
		opt, err = optim.NewAdamW(ps, cfg)
	} else {
		opt, err = optim.NewAdam(ps, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Release()
	var out []float64
	for i, g := range grads {
		if lrAt != nil {
			opt.SetLR(lrAt(i))
		}
		p.Grad().CopyFrom([]float32{g})
		opt.Step()
		out = append(out, float64(p.Item()))
	}
	if opt.Steps() != len(grads) {
		t.Errorf("Steps() = %d after %d steps", opt.Steps(), len(grads))
	}
	return out
}

func TestAdamTorchSemantics(t *testing.T) {
	sq := math.Sqrt
	adam := func(lr, wd float64, amsgrad bool) optim.AdamConfig {
		c := optim.DefaultAdamConfig()
		c.LR, c.WeightDecay, c.AMSGrad = lr, wd, amsgrad
		return c
	}
	var want []float64
	// The bias corrections 1 − β^t of steps 1, 2, 3.
	bc1 := []float64{0.1, 0.19, 0.271}
	bc2 := []float64{0.001, 0.001999, 0.002997001}

	// Plain Adam, lr 0.1, p0 = 1, gradients 0.5 then −1.
	// step 1: m = 0.05, v = 0.001·0.25 = 2.5e-4.
	// step 2: m = 0.05 + 0.1·(−1 − 0.05) = −0.055, v = 0.999·2.5e-4 + 0.001 = 0.00124975.
	p1 := 1 - (0.1/bc1[0])*0.05/(sq(2.5e-4)/sq(bc2[0])+1e-8)
	p2 := p1 - (0.1/0.19)*(-0.055)/(sq(0.00124975)/sq(0.001999)+1e-8)
	check(t, "adam", runAdam(t, adam(0.1, 0, false), false, 1, []float32{0.5, -1}, nil), []float64{p1, p2})

	// Adam with L2 weight decay 0.1, lr 0.01, p0 = 2, gradient 1 twice.
	// step 1: g = 1 + 0.1·2 = 1.2, m = 0.12, v = 0.001·1.44 = 0.00144.
	// step 2: g = 1 + 0.1·p1, m = 0.12 + 0.1·(g − 0.12), v = 0.999·0.00144 + 0.001·g².
	p1 = 2 - (0.01/bc1[0])*0.12/(sq(0.00144)/sq(0.001)+1e-8)
	g2 := 1 + 0.1*p1
	m2 := 0.12 + 0.1*(g2-0.12)
	v2 := 0.999*0.00144 + 0.001*g2*g2
	p2 = p1 - (0.01/0.19)*m2/(sq(v2)/sq(0.001999)+1e-8)
	check(t, "adam weight decay", runAdam(t, adam(0.01, 0.1, false), false, 2, []float32{1, 1}, nil), []float64{p1, p2})

	// AdamW, weight decay 0.1, lr 0.01, p0 = 2, gradient 1 twice: the decay
	// multiplies p by 1 − 0.001 first and leaves the gradient alone.
	// step 1: m = 0.1, v = 0.001.  step 2: m = 0.19, v = 0.001999.
	p1 = 2*0.999 - (0.01/bc1[0])*0.1/(sq(0.001)/sq(bc2[0])+1e-8)
	p2 = p1*0.999 - (0.01/0.19)*0.19/(sq(0.001999)/sq(bc2[1])+1e-8)
	check(t, "adamw", runAdam(t, adam(0.01, 0.1, false), true, 2, []float32{1, 1}, nil), []float64{p1, p2})

	// AMSGrad, lr 0.1, p0 = 0, gradients 1, 0.1, 0: at step 3 v falls
	// (0.999·0.001009) below its maximum 0.001009, which the denominator
	// keeps. m: 0.1, 0.1, 0.09.
	p1 = 0 - (0.1/bc1[0])*0.1/(sq(0.001)/sq(bc2[0])+1e-8)
	p2 = p1 - (0.1/0.19)*0.1/(sq(0.001009)/sq(0.001999)+1e-8)
	p3 := p2 - (0.1/0.271)*0.09/(sq(0.001009)/sq(0.002997001)+1e-8)
	want = []float64{p1, p2, p3}
	check(t, "amsgrad", runAdam(t, adam(0.1, 0, true), false, 0, []float32{1, 0.1, 0}, nil), want)
	// Without amsgrad step 3 divides by √(0.999·0.001009) instead.
	p3 = p2 - (0.1/0.271)*0.09/(sq(0.999*0.001009)/sq(0.002997001)+1e-8)
	check(t, "no amsgrad", runAdam(t, adam(0.1, 0, false), false, 0, []float32{1, 0.1, 0}, nil), []float64{p1, p2, p3})

	// eps goes after the square root and the bias correction: a gradient of
	// 1e-9 gives √v/√(1 − β2) = 1e-9, denom = 1.1e-8, a step of lr·1e-10/
	// 1.1e-8 = 0.00909·lr/0.1 (eps inside the root, or before the
	// correction, would give a step 30 times smaller).
	check(t, "eps", runAdam(t, adam(0.1, 0, false), false, 0, []float32{1e-9}, nil),
		[]float64{-(0.1 / bc1[0]) * 1e-10 / (1e-9 + 1e-8)})

	// The learning rate set before each step (a schedule) takes effect
	// through the device scalars: lr 0.1, then 0.05 for step 2 (plain case).
	p1 = 1 - (0.1/bc1[0])*0.05/(sq(2.5e-4)/sq(bc2[0])+1e-8)
	p2 = p1 - (0.05/0.19)*(-0.055)/(sq(0.00124975)/sq(0.001999)+1e-8)
	check(t, "scheduled lr", runAdam(t, adam(0.1, 0, false), false, 1, []float32{0.5, -1},
		func(step int) float64 { return []float64{0.1, 0.05}[step] }), []float64{p1, p2})
}

func check(t *testing.T, name string, got, want []float64) {
	t.Helper()
	for i := range want {
		if !adamNear(got[i], want[i]) {
			t.Errorf("%s: after step %d p = %.9g, torch gives %.9g", name, i+1, got[i], want[i])
		}
	}
}

func TestAdamDefaults(t *testing.T) {
	a, w := optim.DefaultAdamConfig(), optim.DefaultAdamWConfig()
	if a.LR != 1e-3 || a.Beta1 != 0.9 || a.Beta2 != 0.999 || a.Eps != 1e-8 || a.WeightDecay != 0 || a.AMSGrad {
		t.Errorf("DefaultAdamConfig() = %+v, torch's are lr 1e-3, betas (0.9, 0.999), eps 1e-8, no decay", a)
	}
	if w.WeightDecay != 0.01 || w.LR != 1e-3 || w.Beta1 != 0.9 || w.Beta2 != 0.999 || w.Eps != 1e-8 {
		t.Errorf("DefaultAdamWConfig() = %+v, torch's AdamW adds weight decay 0.01", w)
	}
	p := param(1)
	ps := []nn.Parameter{{Name: "p", Tensor: p}}
	for _, c := range []optim.AdamConfig{{LR: -1, Beta1: 0.9, Beta2: 0.999}, {LR: 1, Beta1: 1, Beta2: 0.999},
		{LR: 1, Beta1: 0.9, Beta2: -0.1}, {LR: 1, Beta1: 0.9, Beta2: 0.999, Eps: -1}, {LR: math.NaN(), Beta1: 0.9, Beta2: 0.999}} {
		if _, err := optim.NewAdam(ps, c); err == nil {
			t.Errorf("NewAdam(%+v): no error", c)
		}
	}
	if _, err := optim.NewAdam(nil, a); err == nil {
		t.Error("NewAdam with no parameters: no error")
	}
}

// DecayGroups puts weights (rank ≥ 2) in a group with decay and biases
// without; with zero gradients AdamW's step is then exactly the decay
// p·(1 − lr·wd) on the weights and nothing on the biases (m = v = 0, so the
// Adam term is 0/eps = 0). A conv layer without bias is fine.
func TestAdamWDecayGroups(t *testing.T) {
	l := nn.NewLinear(tensor.CPU, nil, 3, 2)
	conv := nn.NewConv2d(tensor.CPU, nil, 2, 3, 3)
	conv.Bias = nil
	params := append(nn.Prefixed("fc", l.Parameters()), nn.Prefixed("conv", conv.Parameters())...)
	gs := optim.DecayGroups(params, 0.1, 0.5)
	if len(gs) != 2 || len(gs[0].Params) != 2 || len(gs[1].Params) != 1 || gs[1].Params[0].Name != "fc.bias" ||
		gs[0].WeightDecay != 0.5 || gs[1].WeightDecay != 0 || gs[0].LR != 0.1 || gs[1].LR != 0.1 {
		t.Fatalf("DecayGroups: %+v", gs)
	}
	w0, b0, c0 := l.Weight.Float32s(), l.Bias.Float32s(), conv.Weight.Float32s()
	opt, err := optim.NewAdamGroups(gs, optim.DefaultAdamWConfig(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Release()
	opt.ZeroGrad()
	opt.Step()
	decay := float32(1 - 0.1*0.5)
	for i, v := range l.Weight.Float32s() {
		if v != w0[i]*decay {
			t.Fatalf("weight %d: %v, want %v·%v", i, v, w0[i], decay)
		}
	}
	for i, v := range conv.Weight.Float32s() {
		if v != c0[i]*decay {
			t.Fatalf("conv weight %d: %v, want %v·%v", i, v, c0[i], decay)
		}
	}
	equalVals(t, "bias (no decay group)", l.Bias.Float32s(), b0)
	// A group's own lr: the bias group set to lr 0.2, gradient 1.
	opt.SetGroupLR(1, 0.2)
	l.Bias.Grad().CopyFrom([]float32{1, 1})
	b1 := l.Bias.Float32s()
	opt.Step()
	// step 2 (t = 2): m = 0.1, v = 0.001 after a first step of zeros, so
	// p −= 0.2/0.19 · 0.1 / (√0.001/√0.001999 + 1e-8).
	step := 0.2 / 0.19 * 0.1 / (math.Sqrt(0.001)/math.Sqrt(0.001999) + 1e-8)
	for i, v := range l.Bias.Float32s() {
		if !adamNear(float64(v), float64(b1[i])-step) {
			t.Errorf("bias %d after a step at the group's lr: %v, want %v", i, v, float64(b1[i])-step)
		}
	}
}

// A cycled beta1 (OneCycleLR's momentum for Adam, SetMomentum) takes
// effect through the device scalars, as torch's OneCycleLR on Adam: step 2
// lerps with 1 − 0.85 and corrects by 1 − 0.85², the current beta1.
// lr 0.1, p0 = 1, gradients 0.5 then −1 (TestAdamTorchSemantics's plain
// case, whose first step is unchanged).
func TestAdamCycledBeta1(t *testing.T) {
	sq := math.Sqrt
	p := param(1)
	opt, err := optim.NewAdam([]nn.Parameter{{Name: "p", Tensor: p}}, optim.AdamConfig{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Release()
	var got []float64
	for i, g := range []float32{0.5, -1} {
		if err := opt.SetMomentum([]float64{0.9, 0.85}[i]); err != nil {
			t.Fatal(err)
		}
		p.Grad().CopyFrom([]float32{g})
		opt.Step()
		got = append(got, float64(p.Item()))
	}
	const lr = 0.1
	p1 := 1 - (lr/(1-0.9))*0.05/(sq(2.5e-4)/sq(0.001)+1e-8)
	m2 := 0.05 + 0.15*(-1-0.05)
	p2 := p1 - (lr/(1-0.85*0.85))*m2/(sq(0.00124975)/sq(0.001999)+1e-8)
	check(t, "adam with beta1 0.9 then 0.85", got, []float64{p1, p2})
}
