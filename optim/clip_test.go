package optim_test

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// ClipGradNorm over gradients packed from two parameters, [3] and [4, 0]:
// the global norm is 5; torch's coefficient max_norm/(5 + 1e-6), clamped to
// 1, scales every gradient (float32: 1e-6 relative).
func TestClipGradNorm(t *testing.T) {
	for _, c := range []struct {
		maxNorm  float64
		grads    []float32
		wantNorm float64
		wantCoef float64
	}{
		{1, []float32{3, 4, 0}, 5, 1 / (5 + 1e-6)},
		{2.5, []float32{3, -4, 0}, 5, 2.5 / (5 + 1e-6)},
		{10, []float32{3, 4, 0}, 5, 1},                  // under the limit: unchanged
		{5, []float32{3, 4, 0}, 5, 5 / (5 + 1e-6)},      // at the limit: the 1e-6 still scales by a hair
		{1, []float32{0, 0, 0}, 0, 1},                   // 1/1e-6 clamped to 1
		{0, []float32{1, 2, 2}, 3, 0},                   // max norm 0 zeroes the gradients
		{math.Inf(1), []float32{1e3, 2e3, 2e3}, 3e3, 1}, // an infinite limit clips nothing
	} {
		a, b := param(0), tensor.FromFloat32(tensor.CPU, nil, []float32{0, 0}, 2).SetRequiresGrad(true)
		opt, err := optim.NewSGD([]nn.Parameter{{Name: "a", Tensor: a}, {Name: "b", Tensor: b}}, optim.SGDConfig{LR: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		opt.Gradients().CopyFrom(c.grads)
		s := tensor.NewScope()
		norm := optim.ClipGradNorm(s, opt.Gradients(), c.maxNorm)
		if got := float64(norm.Item()); math.Abs(got-c.wantNorm) > 1e-6*c.wantNorm {
			t.Errorf("max norm %g, grads %v: norm %v, want %v", c.maxNorm, c.grads, got, c.wantNorm)
		}
		got := append(a.Grad().Float32s(), b.Grad().Float32s()...)
		for i, g := range c.grads {
			want := float64(g) * c.wantCoef
			if math.Abs(float64(got[i])-want) > 1e-6*math.Abs(want) {
				t.Errorf("max norm %g, grads %v: clipped %v, want %v·%v", c.maxNorm, c.grads, got, c.grads, c.wantCoef)
				break
			}
		}
		s.Release()
	}
}

// A NaN in the gradients makes the norm and every clipped gradient NaN, as
// torch's clip_grad_norm_ does (error_if_nonfinite=False).
func TestClipGradNormNaN(t *testing.T) {
	p := tensor.FromFloat32(tensor.CPU, nil, []float32{0, 0, 0}, 3).SetRequiresGrad(true)
	opt, err := optim.NewAdam([]nn.Parameter{{Name: "p", Tensor: p}}, optim.DefaultAdamConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Release()
	opt.Gradients().CopyFrom([]float32{1, float32(math.NaN()), 2})
	norm := optim.ClipGradNorm(nil, opt.Gradients(), 1)
	defer norm.Release()
	if v := norm.Item(); !math.IsNaN(float64(v)) {
		t.Errorf("norm of gradients with a NaN: %v", v)
	}
	for i, g := range p.Grad().Float32s() {
		if !math.IsNaN(float64(g)) {
			t.Errorf("gradient %d after clipping by a NaN norm: %v, want NaN", i, g)
		}
	}
}
