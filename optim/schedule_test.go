package optim_test

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/optim"
)

// The expected rates are torch.optim.lr_scheduler's, worked out by hand
// from its formulas (closed forms; torch's recursive updates agree up to
// rounding), compared to 1e-12 relative: both sides are float64.

func near12(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(math.Abs(b), 1e-300) }

type lrCase struct {
	step int
	want float64
}

func checkSchedule(t *testing.T, name string, s optim.Schedule, cases []lrCase) {
	t.Helper()
	for _, c := range cases {
		if got := s.LR(c.step); !near12(got, c.want) {
			t.Errorf("%s: LR(%d) = %.15g, torch gives %.15g", name, c.step, got, c.want)
		}
	}
}

func TestMultiStepLR(t *testing.T) {
	// lr = 0.1·0.1^(milestones passed): milestones 2 and 5 (torch counts a
	// milestone as passed at its own epoch).
	checkSchedule(t, "MultiStepLR", optim.MultiStepLR{BaseLR: 0.1, Milestones: []int{2, 5}, Gamma: 0.1},
		[]lrCase{{0, 0.1}, {1, 0.1}, {2, 0.01}, {4, 0.01}, {5, 0.001}, {100, 0.001}})
}

func TestLinearLR(t *testing.T) {
	// torch's defaults: factor 1/3 → 1 over 5 steps, base 0.3:
	// lr = 0.3·(1/3 + (2/3)·min(step, 5)/5).
	s := optim.LinearLR{BaseLR: 0.3, StartFactor: 1.0 / 3, EndFactor: 1, TotalIters: 5}
	checkSchedule(t, "LinearLR", s, []lrCase{{0, 0.1}, {1, 0.3 * (1.0/3 + 2.0/3/5)}, {4, 0.3 * (1.0/3 + 2.0/3*4/5)}, {5, 0.3}, {9, 0.3}})
}

func TestCosineAnnealingLR(t *testing.T) {
	// eta_min + (base − eta_min)·(1 + cos(π·step/10))/2, base 0.1, eta_min
	// 0.001: 0.1 at 0, the mean 0.0505 at 5, eta_min at 10; cos(π/5) =
	// (1 + √5)/4.
	s := optim.CosineAnnealingLR{BaseLR: 0.1, TMax: 10, EtaMin: 0.001}
	checkSchedule(t, "CosineAnnealingLR", s, []lrCase{{0, 0.1}, {2, 0.001 + 0.099*(1+(1+math.Sqrt(5))/4)/2}, {5, 0.0505}, {10, 0.001}})
}

func TestOneCycleLR(t *testing.T) {
	// torch's defaults, max_lr 1 over 100 steps: initial 1/25 = 0.04,
	// minimum 0.04/1e4 = 4e-6; phase 1 ends at step 0.3·100 − 1 = 29,
	// phase 2 at 99. Cosine annealing from a to b at fraction f: b + (a −
	// b)/2·(1 + cos(πf)).
	s := optim.NewOneCycleLR(1, 100)
	if s.PctStart != 0.3 || s.DivFactor != 25 || s.FinalDivFactor != 1e4 || s.ThreePhase || s.AnnealLinear || s.BaseMomentum != 0.85 || s.MaxMomentum != 0.95 {
		t.Errorf("NewOneCycleLR defaults %+v, torch's are 0.3, 25, 1e4, two phases, cos, momentum 0.85..0.95", s)
	}
	cos := func(a, b, f float64) float64 { return b + (a-b)/2*(1+math.Cos(math.Pi*f)) }
	checkSchedule(t, "OneCycleLR", s, []lrCase{
		{0, 0.04}, {10, cos(0.04, 1, 10.0/29)}, {29, 1}, {64, 4e-6 + (1-4e-6)/2}, {99, 4e-6},
		// torch allows step == total_steps: the fraction 71/70 passes the end.
		{100, cos(1, 4e-6, 71.0/70)},
	})
	// Momentum goes the other way: 0.95 → 0.85 in phase 1, back in phase 2.
	for _, c := range []lrCase{{0, 0.95}, {29, 0.85}, {64, 0.9}, {99, 0.95}} {
		if got := s.Momentum(c.step); !near12(got, c.want) {
			t.Errorf("OneCycleLR momentum(%d) = %.15g, torch gives %.15g", c.step, got, c.want)
		}
	}
	// Linear annealing, three phases (ends at 29, 58, 99): up, down to the
	// initial rate, then to the minimum.
	s.ThreePhase, s.AnnealLinear = true, true
	lin := func(a, b, f float64) float64 { return (b-a)*f + a }
	checkSchedule(t, "OneCycleLR three-phase linear", s, []lrCase{
		{0, 0.04}, {10, lin(0.04, 1, 10.0/29)}, {29, 1}, {40, lin(1, 0.04, 11.0/29)}, {58, 0.04}, {80, lin(0.04, 4e-6, 22.0/41)}, {99, 4e-6}})
	defer func() {
		if recover() == nil {
			t.Error("OneCycleLR.LR past the total steps: no panic (torch raises)")
		}
	}()
	s.LR(101)
}

func TestSequentialWarmupCosine(t *testing.T) {
	// Linear warm-up from 0.01·0.1 over 5 steps, then cosine from 0.1 to 0
	// over 10 steps counted from the milestone, as SequentialLR.
	s := optim.Sequential{
		Schedules:  []optim.Schedule{optim.LinearLR{BaseLR: 0.1, StartFactor: 0.01, EndFactor: 1, TotalIters: 5}, optim.CosineAnnealingLR{BaseLR: 0.1, TMax: 10}},
		Milestones: []int{5},
	}
	checkSchedule(t, "warm-up then cosine", s, []lrCase{
		{0, 0.001}, {4, 0.1 * (0.01 + 0.99*4/5)}, {5, 0.1}, {10, 0.05}, {15, 0}})
	// StepLR composes too (a Schedule).
	var _ optim.Schedule = optim.StepLR{}
}
