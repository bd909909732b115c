package tensor

import (
	"math/rand/v2"
	"testing"
)

// castCounter is the CPU backend counting its float32 → bfloat16 casts.
type castCounter struct {
	cpuBackend
	casts int
}

func (c *castCounter) Cast(dst, src Buffer) {
	c.casts++
	c.cpuBackend.Cast(dst, src)
}

// TestAutocastCastsOncePerOperand: under autocast MatMul, Linear and
// BatchMatMul cast each operand once per step (the forward pass's copies
// of the inputs serve the backward pass, whose incoming gradient is cast
// once for both products): three casts each, where casting per product
// took six. The values are those of casting per product: TestAutocast-
// IsTheRoundedProduct checks them bit for bit against rounded copies.
func TestAutocastCastsOncePerOperand(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	be := &castCounter{}
	param := func(s *Scope, shape ...int) *Tensor {
		v := make([]float32, numel(shape))
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return FromFloat32(be, s, v, shape...).SetRequiresGrad(true)
	}
	w, m, b := param(nil, 6, 5), param(nil, 5, 4), param(nil, 2, 4, 3)
	// The input joins the step's scope, whose autocast the products follow.
	var x *Tensor
	for _, c := range []struct {
		name  string
		step  func() *Tensor
		casts int
	}{
		{"Linear", func() *Tensor { return Linear(x, w, nil) }, 3},
		{"MatMul", func() *Tensor { return MatMul(x, m) }, 3},
		{"BatchMatMul", func() *Tensor {
			return BatchMatMul(x.Reshape(2, 4, 5), m.Reshape(1, 5, 4).Expand(2, 5, 4).Narrow(2, 0, 3))
		}, 3},
		{"BatchMatMul, a dense b", func() *Tensor { return BatchMatMul(x.Reshape(2, 4, 5).Transpose(1, 2), b) }, 3},
		{"two Linears", func() *Tensor { return Linear(Linear(x, w, nil), w.Transpose(0, 1).Contiguous(), nil) }, 6},
	} {
		s := NewScope()
		s.SetAutocast(BFloat16)
		x = param(s, 8, 5)
		be.casts = 0
		y := c.step()
		fwd := be.casts
		Sum(y).Backward()
		if be.casts != c.casts {
			t.Errorf("%s: %d casts forward, %d in all; want %d in all", c.name, fwd, be.casts, c.casts)
		}
		s.Release()
	}
	// Without a backward pass (no gradients wanted) only the forward's.
	s := NewScope()
	s.SetAutocast(BFloat16)
	x = param(s, 8, 5)
	be.casts = 0
	Linear(x.Detach(), w.Detach(), nil)
	if be.casts != 2 {
		t.Errorf("Linear without gradients: %d casts, want 2", be.casts)
	}
	s.Release()
}
