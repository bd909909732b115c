package tensor_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// SetGradReadyHook fires once per leaf and pass, in the order the gradients
// become final, each time with the complete gradient: w2 (the last layer)
// before w1, and the bias used by two operations only after both have
// added into it.
func TestGradReadyHook(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		return v
	}
	w1 := tensor.FromFloat32(cpu, nil, rnd(12), 3, 4).SetRequiresGrad(true)
	w2 := tensor.FromFloat32(cpu, nil, rnd(8), 4, 2).SetRequiresGrad(true)
	bias := tensor.FromFloat32(cpu, nil, rnd(8), 2, 4).SetRequiresGrad(true)
	unhooked := tensor.FromFloat32(cpu, nil, rnd(8), 4, 2).SetRequiresGrad(true)
	defer func() {
		for _, p := range []*tensor.Tensor{w1, w2, bias, unhooked} {
			p.Release()
		}
	}()
	var order []string
	atHook := map[string][]float32{}
	seen := map[string]int{}
	hook := func(name string) func(*tensor.Tensor) {
		return func(p *tensor.Tensor) {
			order = append(order, name)
			seen[name]++
			atHook[name] = append([]float32(nil), p.Grad().Float32s()...)
			// The earlier layer's gradient must not be there yet when the
			// last layer's is ready.
			if name == "w2" && w1.Grad() != nil {
				for _, v := range w1.Grad().Float32s() {
					if v != 0 {
						t.Errorf("w1's gradient was already written when w2's hook ran")
						break
					}
				}
			}
		}
	}
	w1.SetGradReadyHook(hook("w1"))
	w2.SetGradReadyHook(hook("w2"))
	bias.SetGradReadyHook(hook("bias"))
	for pass := range 2 {
		order, seen = nil, map[string]int{}
		for _, p := range []*tensor.Tensor{w1, w2, bias, unhooked} {
			p.ZeroGrad()
		}
		s := tensor.NewScope()
		x := tensor.FromFloat32(cpu, s, rnd(6), 2, 3)
		h := tensor.Tanh(tensor.Add(tensor.MatMul(x, w1), bias)) // bias, use 1
		h = tensor.Mul(h, bias)                                  // bias, use 2
		y := tensor.Add(tensor.MatMul(h, w2), tensor.MatMul(h, unhooked))
		tensor.Sum(tensor.Mul(y, y)).Backward()
		for name, p := range map[string]*tensor.Tensor{"w1": w1, "w2": w2, "bias": bias} {
			if seen[name] != 1 {
				t.Fatalf("pass %d: the hook of %s ran %d times, want once", pass, name, seen[name])
			}
			equalF32(t, "pass "+name+" at its hook", atHook[name], p.Grad().Float32s())
		}
		if len(order) != 3 || order[2] != "w1" {
			t.Fatalf("pass %d: hooks ran in the order %v; w1, the first layer, comes last", pass, order)
		}
		s.Release()
	}
	mustPanic(t, "hook on a computed tensor", "only leaves", func() {
		s := tensor.NewScope()
		defer s.Release()
		tensor.Mul(w1, w1).SetGradReadyHook(func(*tensor.Tensor) {})
	})
}

// Function takes part in Backward like a built-in operation: a function
// of x defined outside the package (here y = 3x², out of Square and a
// scale computed on the host) gives x the gradient its backward says,
// added to the gradients of the other paths.
func TestFunction(t *testing.T) {
	x := tensor.FromFloat32(cpu, nil, []float32{1, -2, 0.5}, 3).SetRequiresGrad(true)
	defer x.Release()
	s := tensor.NewScope()
	defer s.Release()
	host := x.Float32s()
	for i, v := range host {
		host[i] = 3 * v * v
	}
	y := tensor.Function("three_squares", tensor.FromFloat32(cpu, s, host, 3), func(g *tensor.Tensor) []*tensor.Tensor {
		return []*tensor.Tensor{tensor.Mul(g, tensor.MulScalar(x.Detach(), 6))}
	}, x)
	if !y.RequiresGrad() {
		t.Fatal("the result of a Function of a parameter does not require grad")
	}
	tensor.Sum(tensor.Add(y, x)).Backward() // d/dx = 6x + 1
	equalF32(t, "gradient through Function", x.Grad().Float32s(), []float32{7, -11, 4})
	mustPanic(t, "Function of a computed tensor", "already has a history", func() {
		tensor.Function("bad", tensor.Mul(x, x), func(*tensor.Tensor) []*tensor.Tensor { return nil }, x)
	})
}
