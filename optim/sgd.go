package optim

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// SGDConfig holds the hyper-parameters of torch.optim.SGD.
type SGDConfig struct {
	LR          float64
	Momentum    float64
	Dampening   float64
	WeightDecay float64
	Nesterov    bool
}

// SGD is stochastic gradient descent with momentum, with exactly the update
// rule of torch.optim.SGD:
//
//	d = g + weight_decay·p
//	v = d                                  on the first step
//	v = momentum·v + (1 - dampening)·d     afterwards
//	d = d + momentum·v  (nesterov)  or  d = v
//	p = p - lr·d
//
// NewSGD packs the parameters, their gradients and the momentum buffers into
// one allocation each, so that Step is a single backend call (one kernel
// launch on the GPU) whatever the number of parameters.
type SGD struct {
	SGDConfig
	params   []nn.Parameter
	flatP    *tensor.Tensor
	flatG    *tensor.Tensor
	momentum *tensor.Tensor
	steps    int
	dev      *deviceSGD // nil: the hyper-parameters go with each launch (sgd_device.go)
}

// NewSGD prepares an optimiser for the parameters (all on one device). A
// parameter whose tensor is nil (a layer built without bias) has nothing to
// learn and is left out. Hyper-parameters must be finite and in range; the
// error names the one that is not.
func NewSGD(params []nn.Parameter, cfg SGDConfig) (*SGD, error) {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(cfg.LR) || cfg.LR < 0:
		return nil, fmt.Errorf("optim: SGD: learning rate %g, want a finite value >= 0", cfg.LR)
	case !finite(cfg.Momentum) || cfg.Momentum < 0:
		return nil, fmt.Errorf("optim: SGD: momentum %g, want a finite value >= 0", cfg.Momentum)
	case !finite(cfg.Dampening):
		return nil, fmt.Errorf("optim: SGD: dampening %g, want a finite value", cfg.Dampening)
	case !finite(cfg.WeightDecay) || cfg.WeightDecay < 0:
		return nil, fmt.Errorf("optim: SGD: weight decay %g, want a finite value >= 0", cfg.WeightDecay)
	case cfg.Nesterov && (cfg.Momentum <= 0 || cfg.Dampening != 0):
		return nil, fmt.Errorf("optim: SGD: nesterov needs momentum > 0 and zero dampening")
	}
	var live []nn.Parameter
	for _, p := range params {
		if p.Tensor != nil {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil, fmt.Errorf("optim: SGD with no parameters")
	}
	ts := make([]*tensor.Tensor, len(live))
	grads := make([]*tensor.Tensor, len(live))
	for i, p := range live {
		ts[i] = p.Tensor
		grads[i] = tensor.Zeros(p.Tensor.Backend(), nil, p.Tensor.Shape()...)
		if g := p.Tensor.Grad(); g != nil {
			tensor.CopyTensor(grads[i], g)
		}
	}
	s := &SGD{SGDConfig: cfg, params: live}
	s.flatP = tensor.Pack(ts)
	s.flatG = tensor.Pack(grads)
	for i, p := range live {
		p.Tensor.SetGrad(grads[i])
	}
	if cfg.Momentum != 0 {
		s.momentum = tensor.Zeros(s.flatP.Backend(), nil, s.flatP.Len())
	}
	return s, nil
}

// Release frees the optimiser's own memory, the gradients and the momentum
// buffer, now rather than when the garbage collector finds them (device
// memory is not the collector's to manage); the parameters' gradients are
// unset. The parameters themselves belong to the model and stay: release
// them with the model. The optimiser must not be used afterwards. Release
// may be called more than once.
func (s *SGD) Release() {
	if s.flatG == nil {
		return
	}
	for _, p := range s.params {
		p.Tensor.SetGrad(nil)
	}
	s.flatG.Release()
	s.flatG = nil
	if s.momentum != nil {
		s.momentum.Release()
		s.momentum = nil
	}
	if s.dev != nil {
		s.dev.buf.Release()
		s.dev = nil
	}
}

// ZeroGrad zeroes all gradients in one backend call.
func (s *SGD) ZeroGrad() {
	s.flatP.Backend().Fill(s.flatG.Buffer(), 0)
	unclearGrads(s.params)
}

// ClearGrad zeroes all gradients as ZeroGrad does, or, where the last
// backward pass wrote each of them whole, by clearing them for the next one
// to write over (grads.go): call it before a captured step whose update is
// StepAndZeroGrad, so that the capture clears the gradients too.
func (s *SGD) ClearGrad() { clearOrZero(s.params, s.ZeroGrad) }

// Step applies one update to every parameter from its accumulated gradient.
func (s *SGD) Step() { s.step(false) }

// StepAndZeroGrad is Step then ZeroGrad as one backend call: each gradient
// is set to zero as the update reads it, or, where the backward pass
// before it found every gradient cleared (ClearGrad), cleared again for
// the next one to write over (grads.go). A training loop that calls it
// after every backward pass (and ZeroGrad once, before the first) needs
// no separate fill of the gradients per step.
func (s *SGD) StepAndZeroGrad() { s.step(true) }

func (s *SGD) step(zeroGrad bool) {
	lazy := zeroGrad && clearedAfresh(s.params)
	settleGrads(s.params)
	zeroGrad = zeroGrad && !lazy
	var v tensor.Buffer
	if s.momentum != nil {
		v = s.momentum.Buffer()
	}
	h := tensor.SGDStep{
		LR: float32(s.LR), Momentum: float32(s.Momentum), Dampening: float32(s.Dampening),
		WeightDecay: float32(s.WeightDecay), Nesterov: s.Nesterov, FirstStep: s.firstStepDiffers(), ZeroGrad: zeroGrad,
	}
	if s.dev != nil {
		s.stepDevice(v, h)
	} else {
		tensor.Complete(s.flatP.Backend()).SGD(s.flatP.Buffer(), s.flatG.Buffer(), v, h)
	}
	if lazy {
		clearGrads(s.params)
	}
	s.steps++
}

// firstStepDiffers reports whether this step needs PyTorch's special first
// update (v = d). With zero dampening the general rule applied to the zeroed
// buffer gives the same bits (0.9·0 + 1·d = d), so every step issues the
// same device work, which lets a captured step be replayed from the start.
func (s *SGD) firstStepDiffers() bool { return s.steps == 0 && s.Dampening != 0 }

// Replayable reports whether the next Step issues the same device work as
// every later one, so that it can be captured once and replayed.
func (s *SGD) Replayable() bool { return !s.firstStepDiffers() }

// Replayed counts one step that ran as a replay of a captured Step.
func (s *SGD) Replayed() { s.steps++ }

// Rewind takes back the count of a Step whose device work never ran (a
// failed capture).
func (s *SGD) Rewind() { s.steps-- }

// Steps is the number of updates applied so far.
func (s *SGD) Steps() int { return s.steps }

// MomentumBuffer returns the momentum buffers as one flat tensor in parameter
// order (nil without momentum), for saving training state.
func (s *SGD) MomentumBuffer() *tensor.Tensor { return s.momentum }

// SetState restores the step count and momentum values saved from an
// earlier run (momentum may be nil when the optimiser has none).
func (s *SGD) SetState(steps int, momentum []float32) error {
	if s.momentum != nil {
		if len(momentum) != s.momentum.Len() {
			return fmt.Errorf("optim: SGD state has %d momentum values, the parameters need %d", len(momentum), s.momentum.Len())
		}
		s.momentum.CopyFrom(momentum)
	}
	s.steps = steps
	return nil
}

// Parameters are the parameters being optimised.
func (s *SGD) Parameters() []nn.Parameter { return s.params }
