package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestBFloat16BitsSpecials checks the rounding at its edges against
// patterns worked out by hand. A float32 pattern splits into the bfloat16
// kept (upper 16 bits) and the 16 bits dropped: below 0x8000 rounds down,
// above rounds up, exactly 0x8000 is a tie and goes to the even kept half.
func TestBFloat16BitsSpecials(t *testing.T) {
	for _, c := range []struct {
		f    uint32
		want uint16
		why  string
	}{
		{0x3f808000, 0x3f80, "tie, kept half even: stays"},
		{0x3f818000, 0x3f82, "tie, kept half odd: up to even"},
		{0x3f808001, 0x3f81, "just above a tie: up"},
		{0x3f807fff, 0x3f80, "just below a tie: down"},
		{0xbf818000, 0xbf82, "negative tie: away from zero to even"},
		{0x7f7fffff, 0x7f80, "largest float32: past the largest bfloat16 plus half a unit, infinity"},
		{0x7f7f7fff, 0x7f7f, "below that half unit: the largest bfloat16"},
		{0x7f7f8000, 0x7f80, "tie between the largest bfloat16 and infinity: the even one, infinity"},
		{0x00008000, 0x0000, "subnormal tie, even: zero"},
		{0x00018000, 0x0002, "subnormal tie, odd: up"},
		{0x00008001, 0x0001, "subnormal just above a tie: smallest bfloat16 subnormal"},
		{0x807fffff, 0x8080, "largest negative subnormal rounds up to the smallest normal"},
		{0x80000000, 0x8000, "negative zero keeps its sign"},
		{0x7f800000, 0x7f80, "infinity"},
		{0xff800000, 0xff80, "negative infinity"},
		{0x7fc00000, 0x7fc0, "quiet NaN"},
		{0x7f800001, 0x7fc0, "signalling NaN whose payload truncation would lose (0x7F80 is infinity)"},
		{0xffc12345, 0x7fc0, "negative NaN with a payload: torch's canonical NaN"},
	} {
		if got := tensor.BFloat16Bits(math.Float32frombits(c.f)); got != c.want {
			t.Errorf("BFloat16Bits(%#08x) = %#04x, want %#04x (%s)", c.f, got, c.want, c.why)
		}
	}
	for _, h := range []uint16{0, 1, 0x3f80, 0x7f7f, 0x7f80, 0x8001, 0xff80} { // exact both ways
		if got := tensor.BFloat16Bits(tensor.BFloat16Float32(h)); got != h {
			t.Errorf("round trip of %#04x gives %#04x", h, got)
		}
	}
}

