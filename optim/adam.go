package optim

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// AdamConfig holds the hyper-parameters of torch.optim.Adam and AdamW. Start
// from DefaultAdamConfig or DefaultAdamWConfig: a zero Beta or Eps is taken
// as given, not as "the default".
type AdamConfig struct {
	LR           float64
	Beta1, Beta2 float64
	Eps          float64
	// WeightDecay is the default of groups that do not set their own: an
	// L2 term added to the gradient for Adam, a decoupled decay
	// p *= 1 - lr·wd for AdamW.
	WeightDecay float64
	// AMSGrad divides by the running maximum of the second moment.
	AMSGrad bool
}

// DefaultAdamConfig is torch.optim.Adam's defaults: lr 1e-3, betas (0.9,
// 0.999), eps 1e-8, no weight decay.
func DefaultAdamConfig() AdamConfig {
	return AdamConfig{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
}

// DefaultAdamWConfig is torch.optim.AdamW's defaults: those of Adam with
// weight decay 0.01.
func DefaultAdamWConfig() AdamConfig {
	c := DefaultAdamConfig()
	c.WeightDecay = 0.01
	return c
}

// Adam is torch.optim.Adam (or AdamW, decoupled weight decay) with exactly
// its update rule, t the 1-based step:
//
//	g = g + wd·p                       (Adam)      p = p·(1 - lr·wd)  (AdamW)
//	m = lerp(m, g, 1 - beta1)
//	v = beta2·v + (1 - beta2)·g²
//	v̂ = max(v̂, v)                      (amsgrad; v̂ replaces v below)
//	p = p - lr/(1 - beta1^t) · m / (√v / √(1 - beta2^t) + eps)
//
// Parameters, gradients and both moments are packed into one buffer each,
// so that a step is one backend call per parameter group. The per-step
// values (lr/(1 - beta1^t), √(1 - beta2^t), 1 - lr·wd, 1 - beta1) are computed on the
// host in double precision, as torch does, and uploaded to a small device
// buffer that the update kernels read: a step captured as a CUDA graph
// replays with the current learning rate and bias corrections as long as
// Prepare is called before each replay (see Prepare).
type Adam struct {
	cfg       AdamConfig
	decoupled bool
	groups    []ParamGroup
	spans     []span
	params    []nn.Parameter
	flatP     *tensor.Tensor
	flatG     *tensor.Tensor
	m, v      *tensor.Tensor
	vmax      *tensor.Tensor // amsgrad only
	scalars   *tensor.Tensor // tensor.NumAdamScalars per group
	host      []float32      // staging of scalars
	steps     int
	prepared  int // the step number whose scalars are on the device; 0 none
}

// NewAdam prepares torch.optim.Adam for params (one group with cfg's lr
// and weight decay, all on one device).
func NewAdam(params []nn.Parameter, cfg AdamConfig) (*Adam, error) {
	return newAdam("Adam", []ParamGroup{{Params: params, LR: cfg.LR, WeightDecay: cfg.WeightDecay}}, cfg, false)
}

// NewAdamW prepares torch.optim.AdamW (decoupled weight decay) for params.
func NewAdamW(params []nn.Parameter, cfg AdamConfig) (*Adam, error) {
	return newAdam("AdamW", []ParamGroup{{Params: params, LR: cfg.LR, WeightDecay: cfg.WeightDecay}}, cfg, true)
}

// NewAdamGroups is NewAdam (decoupled false) or NewAdamW (decoupled true)
// with parameter groups, each with its own lr and weight decay (cfg's are
// not used); see DecayGroups.
func NewAdamGroups(groups []ParamGroup, cfg AdamConfig, decoupled bool) (*Adam, error) {
	op := "Adam"
	if decoupled {
		op = "AdamW"
	}
	return newAdam(op, groups, cfg, decoupled)
}

func newAdam(op string, groups []ParamGroup, cfg AdamConfig, decoupled bool) (*Adam, error) {
	if !(cfg.Beta1 >= 0 && cfg.Beta1 < 1) || !(cfg.Beta2 >= 0 && cfg.Beta2 < 1) {
		return nil, fmt.Errorf("optim: %s: betas (%g, %g) outside [0, 1)", op, cfg.Beta1, cfg.Beta2)
	}
	if !(cfg.Eps >= 0) {
		return nil, fmt.Errorf("optim: %s: invalid eps %g", op, cfg.Eps)
	}
	params, spans, flatP, flatG, err := packGroups(op, groups)
	if err != nil {
		return nil, err
	}
	a := &Adam{cfg: cfg, decoupled: decoupled, groups: append([]ParamGroup(nil), groups...), spans: spans,
		params: params, flatP: flatP, flatG: flatG}
	b, n := flatP.Backend(), flatP.Len()
	a.m = tensor.Zeros(b, nil, n)
	a.v = tensor.Zeros(b, nil, n)
	if cfg.AMSGrad {
		a.vmax = tensor.Zeros(b, nil, n)
	}
	a.host = make([]float32, tensor.NumAdamScalars*len(groups))
	a.scalars = tensor.Zeros(b, nil, len(a.host))
	return a, nil
}

// SetLR sets the learning rate of every group (what a schedule does).
func (a *Adam) SetLR(lr float64) {
	for i := range a.groups {
		a.groups[i].LR = lr
	}
	a.prepared = 0
}

// SetGroupLR sets the learning rate of group i.
func (a *Adam) SetGroupLR(i int, lr float64) {
	a.groups[i].LR = lr
	a.prepared = 0
}

// SetMomentum sets beta1, what torch's OneCycleLR cycles for Adam in
// place of SGD's momentum (the bias correction 1 - beta1^t then uses the
// current beta1, as torch's). It is a device scalar like the learning
// rate: a captured step replays with it after Prepare.
func (a *Adam) SetMomentum(beta1 float64) error {
	if !(beta1 >= 0 && beta1 < 1) {
		return fmt.Errorf("optim: Adam: beta1 %g outside [0, 1)", beta1)
	}
	a.cfg.Beta1 = beta1
	a.prepared = 0
	return nil
}

// LR is the learning rate of the first group.
func (a *Adam) LR() float64 { return a.groups[0].LR }

// Groups returns a copy of the parameter groups (with their current lr).
func (a *Adam) Groups() []ParamGroup { return append([]ParamGroup(nil), a.groups...) }

// Prepare uploads the per-step values of the coming step (number
// Steps()+1) with the current learning rates. Step calls it when it has not
// been called for that step; a training loop that replays a captured step
// must call it before every replay (an upload cannot be captured), and
// before the capture itself.
func (a *Adam) Prepare() {
	t := float64(a.steps + 1)
	bc1 := 1 - math.Pow(a.cfg.Beta1, t)
	bc2 := 1 - math.Pow(a.cfg.Beta2, t)
	for i, g := range a.groups {
		s := a.host[i*tensor.NumAdamScalars:]
		s[tensor.AdamStepSize] = float32(g.LR / bc1)
		s[tensor.AdamBC2Sqrt] = float32(math.Sqrt(bc2))
		s[tensor.AdamDecay] = 1
		if a.decoupled {
			s[tensor.AdamDecay] = float32(1 - g.LR*g.WeightDecay)
		}
		s[tensor.AdamBeta1Weight] = float32(1 - a.cfg.Beta1)
	}
	a.scalars.CopyFrom(a.host)
	a.prepared = a.steps + 1
}

// ZeroGrad zeroes all gradients in one backend call.
func (a *Adam) ZeroGrad() {
	a.flatP.Backend().Fill(a.flatG.Buffer(), 0)
	unclearGrads(a.params)
}

// ClearGrad zeroes all gradients as ZeroGrad does, or, where the last
// backward pass wrote each of them whole, by clearing them for the next one
// to write over (grads.go), as SGD.ClearGrad.
func (a *Adam) ClearGrad() { clearOrZero(a.params, a.ZeroGrad) }

// Step applies one update to every parameter from its accumulated gradient.
func (a *Adam) Step() { a.step(false) }

// StepAndZeroGrad is Step then ZeroGrad in the same pass over the
// gradients, or, where the backward pass before it found every gradient
// cleared (ClearGrad), with the gradients cleared again for the next one
// to write over (grads.go).
func (a *Adam) StepAndZeroGrad() { a.step(true) }

func (a *Adam) step(zeroGrad bool) {
	lazy := zeroGrad && clearedAfresh(a.params)
	settleGrads(a.params)
	zeroGrad = zeroGrad && !lazy
	if a.prepared != a.steps+1 {
		a.Prepare()
	}
	b := a.flatP.Backend()
	ob, fused := b.(tensor.OptimBackend)
	for i, g := range a.groups {
		sp := a.spans[i]
		if sp.n == 0 {
			continue
		}
		h := tensor.AdamStep{
			Beta2: float32(a.cfg.Beta2), OneMinusBeta2: float32(1 - a.cfg.Beta2),
			Eps: float32(a.cfg.Eps), AMSGrad: a.cfg.AMSGrad, ZeroGrad: zeroGrad,
		}
		if !a.decoupled {
			h.WeightDecay = float32(g.WeightDecay)
		}
		bufs := []tensor.Buffer{
			a.flatP.Buffer().Slice(sp.off, sp.n), a.flatG.Buffer().Slice(sp.off, sp.n),
			a.m.Buffer().Slice(sp.off, sp.n), a.v.Buffer().Slice(sp.off, sp.n), {},
			a.scalars.Buffer().Slice(i*tensor.NumAdamScalars, tensor.NumAdamScalars),
		}
		if a.vmax != nil {
			bufs[4] = a.vmax.Buffer().Slice(sp.off, sp.n)
		}
		if fused {
			ob.Adam(bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], h)
		} else {
			onHost(b, bufs, func(x []tensor.Buffer) { cpuOptim.Adam(x[0], x[1], x[2], x[3], x[4], x[5], h) })
		}
	}
	if lazy {
		clearGrads(a.params)
	}
	a.steps++
}

