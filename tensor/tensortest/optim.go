package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// The optimiser family (tensor.OptimBackend): the fused Adam/AdamW update,
// SGD with device hyper-parameters and the gradient-norm clip coefficient,
// each against a float64 reference written here. A backend without the
// interface skips them (package optim then runs the CPU's kernels on host
// copies).

func optimBackend(e *env) tensor.OptimBackend {
	ob, ok := e.b.(tensor.OptimBackend)
	if !ok {
		e.t.Skipf("backend %s has no fused optimiser kernels (tensor.OptimBackend)", e.b.Name())
	}
	return ob
}

// adamCase is one configuration of testAdam: the launch arguments and the
// scalars of step t at learning rate lr (AdamW when decoupled).
type adamCase struct {
	lr, beta1, beta2, eps, wd float64
	decoupled, amsgrad        bool
	zeroGrad                  bool
	t                         int
}

// scalars are the per-step values as the optimiser computes them (float64,
// rounded once): tensor.AdamStepSize, AdamBC2Sqrt, AdamDecay,
// AdamBeta1Weight.
func (c adamCase) scalars() []float32 {
	s := make([]float32, tensor.NumAdamScalars)
	s[tensor.AdamStepSize] = float32(c.lr / (1 - math.Pow(c.beta1, float64(c.t))))
	s[tensor.AdamBC2Sqrt] = float32(math.Sqrt(1 - math.Pow(c.beta2, float64(c.t))))
	s[tensor.AdamDecay] = 1
	if c.decoupled {
		s[tensor.AdamDecay] = float32(1 - c.lr*c.wd)
	}
	s[tensor.AdamBeta1Weight] = float32(1 - c.beta1)
	return s
}

func (c adamCase) step() tensor.AdamStep {
	h := tensor.AdamStep{Beta2: float32(c.beta2), OneMinusBeta2: float32(1 - c.beta2),
		Eps: float32(c.eps), AMSGrad: c.amsgrad, ZeroGrad: c.zeroGrad}
	if !c.decoupled {
		h.WeightDecay = float32(c.wd)
	}
	return h
}

// refAdam is torch's Adam update in float64 from the float32 arguments,
// with bounds (the same computation on magnitudes) for each output.
func refAdam(p, g, m, v, vmax, s []float32, h tensor.AdamStep) (pn, mn, vn, xn, pB, mB, vB []float64) {
	n := len(p)
	pn, mn, vn, xn = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	pB, mB, vB = make([]float64, n), make([]float64, n), make([]float64, n)
	ss, bc2, decay := float64(s[tensor.AdamStepSize]), float64(s[tensor.AdamBC2Sqrt]), float64(s[tensor.AdamDecay])
	w, b2, omb2, eps, wd := float64(s[tensor.AdamBeta1Weight]), float64(h.Beta2), float64(h.OneMinusBeta2), float64(h.Eps), float64(h.WeightDecay)
	for i := 0; i < n; i++ {
		P := float64(p[i]) * decay
		d := float64(g[i]) + wd*P
		dB := math.Abs(float64(g[i])) + math.Abs(wd*P)
		M := float64(m[i]) + w*(d-float64(m[i]))
		mB[i] = math.Abs(float64(m[i])) + math.Abs(w)*(dB+math.Abs(float64(m[i])))
		V := b2*float64(v[i]) + omb2*d*d
		vB[i] = math.Abs(b2*float64(v[i])) + omb2*dB*dB
		mn[i], vn[i] = M, V
		if h.AMSGrad {
			V = math.Max(float64(vmax[i]), V)
			xn[i] = V
		}
		denom := math.Sqrt(V)/bc2 + eps
		pn[i] = P - ss*M/denom
		pB[i] = math.Abs(P) + ss*mB[i]/denom
	}
	return
}

