package cuda

import (
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestRecordedOptim runs the optimisers through the backend with the
// recording executor: every launch is checked against its kernel's C
// signature and memory. It also checks what makes a step capturable as a
// graph: once Prepare has run, a step issues kernels only (no upload), one
// per parameter group; and a clip is three launches with no download.
func TestRecordedOptim(t *testing.T) {
	b, rec := newRecordingBackend(t)
	// Direct calls, with and without the optional buffers.
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	p, g, m, v, x, s := f(1001), f(1001), f(1001), f(1001), f(1001), f(tensor.NumAdamScalars)
	h := tensor.AdamStep{Beta2: 0.999, OneMinusBeta2: 0.001, Eps: 1e-8}
	b.Adam(p, g, m, v, tensor.Buffer{}, s, h)
	h.AMSGrad, h.ZeroGrad, h.WeightDecay = true, true, 0.01
	b.Adam(p, g, m, v, x, s, h)
	b.SGDDevice(p, g, v, s.Slice(0, tensor.NumSGDScalars), tensor.SGDStep{Nesterov: true})
	b.SGDDevice(p, g, tensor.Buffer{}, s.Slice(0, tensor.NumSGDScalars), tensor.SGDStep{ZeroGrad: true})
	b.ClipCoef(s.Slice(0, 1), s.Slice(1, 1), g, 1)
	b.ClipCoef(s.Slice(0, 1), s.Slice(1, 1), f(300007), 1) // several partial blocks
	b.ClipCoef(s.Slice(0, 1), s.Slice(1, 1), f(0), 1)

	// Through package optim on LeNet's parameters, two groups.
	model := models.NewLeNet(b, 1)
	adam, err := optim.NewAdamGroups(optim.DecayGroups(model.Parameters(), 1e-3, 0.01), optim.DefaultAdamWConfig(), true)
	if err != nil {
		t.Fatal(err)
	}
	adam.Step()
	adam.SetLR(5e-4)
	adam.Prepare()
	rec.reset()
	adam.StepAndZeroGrad()
	if n := rec.kernelLaunches(); n != 2 || rec.launches["ember_adam"] != 2 || rec.copies != 0 {
		t.Errorf("a prepared AdamW step with two groups: %d launches %v, %d copies; want 2 ember_adam, no copy", n, rec.launches, rec.copies)
	}
	rec.reset()
	norm := optim.ClipGradNorm(nil, adam.Gradients(), 1)
	if rec.kernelLaunches() != 3 || rec.launches["ember_sumsq_partial"] != 1 || rec.launches["ember_clip_coef"] != 1 || rec.launches["ember_scale_by"] != 1 || rec.copies != 0 {
		t.Errorf("ClipGradNorm: launches %v, %d copies; want sumsq_partial, clip_coef and scale_by, no copy", rec.launches, rec.copies)
	}
	norm.Release()
	adam.Release()

	sgd, err := optim.NewSGD(models.NewLeNet(b, 2).Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	sgd.SetLR(0.05)
	rec.reset()
	sgd.StepAndZeroGrad()
	if rec.launches["ember_sgd_device"] != 1 || rec.kernelLaunches() != 1 || rec.copies != 0 {
		t.Errorf("SGD step after SetLR: launches %v, %d copies; want one ember_sgd_device, no copy", rec.launches, rec.copies)
	}
	sgd.SetLR(0.01) // a new rate: one upload, then kernels only
	rec.reset()
	sgd.Step()
	if rec.launches["ember_sgd_device"] != 1 || rec.copies != 0 {
		t.Errorf("SGD step after a second SetLR: launches %v, %d copies", rec.launches, rec.copies)
	}
	if err := sgd.SetMomentum(0.85); err != nil { // a cycled momentum: the same, kernels only
		t.Fatal(err)
	}
	rec.reset()
	sgd.Step()
	if rec.launches["ember_sgd_device"] != 1 || rec.kernelLaunches() != 1 || rec.copies != 0 {
		t.Errorf("SGD step after SetMomentum: launches %v, %d copies; want one ember_sgd_device, no copy", rec.launches, rec.copies)
	}
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
}