// TestCastAutograd casts x to bfloat16 and back: the values are x rounded,
// and x's gradient is the incoming gradient rounded to bfloat16 (as
// torch's bfloat16 gradient cast back to float32), added into an existing
// gradient.
func TestCastAutograd(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	data, w := make([]float32, 50), make([]float32, 50)
	for i := range data {
		data[i], w[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, data, 5, 10).SetRequiresGrad(true)
	h := tensor.Cast(x, tensor.BFloat16)
	if h.DType() != tensor.BFloat16 || !h.RequiresGrad() {
		t.Fatalf("Cast gave a %v tensor, requiresGrad %v", h.DType(), h.RequiresGrad())
	}
	if tensor.Cast(h, tensor.BFloat16) != h {
		t.Error("Cast to the tensor's own type is not the tensor itself")
	}
	for i, bits := range h.BFloat16s() {
		if want := tensor.BFloat16Bits(data[i]); bits != want {
			t.Fatalf("element %d: %#04x, want %#04x", i, bits, want)
		}
	}
	y := tensor.Cast(h, tensor.Float32)
	for round := 1; round <= 2; round++ {
		if round == 2 {
			y = tensor.Cast(tensor.Cast(x, tensor.BFloat16), tensor.Float32)
		}
		tensor.Sum(tensor.Mul(y, tensor.FromFloat32(tensor.CPU, s, w, 5, 10))).Backward()
		got := x.Grad().Float32s()
		for i := range got {
			want := float32(round) * tensor.BFloat16Float32(tensor.BFloat16Bits(w[i]))
			if got[i] != want {
				t.Fatalf("pass %d: gradient %d is %g, want %g", round, i, got[i], want)
			}
		}
	}
	vals := y.Float32s()
	for i := range vals {
		if want := tensor.BFloat16Float32(tensor.BFloat16Bits(data[i])); vals[i] != want {
			t.Fatalf("round trip %d: %g, want %g", i, vals[i], want)
		}
	}
}

// TestCastMisuse: the conversions that do not exist are refused by name.
func TestCastMisuse(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	for _, c := range []struct {
		name, want string
		f          func()
	}{
		{"to int32", "Cast from float32 to int32", func() { tensor.Cast(tensor.Zeros(tensor.CPU, s, 3), tensor.Int32) }},
		{"from uint8", "Cast from uint8 to bfloat16", func() {
			tensor.Cast(tensor.FromUint8(tensor.CPU, s, []uint8{1}, 1), tensor.BFloat16)
		}},
		{"autocast int32", "SetAutocast(int32)", func() { s.SetAutocast(tensor.Int32) }},
		{"bfloat16 into Add", "want a float32 buffer", func() {
			h := tensor.Cast(tensor.Zeros(tensor.CPU, s, 3), tensor.BFloat16)
			tensor.Add(h, h)
		}},
	} {
		msg := func() (msg string) {
			defer func() { msg = fmt.Sprint(recover()) }()
			c.f()
			return ""
		}()
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: panic %q, want one containing %q", c.name, msg, c.want)
		}
	}
}

// TestCopyTensorConverts copies between float32 and bfloat16: into
// bfloat16 the bits are Cast's (rounded to nearest, ties to even, from a
// strided float32 view too), back into float32 exact; other pairs panic
// with both types named.
func TestCopyTensorConverts(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	rng := rand.New(rand.NewPCG(7, 8))
	vals := make([]float32, 6*5)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64()) * 100
	}
	x := tensor.FromFloat32(tensor.CPU, s, vals, 6, 5)
	for _, src := range []*tensor.Tensor{x, x.Transpose(0, 1)} {
		h := tensor.EmptyOf(tensor.CPU, s, tensor.BFloat16, src.Shape()...)
		tensor.CopyTensor(h, src)
		want := tensor.Cast(src.Contiguous(), tensor.BFloat16).BFloat16s()
		got := h.BFloat16s()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("into bfloat16, element %d: %#04x, want %#04x", i, got[i], want[i])
			}
		}
		back := tensor.Zeros(tensor.CPU, s, src.Shape()...)
		tensor.CopyTensor(back, h)
		for i, v := range back.Float32s() {
			if v != tensor.BFloat16Float32(want[i]) {
				t.Fatalf("back into float32, element %d: %g, want %g", i, v, tensor.BFloat16Float32(want[i]))
			}
		}
	}
	msg := func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		tensor.CopyTensor(tensor.Zeros(tensor.CPU, s, 2), tensor.FromInt32(tensor.CPU, s, []int32{1, 2}, 2))
		return ""
	}()
	if want := "CopyTensor of int32 into float32"; !strings.Contains(msg, want) {
		t.Errorf("int32 into float32: panic %q, want one containing %q", msg, want)
	}
}

// Rounding to bfloat16, whose 7 mantissa bits space the numbers in [1, 2)
// 2⁻⁷ apart: 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷ and goes to the even
// one, 1; 1 + 3·2⁻⁸ is halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶ and goes to
// 1 + 2⁻⁶.
func ExampleCast() {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, []float32{1.00390625, 1.01171875, -2}, 3)
	h := tensor.Cast(x, tensor.BFloat16)
	fmt.Println(h.DType(), h.Float32s())
	fmt.Printf("%#04x\n", h.BFloat16s())
	// Output:
	// bfloat16 [1 1.015625 -2]
	// [0x3f80 0x3f82 0xc000]
}
