package tensor_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// A Recompute nested in another: the outer one's second run replays the
// inner one's dropout masks too, and the generator ends where it would.
func TestRecomputeNestedDropout(t *testing.T) {
	run := func(recompute bool) (grad []float32, off uint64) {
		c := tensor.NewCountingCPU()
		gen := tensor.NewGenerator(3)
		w := randParam(c, rand.New(rand.NewPCG(1, 1)), 1, 8, 8)
		s := tensor.NewScope()
		defer s.Release()
		x := randInput(c, s, rand.New(rand.NewPCG(1, 2)), 4, 8)
		inner := func(in ...*tensor.Tensor) *tensor.Tensor {
			return tensor.Dropout(tensor.Linear(in[0], w, nil), 0.5, true, gen)
		}
		outer := func(in ...*tensor.Tensor) *tensor.Tensor {
			return tensor.Tanh(maybeRecompute(recompute, inner, in[0]))
		}
		y := maybeRecompute(recompute, outer, x)
		tensor.Sum(y).Backward()
		return w.Grad().Float32s(), gen.Offset()
	}
	g0, o0 := run(false)
	g1, o1 := run(true)
	if o0 != o1 {
		t.Errorf("generator offset %d after nested Recompute, %d without", o1, o0)
	}
	sameBits(t, "nested Recompute weight gradient", g1, g0)
}

// Batch norm inside a nested Recompute updates its statistics once: the
// inner one's first run inside the outer one's second run is a replay.
func TestRecomputeNestedBatchNorm(t *testing.T) {
	run := func(recompute bool) []float32 {
		c := tensor.NewCountingCPU()
		gamma := tensor.Full(c, nil, 1, 3).SetRequiresGrad(true)
		beta := tensor.Zeros(c, nil, 3).SetRequiresGrad(true)
		rm, rv := tensor.Zeros(c, nil, 3), tensor.Full(c, nil, 1, 3)
		s := tensor.NewScope()
		defer s.Release()
		x := randInput(c, s, rand.New(rand.NewPCG(1, 2)), 2, 3, 4, 4)
		inner := func(in ...*tensor.Tensor) *tensor.Tensor {
			return tensor.BatchNorm(in[0], gamma, beta, rm, rv, true, 0.1, 1e-5)
		}
		outer := func(in ...*tensor.Tensor) *tensor.Tensor {
			return tensor.ReLU(maybeRecompute(recompute, inner, in[0]))
		}
		y := maybeRecompute(recompute, outer, x)
		tensor.Sum(y).Backward()
		return rm.Float32s()
	}
	want := run(false)
	sameBits(t, "running mean after nested Recompute", run(true), want)
}

// Autocast switched off between the forward and backward passes: as the
// plain graph's backward follows its forward's choice, Recompute's second
// run follows the first's.
func TestRecomputeAutocastOfTheForward(t *testing.T) {
	run := func(recompute bool) []float32 {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(3, 3))
		w1, w2 := randParam(c, rng, 0.5, 16, 16), randParam(c, rng, 0.5, 16, 16)
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		x := randInput(c, s, rng, 8, 16)
		f := func(in ...*tensor.Tensor) *tensor.Tensor {
			return tensor.Linear(tensor.Tanh(tensor.Linear(in[0], w1, nil)), w2, nil)
		}
		y := maybeRecompute(recompute, f, x)
		loss := tensor.Sum(tensor.Mul(y, y))
		s.SetAutocast(tensor.Float32) // autocast around the forward only
		loss.Backward()
		return w1.Grad().Float32s()
	}
	want := run(false)
	sameBits(t, "w1 gradient, autocast off before Backward", run(true), want)
}

// fn returns a parameter itself: it gets its gradient and its
// SetGradReadyHook runs.
func TestRecomputeResultIsParameter(t *testing.T) {
	c := tensor.NewCountingCPU()
	w := randParam(c, rand.New(rand.NewPCG(1, 1)), 1, 4, 6)
	called := false
	w.SetGradReadyHook(func(*tensor.Tensor) { called = true })
	s := tensor.NewScope()
	defer s.Release()
	x := randInput(c, s, rand.New(rand.NewPCG(1, 2)), 4, 6)
	y := tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor { return w }, x)
	tensor.Sum(tensor.Mul(y, x)).Backward()
	if w.Grad() == nil {
		t.Fatal("no gradient")
	}
	sameBits(t, "w gradient", w.Grad().Float32s(), x.Float32s())
	if !called {
		t.Errorf("w's grad-ready hook never ran although w got its gradient")
	}
}

// Views fn takes of its input (Reshape) are gone with the run: in a scope
// that releases in backward, the block's input is given back during the
// pass either way.
func TestRecomputeInputViewsLeaveNoRefs(t *testing.T) {
	for _, view := range []bool{false, true} {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(3, 3))
		w := randParam(c, rng, 0.5, 16, 16)
		s := tensor.NewScope()
		s.SetReleaseInBackward(true)
		x0 := randInput(c, s, rng, 8, 16)
		x := tensor.Tanh(tensor.Linear(x0, w, nil)) // the block's input
		y := tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor {
			h := in[0]
			if view {
				h = h.Reshape(16, 8).Reshape(8, 16)
			}
			return tensor.Tanh(tensor.Linear(h, w, nil))
		}, x)
		tensor.Sum(y).Backward()
		if !x.Released() {
			t.Errorf("fn views its input %v: the block's input was not given back by Backward", view)
		}
		s.Release()
	}
}

// fn reading a tensor of the step's graph by closure, not as an input,
// panics saying so (its second run's backward pass would go on through
// the enclosing graph).
func TestRecomputeRefusesClosureOverTheGraph(t *testing.T) {
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(3, 3))
	w, b := randParam(c, rng, 0.5, 6, 6), randParam(c, rng, 0.5, 6)
	s := tensor.NewScope()
	defer s.Release()
	x := randInput(c, s, rng, 4, 6)
	bias := tensor.Tanh(tensor.Mul(b, tensor.Full(c, s, 2, 6))) // in the step's graph
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "pass it as an input") {
			t.Errorf("Recompute of a function reading a graph tensor by closure: %v; want a panic saying to pass it as an input", r)
		}
	}()
	tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor {
		return tensor.Tanh(tensor.Add(tensor.Linear(in[0], w, nil), bias))
	}, x)
}