// Replayable reports whether the next Step issues the same device work as
// every later one: always, for Adam (the step's values are device scalars).
func (a *Adam) Replayable() bool { return true }

// Replayed counts one step that ran as a replay of a captured Step.
func (a *Adam) Replayed() { a.steps++ }

// Rewind takes back the count of a Step whose device work never ran (a
// failed capture).
func (a *Adam) Rewind() { a.steps-- }

// Steps is the number of updates applied so far.
func (a *Adam) Steps() int { return a.steps }

// Parameters are the parameters being optimised, in packed order (group
// by group).
func (a *Adam) Parameters() []nn.Parameter { return a.params }

// Gradients is the packed gradient buffer (what ClipGradNorm scales), with
// the zeros of any gradient still cleared written.
func (a *Adam) Gradients() *tensor.Tensor {
	settleGrads(a.params)
	return a.flatG
}

// Moments returns the packed first and second moments (exp_avg and
// exp_avg_sq) and, with amsgrad, the running maximum (else nil).
func (a *Adam) Moments() (m, v, vmax *tensor.Tensor) { return a.m, a.v, a.vmax }

// Release frees the optimiser's own memory: the moments, the scalars and
// the packed gradients (the parameters are left without gradients). The
// parameters themselves belong to the model.
func (a *Adam) Release() {
	for _, p := range a.params {
		p.Tensor.SetGrad(nil)
	}
	for _, t := range []*tensor.Tensor{a.m, a.v, a.vmax, a.scalars, a.flatG} {
		if t != nil {
			t.Release()
		}
	}
}
