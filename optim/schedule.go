package optim

import (
	"fmt"
	"math"
)

// StepLR multiplies the learning rate by Gamma every StepSize epochs, as
// torch.optim.lr_scheduler.StepLR does.
type StepLR struct {
	BaseLR   float64
	StepSize int
	Gamma    float64
}

// LR is the learning rate for a 0-based epoch.
func (s StepLR) LR(epoch int) float64 {
	if s.StepSize <= 0 {
		return s.BaseLR
	}
	return s.BaseLR * math.Pow(s.Gamma, float64(epoch/s.StepSize))
}

// Schedule gives the learning rate of a 0-based step (or epoch: the caller
// chooses what a step counts), as a closed form, so that a resumed run gets
// the same rate from its step counter alone. Drive an optimiser with
// opt.SetLR(s.LR(step)) before each step.
type Schedule interface {
	LR(step int) float64
}

// MultiStepLR multiplies the learning rate by Gamma at each milestone, as
// torch.optim.lr_scheduler.MultiStepLR: lr = base·gamma^(number of
// milestones ≤ step). Milestones must be increasing.
type MultiStepLR struct {
	BaseLR     float64
	Milestones []int
	Gamma      float64
}

// LR is the learning rate of a 0-based step.
func (s MultiStepLR) LR(step int) float64 {
	k := 0
	for _, m := range s.Milestones {
		if m <= step {
			k++
		}
	}
	return s.BaseLR * math.Pow(s.Gamma, float64(k))
}

// LinearLR scales the learning rate by a factor going linearly from
// StartFactor to EndFactor over TotalIters steps and staying there, as
// torch.optim.lr_scheduler.LinearLR (torch's defaults: 1/3, 1, 5): the
// usual linear warm-up, with StartFactor small and EndFactor 1.
type LinearLR struct {
	BaseLR                 float64
	StartFactor, EndFactor float64
	TotalIters             int
}

// LR is the learning rate of a 0-based step.
func (s LinearLR) LR(step int) float64 {
	if s.TotalIters <= 0 {
		return s.BaseLR * s.EndFactor
	}
	f := float64(min(step, s.TotalIters)) / float64(s.TotalIters)
	return s.BaseLR * (s.StartFactor + (s.EndFactor-s.StartFactor)*f)
}

// CosineAnnealingLR is torch.optim.lr_scheduler.CosineAnnealingLR in its
// closed form: lr = eta_min + (base - eta_min)·(1 + cos(π·step/T_max))/2
// (torch's recursive update gives the same values up to rounding, and goes
// on as the same cosine past T_max).
type CosineAnnealingLR struct {
	BaseLR float64
	TMax   int
	EtaMin float64
}

// LR is the learning rate of a 0-based step.
func (s CosineAnnealingLR) LR(step int) float64 {
	if s.TMax <= 0 {
		return s.BaseLR
	}
	return s.EtaMin + (s.BaseLR-s.EtaMin)*(1+math.Cos(math.Pi*float64(step)/float64(s.TMax)))/2
}

// Sequential runs Schedules[0] until Milestones[0], then Schedules[1]
// counting its steps from 0 at that milestone, and so on, as
// torch.optim.lr_scheduler.SequentialLR: warm-up then cosine is
// Sequential{[LinearLR, CosineAnnealingLR], [warmup]}.
type Sequential struct {
	Schedules  []Schedule
	Milestones []int // len(Schedules)-1 increasing steps
}

// LR is the learning rate of a 0-based step.
func (s Sequential) LR(step int) float64 {
	if len(s.Milestones) != len(s.Schedules)-1 {
		panic(fmt.Sprintf("optim: Sequential of %d schedules with %d milestones (want one fewer)", len(s.Schedules), len(s.Milestones)))
	}
	start := 0
	for i, m := range s.Milestones {
		if step < m {
			return s.Schedules[i].LR(step - start)
		}
		start = m
	}
	return s.Schedules[len(s.Schedules)-1].LR(step - start)
}

