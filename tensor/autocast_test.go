package tensor_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// roundedCopy is a new float32 tensor holding t's values rounded to
// bfloat16 (no graph).
func roundedCopy(t *tensor.Tensor, s *tensor.Scope) *tensor.Tensor {
	v := t.Float32s()
	for i := range v {
		v[i] = tensor.BFloat16Float32(tensor.BFloat16Bits(v[i]))
	}
	return tensor.FromFloat32(t.Backend(), s, v, t.Shape()...)
}

func randomTensor(rng *rand.Rand, s *tensor.Scope, shape ...int) *tensor.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return tensor.FromFloat32(tensor.CPU, s, v, shape...)
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d is %g, want %g (bit for bit)", what, i, got[i], want[i])
		}
	}
}

// TestAutocastIsTheRoundedProduct: on the CPU an autocast product is the
// float32 SGEMM of the bfloat16-rounded operands, so it must equal, bit
// for bit, the plain product of explicitly rounded copies; so must the
// gradients, whose incoming gradient is rounded as well. Parameters and
// their gradients stay float32. Without autocast the result is the
// unrounded product, which differs.
func TestAutocastIsTheRoundedProduct(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	plain := tensor.NewScope()
	defer plain.Release()
	w := randomTensor(rng, nil, 4, 7).SetRequiresGrad(true) // a long-lived parameter
	defer w.Release()
	x := randomTensor(rng, plain, 9, 7)
	g := randomTensor(rng, plain, 9, 4)

	step := tensor.NewScope()
	defer step.Release()
	step.SetAutocast(tensor.BFloat16)
	xs := tensor.FromFloat32(tensor.CPU, step, x.Float32s(), 9, 7).SetRequiresGrad(true)
	y := tensor.Linear(xs, w, nil)
	if y.DType() != tensor.Float32 {
		t.Fatalf("autocast Linear gave %v, want float32", y.DType())
	}
	tensor.Sum(tensor.Mul(y, g)).Backward()
	if w.DType() != tensor.Float32 || w.Grad().DType() != tensor.Float32 {
		t.Fatalf("weight %v, gradient %v; both must stay float32", w.DType(), w.Grad().DType())
	}

	xr, wr, gr := roundedCopy(x, plain), roundedCopy(w, plain), roundedCopy(g, plain)
	sameBits(t, "forward", y.Float32s(), tensor.MatMul(xr, wr.Transpose(0, 1)).Float32s())
	sameBits(t, "dx", xs.Grad().Float32s(), tensor.MatMul(gr, wr).Float32s())
	sameBits(t, "dw", w.Grad().Float32s(), tensor.MatMul(gr.Transpose(0, 1), xr).Float32s())

	differs := false
	unrounded := tensor.MatMul(x, w.Detach().Transpose(0, 1)).Float32s()
	for i, v := range y.Float32s() {
		differs = differs || v != unrounded[i]
	}
	if !differs {
		t.Error("the autocast product equals the float32 one: nothing was rounded")
	}
}

// TestAutocastScope: autocast is off by default and per scope; a nil
// scope reads as off.
func TestAutocastScope(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	if s.Autocast() != tensor.Float32 || (*tensor.Scope)(nil).Autocast() != tensor.Float32 {
		t.Fatal("autocast is on by default")
	}
	s.SetAutocast(tensor.BFloat16)
	other := tensor.NewNoGradScope()
	defer other.Release()
	a, b := tensor.Zeros(tensor.CPU, s, 2), tensor.Zeros(tensor.CPU, other, 2)
	if tensor.AutocastOf(a) != tensor.BFloat16 || tensor.AutocastOf(b) != tensor.Float32 || tensor.AutocastOf(b, a) != tensor.Float32 {
		t.Errorf("AutocastOf: %v, %v, %v; want bfloat16, float32, float32 (the first scoped operand's)",
			tensor.AutocastOf(a), tensor.AutocastOf(b), tensor.AutocastOf(b, a))
	}
	s.SetAutocast(tensor.Float32)
	if s.Autocast() != tensor.Float32 {
		t.Error("SetAutocast(Float32) did not turn autocast off")
	}
}

