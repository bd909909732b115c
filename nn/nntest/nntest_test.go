package nntest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// The suite on the CPU against itself: every comparison is exact, so this
// checks that every case runs, that every parameter gets a gradient, and
// the absolute checks (the step counts).
func TestCPUPasses(t *testing.T) {
	leaks := tensor.Leaks()
	RunLayers(t, tensor.CPU)
	if l := tensor.Leaks() - leaks; l > 0 {
		t.Errorf("%d tensors left to the garbage collector", l)
	}
}

// recorder collects the failures of a run.
type recorder struct{ errs []string }

func (*recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// frozenCount is the CPU with AddScalar that adds nothing: a backend on
// which BatchNorm's step count would not advance.
type frozenCount struct{ tensor.CompleteBackend }

func (frozenCount) Name() string { return "cpu-frozen-count" }
func (f frozenCount) Unary(op tensor.UnaryOp, dst tensor.Buffer, x tensor.View, shape []int, a, b float32) {
	if op == tensor.OpAddScalar {
		a = 0
	}
	f.CompleteBackend.Unary(op, dst, x, shape, a, b)
}

// shiftedRandom is the CPU drawing one Philox block further on: dropout
// masks other than the CPU's for the same seed.
type shiftedRandom struct{ tensor.CompleteBackend }

func (shiftedRandom) Name() string { return "cpu-shifted-random" }
func (s shiftedRandom) Random(dst tensor.Buffer, dist tensor.Distribution, seed, offset uint64, lo, hi float32) {
	s.CompleteBackend.Random(dst, dist, seed, offset+1, lo, hi)
}

// The suite fails, naming the layer and the problem, on backends with one
// realistic bug each.
func TestMutantsFail(t *testing.T) {
	for _, m := range []struct {
		b         tensor.Backend
		layer     string
		complaint string
	}{
		{frozenCount{tensor.Complete(tensor.CPU)}, "BatchNorm2d", "num_batches_tracked = [0] after 2 training steps"},
		{shiftedRandom{tensor.Complete(tensor.CPU)}, "Dropout", "training step 1: output"},
		{shiftedRandom{tensor.Complete(tensor.CPU)}, "TransformerBlock", "training step 1: output"},
	} {
		var c Case
		for _, k := range Cases {
			if k.Name == m.layer {
				c = k
			}
		}
		if c.Build == nil {
			t.Fatalf("no case %q", m.layer)
		}
		r := &recorder{}
		c.run(r, m.b, 1)
		if all := strings.Join(r.errs, "\n"); !strings.Contains(all, m.complaint) || !strings.Contains(all, m.b.Name()) {
			t.Errorf("%s on %s: failures %q; want one saying %q", m.layer, m.b.Name(), all, m.complaint)
		}
	}
}

// The fused batch norm and activation on the CPU against its layers one
// by one, bit for bit.
func TestCPUBatchNormFusion(t *testing.T) { RunBatchNormFusion(t, tensor.CPU) }
