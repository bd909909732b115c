package tensor_test

import (
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestReleaseInputsThroughAView: memory held through an input and a
// reshape of it that the caller made goes back when both are given
// (ReleaseInputs), and not when only one is (ReleaseInput), when another
// view of it is still held, or when a recorded operation reads it.
func TestReleaseInputsThroughAView(t *testing.T) {
	for _, c := range []struct {
		name  string
		give  func(in, view, out *tensor.Tensor) bool
		extra bool // another view held
		read  bool // a recorded operation reads the memory
		freed bool
	}{
		{"both", func(in, view, out *tensor.Tensor) bool { return tensor.ReleaseInputs(out, in, view) }, false, false, true},
		{"the input alone", func(in, view, out *tensor.Tensor) bool { return tensor.ReleaseInput(in, out) }, false, false, false},
		{"the view alone", func(in, view, out *tensor.Tensor) bool { return tensor.ReleaseInput(view, out) }, false, false, false},
		{"another view held", func(in, view, out *tensor.Tensor) bool { return tensor.ReleaseInputs(out, in, view) }, true, false, false},
		{"read by a product", func(in, view, out *tensor.Tensor) bool { return tensor.ReleaseInputs(out, in, view) }, false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := tensor.NewCountingCPU()
			s := tensor.NewScope()
			defer s.Release()
			s.SetReleaseInBackward(true)
			p := tensor.Full(b, s, 1, 4, 6).SetRequiresGrad(true)
			in := tensor.Add(p, p) // its backward reads neither its inputs nor its output
			view := in.Reshape(2, 12)
			if c.extra {
				in.Reshape(24)
			}
			other := tensor.Full(b, s, 2, 2, 12)
			var out *tensor.Tensor
			if c.read {
				out = tensor.Mul(view, other)
			} else {
				out = tensor.Add(view, other)
			}
			before := b.Live()
			freed := c.give(in, view, out)
			if freed != c.freed || (before-b.Live() == 4*24) != c.freed {
				t.Fatalf("reported %v, %d bytes given back: want freed %v (96 bytes)", freed, before-b.Live(), c.freed)
			}
			tensor.Sum(out).Backward()
			if g := p.Grad().Float32s(); g[0] != map[bool]float32{false: 2, true: 4}[c.read] {
				t.Fatalf("gradient %v after the release", g[0])
			}
		})
	}
}