// testAdam checks the fused update on fresh inputs for every flag and a few
// step numbers (the bias corrections differ most at small t). Each output
// element is a handful of float32 roundings (a lerp, a multiply-add, a
// square root, two divisions), so tolElem relative to the magnitudes of the
// terms holds; v is kept away from 0 so the division does not amplify.
func testAdam(e *env) {
	ob := optimBackend(e)
	cases := []adamCase{
		{lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, t: 1},
		{lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, t: 2},
		{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, t: 1000, zeroGrad: true},
		{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: 0.1, t: 3},                             // Adam's L2
		{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: 0.01, decoupled: true, t: 5},           // AdamW
		{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-6, amsgrad: true, t: 7},                       // AMSGrad
		{lr: 0.1, beta1: 0.2, beta2: 0.5, eps: 1e-3, wd: 0.5, decoupled: true, t: 2},               // lerp's second branch (1 - beta1 ≥ 0.5)
		{lr: 0.05, beta1: 0, beta2: 0.99, eps: 1e-8, wd: 0.2, amsgrad: true, zeroGrad: true, t: 1}, // beta1 0: m = g
	}
	for _, n := range sizes[:6] {
		for _, c := range cases {
			e.tcase("%s %+v", sizeStr(n), c)(func() {
				h, s := c.step(), c.scalars()
				p0, g, m0 := e.normal(n, 1), e.normal(n, 1), e.normal(n, 0.1)
				v0, x0 := e.uniform(n, 0.01, 1), e.uniform(n, 0.01, 1)
				pn, mn, vn, xn, pB, mB, vB := refAdam(p0, g, m0, v0, x0, s, h)
				p, gb := e.f32("p", p0, false), e.f32("g", g, !c.zeroGrad)
				m, v := e.f32("m", m0, false), e.f32("v", v0, false)
				var x *dbuf
				var xb tensor.Buffer
				if c.amsgrad {
					x = e.f32("vmax", x0, false)
					xb = x.win
				}
				ob.Adam(p.win, gb.win, m.win, v.win, xb, e.in("s", s), h)
				e.near("Adam p", dims(n), e.getF(p), pn, pB, tolElem)
				e.near("Adam m", dims(n), e.getF(m), mn, mB, tolElem)
				e.near("Adam v", dims(n), e.getF(v), vn, vB, tolElem)
				if x != nil {
					e.near("Adam vmax", dims(n), e.getF(x), xn, nil, tolElem)
				}
				if c.zeroGrad {
					e.near("Adam zeroed gradient", dims(n), e.getF(gb), make([]float64, n), make([]float64, n), 0)
				}
			})
		}
	}
}

