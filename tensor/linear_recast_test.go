package tensor

import (
	"math/rand/v2"
	"testing"
)

// TestLinearRecastsHeldInput: under autocast, a linear layer whose input
// is kept by the operation that made it (a softmax reads its output in
// its backward pass; through a reshape) keeps no bfloat16 copy of that
// input and casts it again in its backward pass; one whose input is a
// GELU's output makes the copy again from the GELU's input (on the CPU by
// Unary and Cast). The loss and every gradient are the same bits as with
// the copy kept, and the forward pass ends holding the copy's bytes less
// (the GELU's float32 output given back as a Sequential does). An input
// whose maker keeps neither (a sum reads nothing) still has its copy
// kept, and so does one below recastMin elements.
func TestLinearRecastsHeldInput(t *testing.T) {
	const batch, rows, in, out = 3, 5, 16, 7
	type result struct {
		held   int
		values [][]float32
	}
	defer func(n int) { recastMin = n }(recastMin)
	recastMin = 0 // these copies are far below the size it takes
	run := func(recast bool, maker func(*Tensor) *Tensor) result {
		defer func(v bool) { recastHeld = v }(recastHeld)
		recastHeld = recast
		b := NewCountingCPU()
		rng := rand.New(rand.NewPCG(9, 1))
		s := NewScope()
		defer s.Release()
		s.SetAutocast(BFloat16)
		param := func(s *Scope, shape ...int) *Tensor {
			n := 1
			for _, d := range shape {
				n *= d
			}
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return FromFloat32(b, s, v, shape...).SetRequiresGrad(true)
		}
		w, bias := param(nil, out, in), param(nil, out) // long-lived parameters
		defer w.Release()
		defer bias.Release()
		x0 := param(s, batch*rows*in)
		x := x0.Reshape(batch, rows, in)
		before := b.Live()
		h := maker(x)
		y := Linear(h.Reshape(batch*rows, in), w, bias)
		ReleaseInput(h, y)
		loss := Sum(Mul(y, y))
		held := b.Live() - before
		loss.Backward()
		return result{held, [][]float32{loss.Float32s(), x0.Grad().Float32s(), w.Grad().Float32s(), bias.Grad().Float32s()}}
	}
	copyBytes := batch * rows * in * 2
	for _, c := range []struct {
		name  string
		maker func(*Tensor) *Tensor
		saved int
	}{
		{"softmax", func(x *Tensor) *Tensor { return Softmax(x, -1) }, copyBytes},
		{"gelu", func(x *Tensor) *Tensor { return GELU(x, false) }, copyBytes},
		{"gelu tanh", func(x *Tensor) *Tensor { return GELU(x, true) }, copyBytes},
		{"sum", func(x *Tensor) *Tensor { return Add(x, x) }, 0},
	} {
		on, off := run(true, c.maker), run(false, c.maker)
		for i, name := range []string{"loss", "dx", "dw", "db"} {
			for j := range off.values[i] {
				if on.values[i][j] != off.values[i][j] {
					t.Fatalf("%s: %s[%d]: %g made again, %g with the copy kept: want the same bits", c.name, name, j, on.values[i][j], off.values[i][j])
				}
			}
		}
		if off.held-on.held != c.saved {
			t.Errorf("%s: after the forward pass %d bytes held making the copy again, %d keeping it: want %d less", c.name, on.held, off.held, c.saved)
		}
	}
	// A copy below recastMin is kept.
	recastMin = batch*rows*in + 1
	small, smallKept := run(true, func(x *Tensor) *Tensor { return GELU(x, false) }), run(false, func(x *Tensor) *Tensor { return GELU(x, false) })
	if small.held != smallKept.held {
		t.Errorf("an input of %d elements, below %d: %d bytes held, %d keeping the copy: want it kept", batch*rows*in, recastMin, small.held, smallKept.held)
	}
}