// OneCycleLR is torch.optim.lr_scheduler.OneCycleLR: the rate rises from
// MaxLR/DivFactor to MaxLR over the first PctStart of TotalSteps, then
// falls to MaxLR/DivFactor/FinalDivFactor (or, ThreePhase, back to the
// initial rate and then to the minimum), each phase by a half cosine (or a
// straight line with AnnealLinear). Momentum gives the cycled momentum
// (between MaxMomentum and BaseMomentum, the other way round); with
// CycleMomentum (torch's cycle_momentum) the trainer applies it before
// every step through the optimiser's SetMomentum (SGD's momentum, Adam's
// beta1), a device scalar, so that a captured step replays with it.
// NewOneCycleLR sets torch's defaults.
type OneCycleLR struct {
	MaxLR                     float64
	TotalSteps                int
	PctStart                  float64
	DivFactor, FinalDivFactor float64
	ThreePhase                bool
	AnnealLinear              bool
	CycleMomentum             bool
	BaseMomentum, MaxMomentum float64
}

// MomentumSchedule is a Schedule that may also set the momentum (SGD's
// momentum, Adam's beta1) of each step.
type MomentumSchedule interface {
	Schedule
	// MomentumAt is the momentum of a 0-based step; false when the
	// schedule leaves the momentum alone.
	MomentumAt(step int) (float64, bool)
}

// MomentumSetter is an optimiser whose momentum a MomentumSchedule can set
// between steps, captured ones included: SGD and Adam (beta1).
type MomentumSetter interface {
	SetMomentum(m float64) error
}

// MomentumAt is Momentum(step) when CycleMomentum is set.
func (s OneCycleLR) MomentumAt(step int) (float64, bool) {
	if !s.CycleMomentum {
		return 0, false
	}
	return s.Momentum(step), true
}

// NewOneCycleLR is OneCycleLR with torch's defaults: pct_start 0.3, cosine
// annealing, div_factor 25, final_div_factor 1e4, two phases, momentum
// cycled between 0.85 and 0.95.
func NewOneCycleLR(maxLR float64, totalSteps int) OneCycleLR {
	return OneCycleLR{MaxLR: maxLR, TotalSteps: totalSteps, PctStart: 0.3, DivFactor: 25, FinalDivFactor: 1e4,
		CycleMomentum: true, BaseMomentum: 0.85, MaxMomentum: 0.95}
}

// oneCyclePhase is a phase of OneCycleLR: it ends at step end (a float, as
// torch computes it) and goes from the value index start to end of
// (initial, max, min) for the rate and (max, base) for the momentum.
type oneCyclePhase struct {
	end            float64
	lrFrom, lrTo   float64
	momFrom, momTo float64
}

func (s OneCycleLR) phases() []oneCyclePhase {
	initial := s.MaxLR / s.DivFactor
	minLR := initial / s.FinalDivFactor
	n := float64(s.TotalSteps)
	if s.ThreePhase {
		return []oneCyclePhase{
			{s.PctStart*n - 1, initial, s.MaxLR, s.MaxMomentum, s.BaseMomentum},
			{2*s.PctStart*n - 2, s.MaxLR, initial, s.BaseMomentum, s.MaxMomentum},
			{n - 1, initial, minLR, s.MaxMomentum, s.MaxMomentum},
		}
	}
	return []oneCyclePhase{
		{s.PctStart*n - 1, initial, s.MaxLR, s.MaxMomentum, s.BaseMomentum},
		{n - 1, s.MaxLR, minLR, s.BaseMomentum, s.MaxMomentum},
	}
}

// at finds the phase of step and the fraction of it done, as torch's
// get_lr; a step past TotalSteps is a programming error, as in torch.
func (s OneCycleLR) at(step int) (oneCyclePhase, float64) {
	if step < 0 || step > s.TotalSteps {
		panic(fmt.Sprintf("optim: OneCycleLR: step %d outside [0, %d]", step, s.TotalSteps))
	}
	ps := s.phases()
	start := 0.0
	for i, p := range ps {
		if float64(step) <= p.end || i == len(ps)-1 {
			return p, (float64(step) - start) / (p.end - start)
		}
		start = p.end
	}
	panic("unreachable")
}

func (s OneCycleLR) anneal(from, to, pct float64) float64 {
	if s.AnnealLinear {
		return (to-from)*pct + from
	}
	return to + (from-to)/2*(math.Cos(math.Pi*pct)+1)
}

// LR is the learning rate of a 0-based step (0 ≤ step ≤ TotalSteps).
func (s OneCycleLR) LR(step int) float64 {
	p, pct := s.at(step)
	return s.anneal(p.lrFrom, p.lrTo, pct)
}

// Momentum is the cycled momentum (SGD's momentum or Adam's beta1) of a
// 0-based step.
func (s OneCycleLR) Momentum(step int) float64 {
	p, pct := s.at(step)
	return s.anneal(p.momFrom, p.momTo, pct)
}
