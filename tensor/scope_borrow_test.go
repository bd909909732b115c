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
