package optim_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// clearCase is a small model for the cleared-gradient tests: a linear
// layer always used, a second one used only on even steps (its gradient
// not reached on odd ones), and optionally a convolution, whose filter
// gradient is only added into (so the update must keep writing zeros).
type clearCase struct {
	a, b *nn.Linear
	conv *nn.Conv2d
}

func newClearCase(conv bool) *clearCase {
	rng := rand.New(rand.NewPCG(7, 8))
	c := &clearCase{a: nn.NewLinear(tensor.CPU, rng, 4, 3), b: nn.NewLinear(tensor.CPU, rng, 4, 3)}
	if conv {
		c.conv = nn.NewConv2d(tensor.CPU, rng, 1, 2, 2)
	}
	return c
}

func (c *clearCase) params() []nn.Parameter {
	ps := append(c.a.Parameters(), c.b.Parameters()...)
	if c.conv != nil {
		ps = append(ps, c.conv.Parameters()...)
	}
	return ps
}

// loss is the step's loss on fresh inputs of the step.
func (c *clearCase) loss(step int) *tensor.Tensor {
	rng := rand.New(rand.NewPCG(uint64(step), 3))
	xs := make([]float32, 8)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	x := tensor.FromFloat32(tensor.CPU, nil, xs, 2, 4)
	l := tensor.Sum(tensor.Mul(c.a.Forward(x), c.a.Forward(x)))
	if step%2 == 0 {
		l = tensor.Add(l, tensor.Sum(c.b.Forward(x)))
	}
	if c.conv != nil {
		l = tensor.Add(l, tensor.Sum(c.conv.Forward(x.Reshape(2, 1, 2, 2))))
	}
	return l
}

// TestStepAndZeroGradClears checks StepAndZeroGrad, after a ClearGrad
// that follows the first step, against Step then ZeroGrad, for SGD with
// momentum and AdamW, over six steps: the same parameters bit for bit,
// zero gradients afterwards (also those of a layer the last pass did not
// reach), and the gradients left cleared (not written) exactly when every
// one can be written whole (no convolution).
func TestStepAndZeroGradClears(t *testing.T) {
	type optimiser interface {
		Step()
		ZeroGrad()
		ClearGrad()
		StepAndZeroGrad()
	}
	makers := map[string]func([]nn.Parameter) (optimiser, error){
		"sgd": func(ps []nn.Parameter) (optimiser, error) {
			return optim.NewSGD(ps, optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 0.01})
		},
		"adamw": func(ps []nn.Parameter) (optimiser, error) {
			return optim.NewAdamW(ps, optim.AdamConfig{LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01})
		},
	}
	for name, newOpt := range makers {
		for _, conv := range []bool{false, true} {
			run := func(fused bool) (params [][]float32, cleared []bool) {
				c := newClearCase(conv)
				opt, err := newOpt(c.params())
				if err != nil {
					t.Fatal(err)
				}
				opt.ZeroGrad()
				for step := 0; step < 6; step++ {
					c.loss(step).Backward()
					if fused {
						opt.StepAndZeroGrad()
						if step == 0 {
							// The pass before has shown which gradients
							// are written whole: clear them from now on.
							opt.ClearGrad()
						}
					} else {
						opt.Step()
						opt.ZeroGrad()
					}
				}
				for _, p := range c.params() {
					cleared = append(cleared, p.Tensor.GradCleared())
				}
				for _, p := range c.params() {
					params = append(params, p.Tensor.Float32s())
					for i, g := range p.Tensor.Grad().Float32s() {
						if g != 0 {
							t.Errorf("%s conv=%v fused=%v: %s's gradient [%d] = %g after the step, want 0", name, conv, fused, p.Name, i, g)
						}
					}
				}
				return params, cleared
			}
			want, _ := run(false)
			got, cleared := run(true)
			for i := range want {
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("%s conv=%v: parameter %d is %v after StepAndZeroGrad, %v after Step and ZeroGrad", name, conv, i, got[i], want[i])
				}
			}
			for i, c := range cleared {
				// The odd last step did not reach b: its gradient was
				// written whole on the step before, and stays cleared.
				if c != !conv {
					t.Errorf("%s conv=%v: parameter %d cleared = %v, want %v", name, conv, i, c, !conv)
				}
			}
		}
	}
}

// TestClearedGradReadsZero checks that a cleared gradient reads as zero
// (Grad writes the zeros), and that a Backward after ClearGrad writes its
// gradient over the old values instead of adding to them.
func TestClearedGradReadsZero(t *testing.T) {
	w := tensor.FromFloat32(tensor.CPU, nil, []float32{1, 2}, 2).SetRequiresGrad(true)
	tensor.Sum(tensor.Mul(w, w)).Backward() // grad 2w = [2, 4]
	w.Grad()                                // not cleared: no effect
	w.ClearGrad()
	if !w.GradCleared() {
		t.Fatal("GradCleared false after ClearGrad")
	}
	tensor.Sum(w).Backward() // grad [1, 1], written over [2, 4]
	if w.GradCleared() {
		t.Error("GradCleared true after a Backward wrote the gradient")
	}
	if g := w.Grad().Float32s(); !slices.Equal(g, []float32{1, 1}) {
		t.Errorf("gradient after ClearGrad and Backward = %v, want [1 1]", g)
	}
	w.ClearGrad()
	if g := w.Grad().Float32s(); !slices.Equal(g, []float32{0, 0}) {
		t.Errorf("cleared gradient reads %v, want zeros", g)
	}
	w.ClearGrad()
	w.RestoreGradCleared(false)
	if g := w.Grad().Float32s(); !slices.Equal(g, []float32{0, 0}) {
		t.Errorf("gradient after a restored mark reads %v, want the zeros it held", g)
	}
}
