package tensor_test

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// Semantics of the autograd engine and of scopes: accumulation, ZeroGrad,
// fan-out, consumed graphs, no-grad scopes, releasing, leaks.

var cpu = tensor.CPU

func equalF32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d is %v, want %v (all: %v)", what, i, got[i], want[i], got)
		}
	}
}

// mustPanic runs f and fails unless it panics with a message containing
// substr.
func mustPanic(t *testing.T, what, substr string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Errorf("%s: no panic", what)
			return
		}
		if msg, _ := r.(string); !strings.Contains(msg, substr) {
			t.Errorf("%s: panic %v, want one mentioning %q", what, r, substr)
		}
	}()
	f()
}

// Gradients of two Backward calls add up, as in PyTorch, until ZeroGrad,
// which zeroes them in place.
func TestGradientAccumulation(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	w := tensor.FromFloat32(cpu, nil, []float32{1, 2, 3}, 3).SetRequiresGrad(true)
	defer w.Release()
	step := func() {
		x := tensor.FromFloat32(cpu, s, []float32{0.5, -1, 4}, 3)
		tensor.Sum(tensor.Mul(w, x)).Backward() // d/dw = x
	}
	step()
	g := w.Grad()
	equalF32(t, "grad after one Backward", g.Float32s(), []float32{0.5, -1, 4})
	step()
	equalF32(t, "grad after two Backward calls", w.Grad().Float32s(), []float32{1, -2, 8})
	if w.Grad() != g {
		t.Errorf("the gradient tensor was replaced instead of accumulated into")
	}
	w.ZeroGrad()
	equalF32(t, "grad after ZeroGrad", w.Grad().Float32s(), []float32{0, 0, 0})
	if w.Grad() != g {
		t.Errorf("ZeroGrad replaced the gradient tensor; it must keep its memory")
	}
	step()
	equalF32(t, "grad after ZeroGrad and Backward", w.Grad().Float32s(), []float32{0.5, -1, 4})
	g.Release()

	// nn.ZeroGrad zeroes every parameter of a module.
	l := nn.NewLinear(cpu, rand.New(rand.NewPCG(1, 2)), 3, 2)
	x := tensor.FromFloat32(cpu, s, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	tensor.Sum(l.Forward(x)).Backward()
	for _, p := range l.Parameters() {
		if p.Tensor.Grad() == nil {
			t.Fatalf("%s has no gradient", p.Name)
		}
	}
	equalF32(t, "Linear bias grad", l.Bias.Grad().Float32s(), []float32{2, 2})
	equalF32(t, "Linear weight grad", l.Weight.Grad().Float32s(), []float32{5, 7, 9, 5, 7, 9})
	nn.ZeroGrad(l)
	for _, p := range l.Parameters() {
		for _, v := range p.Tensor.Grad().Float32s() {
			if v != 0 {
				t.Fatalf("%s not zeroed by nn.ZeroGrad", p.Name)
			}
		}
		p.Tensor.Grad().Release()
		p.Tensor.Release()
	}
}

// A tensor used several times receives the sum of its gradients.
func TestFanOut(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(cpu, s, []float32{1, -2, 3}, 3).SetRequiresGrad(true)
	tensor.Sum(tensor.Add(x, x)).Backward()
	equalF32(t, "d/dx sum(x+x)", x.Grad().Float32s(), []float32{2, 2, 2})

	y := tensor.FromFloat32(cpu, s, []float32{1, -2, 3}, 3).SetRequiresGrad(true)
	tensor.Sum(tensor.Mul(y, y)).Backward()
	equalF32(t, "d/dy sum(y*y)", y.Grad().Float32s(), []float32{2, -4, 6})

	// An intermediate used three times: h = 2z; out = h*h + h + sum(h).
	z := tensor.FromFloat32(cpu, s, []float32{1, -2, 3}, 3).SetRequiresGrad(true)
	h := tensor.Add(z, z)
	out := tensor.Add(tensor.Sum(tensor.Add(tensor.Mul(h, h), h)), tensor.Sum(h))
	out.Backward()
	// d/dz = 2·(2h + 1 + 1) = 8z + 4
	equalF32(t, "fan-out of an intermediate", z.Grad().Float32s(), []float32{12, -12, 28})
}

// Backward consumes the graph: a second Backward on it panics, as in
// PyTorch (without retain_graph), and so does a backward pass that reaches
// a consumed intermediate through a new graph.
func TestBackwardTwicePanics(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(cpu, s, []float32{1, 2}, 2).SetRequiresGrad(true)
	loss := tensor.Sum(tensor.Mul(x, x))
	if loss.IsLeaf() {
		t.Fatalf("a computed tensor reports IsLeaf")
	}
	loss.Backward()
	equalF32(t, "grad", x.Grad().Float32s(), []float32{2, 4})
	mustPanic(t, "second Backward", "consumed", func() { loss.Backward() })
	equalF32(t, "grad after the failed second Backward", x.Grad().Float32s(), []float32{2, 4})
	if loss.IsLeaf() {
		t.Errorf("a consumed computed tensor reports IsLeaf")
	}
	mustPanic(t, "SetRequiresGrad on a consumed tensor", "only leaves", func() { loss.SetRequiresGrad(true) })

	h := tensor.Mul(x, x)
	tensor.Sum(h).Backward()
	l2 := tensor.Sum(tensor.Add(h, h))
	mustPanic(t, "Backward through a consumed intermediate", "consumed", func() { l2.Backward() })

	// Backward of a leaf scalar adds one to its gradient.
	c := tensor.FromFloat32(cpu, s, []float32{5}, 1).SetRequiresGrad(true)
	c.Backward()
	c.Backward()
	equalF32(t, "leaf Backward twice", c.Grad().Float32s(), []float32{2})

	mustPanic(t, "Backward of a non-scalar", "non-scalar", func() { tensor.Mul(x, x).Backward() })
	mustPanic(t, "Backward without grad", "does not require grad",
		func() { tensor.Sum(tensor.FromFloat32(cpu, s, []float32{1}, 1)).Backward() })
}

// A no-grad scope records no graph: outputs need no gradient, Backward
// refuses them, parameters get no gradient, and CrossEntropy allocates no
// gradient buffer.
func TestNoGradScope(t *testing.T) {
	l := nn.NewLinear(cpu, nil, 4, 3)
	defer l.Weight.Release()
	defer l.Bias.Release()
	s := tensor.NewNoGradScope()
	defer s.Release()
	if s.GradEnabled() {
		t.Fatalf("NewNoGradScope().GradEnabled() is true")
	}
	x := tensor.FromFloat32(cpu, s, []float32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 4)
	y := tensor.ReLU(l.Forward(x))
	if y.RequiresGrad() || !y.IsLeaf() {
		t.Errorf("output in a no-grad scope: RequiresGrad %v, IsLeaf %v; want false, true", y.RequiresGrad(), y.IsLeaf())
	}
	before := s.Len()
	loss := tensor.CrossEntropy(y, tensor.FromInt32(cpu, s, []int32{0, 2}, 2))
	if got := s.Len() - before; got != 2 { // the labels and the loss
		t.Errorf("CrossEntropy in a no-grad scope made %d allocations, want 2 (labels, loss): no gradient buffer", got)
	}
	if loss.RequiresGrad() {
		t.Errorf("loss in a no-grad scope requires grad")
	}
	mustPanic(t, "Backward in a no-grad scope", "does not require grad", func() { loss.Backward() })
	if l.Weight.Grad() != nil || l.Bias.Grad() != nil {
		t.Errorf("parameters got gradients from a no-grad scope")
	}
	// The same computation in an ordinary scope records.
	g := tensor.NewScope()
	defer g.Release()
	x2 := tensor.FromFloat32(cpu, g, []float32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 4)
	if !tensor.ReLU(l.Forward(x2)).RequiresGrad() {
		t.Errorf("output in a grad scope does not require grad")
	}
	// Detach records nothing either.
	if d := tensor.ReLU(l.Forward(x2)).Detach(); d.RequiresGrad() || !d.IsLeaf() {
		t.Errorf("Detach: RequiresGrad %v, IsLeaf %v", d.RequiresGrad(), d.IsLeaf())
	}
}

// Releasing a scope frees every tensor made in it (inputs, intermediates,
// gradients of intermediates) and nothing else; the scope then refuses new
// allocations, while Reset leaves it usable.
func TestScopeRelease(t *testing.T) {
	w := tensor.FromFloat32(cpu, nil, []float32{1, 2, 3, 4}, 2, 2).SetRequiresGrad(true)
	defer w.Release()
	s := tensor.NewScope()
	x := tensor.FromFloat32(cpu, s, []float32{1, 1, 2, 2}, 2, 2)
	h := tensor.MatMul(x, w)
	r := tensor.ReLU(h)
	v := r.Reshape(4) // a view
	loss := tensor.Sum(v)
	loss.Backward()
	if s.Len() == 0 {
		t.Fatalf("scope owns nothing after a forward and backward pass")
	}
	for _, tt := range []*tensor.Tensor{x, h, r, v, loss} {
		if tt.Scope() != s {
			t.Errorf("%v: scope %p, want the input's %p", tt, tt.Scope(), s)
		}
	}
	if w.Scope() != nil || w.Grad().Scope() != nil {
		t.Errorf("a parameter or its gradient belongs to a scope")
	}
	s.Release()
	if s.Len() != 0 {
		t.Errorf("released scope still owns %d allocations", s.Len())
	}
	for i, tt := range []*tensor.Tensor{x, h, r, v, loss} {
		if !tt.Released() {
			t.Errorf("tensor %d of the released scope is not released", i)
		}
	}
	if w.Released() || w.Grad().Released() {
		t.Errorf("releasing a scope released a parameter or its gradient")
	}
	equalF32(t, "parameter gradient after the scope is gone", w.Grad().Float32s(), []float32{3, 3, 3, 3})
	w.Grad().Release()
	mustPanic(t, "allocation in a released scope", "released scope", func() { tensor.Zeros(cpu, s, 2) })

	// Reset frees and stays usable; the gradient of a scoped leaf goes
	// with its scope.
	s2 := tensor.NewScope()
	defer s2.Release()
	a := tensor.FromFloat32(cpu, s2, []float32{1, 2}, 2).SetRequiresGrad(true)
	tensor.Sum(tensor.Mul(a, a)).Backward()
	ga := a.Grad()
	if ga.Scope() != s2 {
		t.Errorf("gradient of a scoped leaf is not in its scope")
	}
	s2.Reset()
	if !a.Released() || !ga.Released() {
		t.Errorf("Reset did not free the scope's tensors (leaf %v, its gradient %v)", a.Released(), ga.Released())
	}
	b := tensor.Zeros(cpu, s2, 3)
	if b.Released() || s2.Len() != 1 {
		t.Errorf("scope not usable after Reset")
	}
}

// Using a released tensor panics rather than reading freed (on a GPU:
// reused) memory.
func TestUseAfterRelease(t *testing.T) {
	x := tensor.FromFloat32(cpu, nil, []float32{1, 2, 3, 4}, 2, 2)
	y := tensor.FromFloat32(cpu, nil, []float32{1, 2, 3, 4}, 2, 2)
	defer y.Release()
	view := x.Transpose(0, 1)
	x.Release()
	x.Release() // idempotent
	if !x.Released() || !view.Released() {
		t.Fatalf("Release: tensor %v, view %v; want both released", x.Released(), view.Released())
	}
	mustPanic(t, "Float32s", "released", func() { x.Float32s() })
	mustPanic(t, "Add", "released", func() { tensor.Add(x, y) })
	mustPanic(t, "Add (second operand)", "released", func() { tensor.Add(y, x) })
	mustPanic(t, "MatMul", "released", func() { tensor.MatMul(y, x) })
	mustPanic(t, "strided view", "released", func() { view.Contiguous() })
	mustPanic(t, "CopyFrom", "released", func() { x.CopyFrom([]float32{0, 0, 0, 0}) })

	s := tensor.NewScope()
	z := tensor.FromFloat32(cpu, s, []float32{1}, 1)
	s.Release()
	mustPanic(t, "tensor of a released scope", "released", func() { z.Item() })
}

// settleLeaks runs the collector until the leak counter stops moving (the
// cleanups of storages collected without release run asynchronously) and
// returns it.
func settleLeaks() int64 {
	last := int64(-1)
	for i := 0; i < 50; i++ {
		runtime.GC()
		time.Sleep(2 * time.Millisecond)
		n := tensor.Leaks()
		if n == last && i >= 3 {
			return n
		}
		last = n
	}
	return last
}

// A training loop that resets its scope every step leaks nothing: after 20
// LeNet steps and a few collections, Leaks() has not moved, and the scope
// holds the same number of allocations at the end of every step.
func TestNoLeaksLeNetTraining(t *testing.T) {
	before := settleLeaks()
	if before != 0 {
		t.Logf("Leaks() is %d before the loop (earlier tests); checking that the loop adds none", before)
	}
	const steps, batch = 20, 4
	m := models.NewLeNet(cpu, 3)
	params := nn.Parameters(m)
	opt, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.01, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(4, 4))
	s := tensor.NewScope()
	perStep := -1
	for step := 0; step < steps; step++ {
		s.Reset()
		if s.Len() != 0 {
			t.Fatalf("step %d: Reset left %d allocations", step, s.Len())
		}
		img := make([]float32, batch*784)
		for i := range img {
			img[i] = float32(rng.NormFloat64())
		}
		lab := make([]int32, batch)
		for i := range lab {
			lab[i] = int32(rng.IntN(10))
		}
		x := tensor.FromFloat32(cpu, s, img, batch, 1, 28, 28)
		logits := m.Forward(x)
		loss := tensor.CrossEntropy(logits, tensor.FromInt32(cpu, s, lab, batch))
		opt.ZeroGrad()
		loss.Backward()
		opt.Step()
		_ = loss.Item()
		_ = tensor.Argmax(logits).Int32s()
		if perStep < 0 {
			perStep = s.Len()
		} else if s.Len() != perStep {
			t.Errorf("step %d: the scope owns %d allocations, the first step %d", step, s.Len(), perStep)
		}
	}
	s.Release()
	for _, p := range params {
		if p.Tensor.Released() {
			t.Fatalf("%s released by the step scope", p.Name)
		}
	}
	params[0].Tensor.Release() // the packed parameters, gradients, momentum
	params[0].Tensor.Grad().Release()
	opt.MomentumBuffer().Release()
	if after := settleLeaks(); after != before {
		t.Errorf("Leaks() went from %d to %d over %d training steps", before, after, steps)
	}
}