// Mixed precision as torch.autocast: the step's scope turns bfloat16
// products on; the weight, its gradient and the output stay float32, and
// the product is that of the operands rounded to bfloat16 (1.00390625 is
// 1 + 2⁻⁸, which bfloat16's 7 mantissa bits round to 1).
func ExampleScope_SetAutocast() {
	b := tensor.CPU
	w := tensor.FromFloat32(b, nil, []float32{1.00390625, 2}, 1, 2).SetRequiresGrad(true)
	defer w.Release()

	step := tensor.NewScope()
	defer step.Release()
	step.SetAutocast(tensor.BFloat16)
	x := tensor.FromFloat32(b, step, []float32{3, 1}, 1, 2)
	y := tensor.Linear(x, w, nil) // 3·1 + 1·2 in bfloat16 operands
	y.Backward()
	fmt.Println(y.DType(), y.Float32s(), w.Grad().DType(), w.Grad().Float32s())
	// Output:
	// float32 [5] float32 [3 1]
}

// fusedConvPoolSpy is the CPU with a ConvPoolBackend whose fused
// convolution + pooling (float32 only) must not be used under bf16
// autocast: it counts its calls and runs the two operations.
type fusedConvPoolSpy struct {
	tensor.CompleteBackend
	tensor.LowPrecisionConvBackend
	calls int
}

func (s *fusedConvPoolSpy) Conv2dReLUMaxPool(y, argmax, x, w, bias tensor.Buffer, g tensor.ConvGeom, p tensor.PoolGeom) {
	s.calls++
	conv, _ := s.Alloc(g.N*g.K*g.OutH()*g.OutW(), tensor.Float32)
	defer s.Free(conv)
	s.Conv2d(conv, x, w, bias, g)
	s.MaxPool2d(y, argmax, conv, p)
}

func (s *fusedConvPoolSpy) Conv2dReLUMaxPoolBackward(dx, dw, db, dy, x, w, y, argmax tensor.Buffer, g tensor.ConvGeom, p tensor.PoolGeom) {
	panic("the fused backward is not exercised here")
}

// TestConv2dReLUMaxPoolAutocast: under bf16 autocast a backend's fused
// float32 convolution + pooling is passed over for the bf16 convolution
// and a pooling (the result equals MaxPool2d(Conv2dReLU) under autocast);
// without autocast the fused operation runs.
func TestConv2dReLUMaxPoolAutocast(t *testing.T) {
	spy := &fusedConvPoolSpy{CompleteBackend: tensor.CPU.(tensor.CompleteBackend), LowPrecisionConvBackend: tensor.CPU.(tensor.LowPrecisionConvBackend)}
	rng := rand.New(rand.NewPCG(4, 2))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	xs, ws, bs := rnd(2*3*8*8), rnd(4*3*3*3), rnd(4)
	run := func(be tensor.Backend, autocast bool, fused bool) []float32 {
		s := tensor.NewScope()
		defer s.Release()
		if autocast {
			s.SetAutocast(tensor.BFloat16)
		}
		x, w, b := tensor.FromFloat32(be, s, xs, 2, 3, 8, 8), tensor.FromFloat32(be, s, ws, 4, 3, 3, 3), tensor.FromFloat32(be, s, bs, 4)
		if fused {
			return tensor.Conv2dReLUMaxPool(x, w, b, 1, 1, 2).Float32s()
		}
		return tensor.MaxPool2d(tensor.Conv2dReLU(x, w, b, 1, 1), 2, 2).Float32s()
	}
	got, want := run(spy, true, true), run(tensor.CPU, true, false)
	if spy.calls != 0 {
		t.Errorf("under bf16 autocast the fused float32 convolution + pooling ran %d times", spy.calls)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("under autocast [%d] = %v, want %v (MaxPool2d of the bf16 Conv2dReLU)", i, got[i], want[i])
		}
	}
	run(spy, false, true)
	if spy.calls != 1 {
		t.Errorf("without autocast the fused operation ran %d times, want 1", spy.calls)
	}
}