// testSGDDevice is testSGD's cases with the learning rate, momentum,
// dampening and weight decay in a device buffer and NaN in the matching
// SGDStep fields, which must not be read: the same reference (refSGD), the
// same tolerance. The last case keeps a momentum buffer while the device
// momentum is 0 (a schedule may set it so): the buffer is left alone.
func testSGDDevice(e *env) {
	ob := optimBackend(e)
	hs := []tensor.SGDStep{
		{LR: 0.1},
		{LR: 0.05, WeightDecay: 0.01, ZeroGrad: true},
		{LR: 0.01, Momentum: 0.9, FirstStep: true},
		{LR: 0.01, Momentum: 0.9, Dampening: 0.1},
		{LR: 0.01, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4, ZeroGrad: true},
		{LR: 0.2, Momentum: 0.85, Nesterov: true, WeightDecay: 5e-4},
		{LR: 0.03, Momentum: 0, Dampening: 0.5},
	}
	for _, n := range sizes[:6] {
		for hi, h := range hs {
			e.tcase("%s %+v", sizeStr(n), h)(func() {
				p0, g, v0 := e.normal(n, 1), e.normal(n, 1), e.normal(n, 1)
				pn, vn, pB, vB := refSGD(p0, g, v0, h)
				keepV := hi == len(hs)-1 // a buffer the zero momentum must not touch
				p := e.f32("p", p0, false)
				var v *dbuf
				var vb tensor.Buffer
				if h.Momentum != 0 || keepV {
					if h.FirstStep {
						v = e.nanOut("v", n)
					} else {
						v = e.f32("v", v0, false)
					}
					vb = v.win
				}
				if keepV {
					vn, vB = make([]float64, n), make([]float64, n)
					for i, x := range v0 {
						vn[i] = float64(x)
					}
				}
				gb := e.f32("g", g, !h.ZeroGrad)
				sc := make([]float32, tensor.NumSGDScalars)
				sc[tensor.SGDLR], sc[tensor.SGDMomentum], sc[tensor.SGDDampening], sc[tensor.SGDWeightDecay] = h.LR, h.Momentum, h.Dampening, h.WeightDecay
				nan := float32(math.NaN())
				hNaN := h
				hNaN.LR, hNaN.Momentum, hNaN.Dampening, hNaN.WeightDecay = nan, nan, nan, nan
				ob.SGDDevice(p.win, gb.win, vb, e.in("s", sc), hNaN)
				e.near("SGDDevice p", dims(n), e.getF(p), pn, pB, tolElem)
				if h.ZeroGrad {
					e.near("SGDDevice zeroed gradient", dims(n), e.getF(gb), make([]float64, n), make([]float64, n), 0)
				}
				if v != nil {
					tol := tolElem
					if keepV {
						tol = 0 // untouched: the same bits
					}
					e.near("SGDDevice momentum", dims(n), e.getF(v), vn, vB, tol)
				}
			})
		}
	}
}

// testClipCoef checks the norm (squares summed in double, so any order is
// within a rounding of the float32 result: tolElem) and the coefficient
// (one float32 add and divide from it: tolElem), including the clamp at 1,
// an empty gradient (norm 0, coefficient 1), values whose squares overflow
// float32, and NaN propagation.
func testClipCoef(e *env) {
	ob := optimBackend(e)
	for _, n := range append([]int{0}, sizes...) {
		for _, scale := range []float64{1, 1e20} {
			for _, rel := range []float64{0.5, 2, 0} {
				e.tcase("%s scale %g max norm %g·norm", sizeStr(n), scale, rel)(func() {
					g := e.normal(n, scale)
					var ss float64
					for _, v := range g {
						ss += float64(v) * float64(v)
					}
					norm := math.Sqrt(ss)
					maxNorm := float32(rel * norm)
					coef := math.Min(float64(maxNorm)/(norm+1e-6), 1)
					nb, cb := e.nanOut("norm", 1), e.nanOut("coef", 1)
					ob.ClipCoef(nb.win, cb.win, e.in("g", g), maxNorm)
					e.near("ClipCoef norm", dims(1), e.getF(nb), []float64{norm}, nil, tolElem)
					e.near("ClipCoef coefficient", dims(1), e.getF(cb), []float64{coef}, nil, tolElem)
				})
			}
		}
	}
	e.tcase("NaN gradient")(func() {
		g := e.normal(100, 1)
		g[37] = float32(math.NaN())
		nb, cb := e.f32("norm", []float32{0}, false), e.f32("coef", []float32{0}, false)
		ob.ClipCoef(nb.win, cb.win, e.in("g", g), 1)
		if v := e.getF(nb)[0]; !math.IsNaN(float64(v)) {
			e.fail("norm of a gradient with a NaN is %v, want NaN", v)
		}
		if v := e.getF(cb)[0]; !math.IsNaN(float64(v)) {
			e.fail("coefficient of a NaN norm is %v, want NaN (as torch.clamp)", v)
		}
	})
}

// testOptim runs the optimiser family's cases, each as a subtest of its
// own (one entry in RunBackend's list).
func testOptim(e *env) {
	for _, c := range []struct {
		name string
		f    func(*env)
	}{{"Adam", testAdam}, {"SGDDevice", testSGDDevice}, {"ClipCoef", testClipCoef}} {
		subtest(e.t, e.b, e.seed, c.name, c.f)
	}
}