// A tensor dropped without release is counted by Leaks once collected:
// the counter that TestNoLeaksLeNetTraining relies on works.
func TestLeaksCountsUnreleased(t *testing.T) {
	before := settleLeaks()
	func() {
		for i := 0; i < 3; i++ {
			_ = tensor.Zeros(cpu, nil, 16)
		}
	}()
	if after := settleLeaks(); after != before+3 {
		t.Errorf("Leaks() went from %d to %d after dropping 3 unreleased tensors, want +3", before, after)
	}
}

// fillCounter is the CPU backend counting the fills with ones.
type fillCounter struct {
	tensor.CompleteBackend
	ones int
}

func (f *fillCounter) Fill(dst tensor.Buffer, v float32) {
	if v == 1 {
		f.ones++
	}
	f.CompleteBackend.Fill(dst, v)
}

// Backward's seed of ones is filled only when a backward function reads
// it: never for a cross entropy (which knows its gradient is one), once
// when it is read through a view.
func TestBackwardSeedFilledOnlyWhenRead(t *testing.T) {
	b := &fillCounter{CompleteBackend: tensor.Complete(cpu)}
	s := tensor.NewScope()
	defer s.Release()
	z := tensor.FromFloat32(b, s, []float32{1, 2, 3, 0, -1, 4}, 2, 3).SetRequiresGrad(true)
	tensor.CrossEntropy(z, tensor.FromInt32(b, s, []int32{2, 0}, 2)).Backward()
	if b.ones != 0 {
		t.Errorf("the seed was filled %d times for a cross entropy, want 0", b.ones)
	}
	x := tensor.FromFloat32(b, s, []float32{1, 2, 3}, 3).SetRequiresGrad(true)
	tensor.Sum(tensor.Mul(x, x)).Reshape(1, 1).Backward()
	if b.ones != 1 {
		t.Errorf("the seed was filled %d times when read through a view, want 1", b.ones)
	}
	equalF32(t, "gradient through a view of the seed", x.Grad().Float32s(), []float32{2, 4, 6})
}
