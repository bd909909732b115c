package tensor_test

import (
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

func TestScopeBorrow(t *testing.T) {
	x := tensor.FromFloat32(cpu, nil, []float32{-1, 2, -3, 4}, 2, 2).SetRequiresGrad(true)
	defer x.Release()
	s := tensor.NewScope()
	defer s.Release()
	for step := 1; step <= 2; step++ {
		s.Reset()
		xb := s.Borrow(x)
		if xb.Scope() != s || !xb.RequiresGrad() {
			t.Fatalf("step %d: borrowed view: scope %p requires grad %v; want %p, true", step, xb.Scope(), xb.RequiresGrad(), s)
		}
		y := tensor.ReLU(xb)
		loss := tensor.Sum(y)
		if y.Scope() != s || loss.Scope() != s {
			t.Fatalf("step %d: outputs of a borrowed view are not in its scope", step)
		}
		loss.Backward()
		// ReLU's gradient is 1 where x > 0; each step adds it into x's.
		want := []float32{0, float32(step), 0, float32(step)}
		if got := x.Grad().Float32s(); !slices.Equal(got, want) {
			t.Errorf("step %d: x.Grad = %v, want %v", step, got, want)
		}
		if x.Grad().Scope() != nil {
			t.Errorf("step %d: the leaf's gradient belongs to a scope", step)
		}
	}
	s.Reset()
	if x.Released() {
		t.Fatalf("Reset of the borrowing scope released the borrowed tensor")
	}
	if got := x.Float32s(); !slices.Equal(got, []float32{-1, 2, -3, 4}) {
		t.Errorf("borrowed tensor after Reset = %v", got)
	}
	x.Grad().Release()

	ng := tensor.NewNoGradScope()
	defer ng.Release()
	if xb := ng.Borrow(x); xb.RequiresGrad() || xb.Scope() != ng {
		t.Errorf("a view borrowed by a no-grad scope: requires grad %v, scope %p; want false, %p", xb.RequiresGrad(), xb.Scope(), ng)
	}
	var none *tensor.Scope
	if none.Borrow(x) != x {
		t.Errorf("a nil scope's Borrow is not the tensor itself")
	}
}

// TestScopeBorrowGradientIntoTheLeaf checks that the gradient reaching a
// borrowed view of a leaf is the leaf's, as an unborrowed leaf's is, when
// the view is read by several operations, and that it is written into the
// leaf's Grad with no buffer of the view's own on the way.
func TestScopeBorrowGradientIntoTheLeaf(t *testing.T) {
	const n = 1 << 12
	c := tensor.NewCountingCPU()
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i%7) - 3
	}
	f := func(x, y *tensor.Tensor) *tensor.Tensor {
		return tensor.Sum(tensor.Add(tensor.Mul(x, y), tensor.Add(tensor.ReLU(x), y)))
	}
	// The reference: the leaves read directly, two steps.
	ra := tensor.FromFloat32(c, nil, vals, n).SetRequiresGrad(true)
	rb := tensor.FromFloat32(c, nil, vals, n).SetRequiresGrad(true)
	for range 2 {
		s := tensor.NewScope()
		f(ra, rb).Backward()
		s.Release()
	}
	a := tensor.FromFloat32(c, nil, vals, n).SetRequiresGrad(true)
	b := tensor.FromFloat32(c, nil, vals, n).SetRequiresGrad(true)
	s := tensor.NewScope()
	defer s.Release()
	for range 2 {
		s.Reset()
		f(s.Borrow(a), s.Borrow(b)).Backward()
	}
	for _, p := range [][2]*tensor.Tensor{{a, ra}, {b, rb}} {
		if got, want := p[0].Grad().Float32s(), p[1].Grad().Float32s(); !slices.Equal(got, want) {
			t.Fatalf("borrowed leaf's gradient %v..., want %v... (unborrowed)", got[:8], want[:8])
		}
	}
	// One step of a + b, whose leaves have gradients already: Add's
	// output's gradient is at most n floats (Sum hands it on unfilled), and
	// Add's backward adds it into both leaves. A borrowed view with a
	// gradient of its own would hold n more.
	s.Reset()
	loss := tensor.Sum(tensor.Add(s.Borrow(a), s.Borrow(b)))
	before := c.Live()
	c.ResetPeak()
	loss.Backward()
	if extra := c.Peak() - before; extra > 4*n+64 {
		t.Errorf("Backward through borrowed leaves held %d bytes more at its peak, want at most %d (one gradient)", extra, 4*n+64)
	}
	for _, x := range []*tensor.Tensor{a, b, ra, rb} {
		x.Grad().Release()
		x.Release()
	}
}
