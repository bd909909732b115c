package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Under autocast on the GPU, tensor.ActivationLinear (the activation
// writing the product's bfloat16 operand through ember_unary_cast_bf16)
// gives the bits of the activation and Linear one after the other, each
// way: at the GPT's second MLP layer, whose operand the backward pass
// makes again, and at a small odd shape, whose operand is kept.
func TestGPUActivationLinearSameBits(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	for _, sh := range []struct {
		lead    []int
		in, out int
		op      tensor.UnaryOp
		act     func(*tensor.Tensor) *tensor.Tensor
	}{
		{[]int{4, 256}, 1536, 384, tensor.OpGELU, func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, false) }},
		{[]int{3, 7}, 40, 24, tensor.OpSiLU, tensor.SiLU},
	} {
		t.Run(fmt.Sprint(sh.lead, sh.in, sh.out), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(sh.in), uint64(sh.out)))
			rows := 1
			for _, d := range sh.lead {
				rows *= d
			}
			normal := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				return v
			}
			xs, ws, bs, gs := normal(rows*sh.in), normal(sh.out*sh.in), normal(sh.out), normal(rows*sh.out)
			run := func(fused bool) [][]float32 {
				w := tensor.FromFloat32(b, nil, ws, sh.out, sh.in).SetRequiresGrad(true)
				bias := tensor.FromFloat32(b, nil, bs, sh.out).SetRequiresGrad(true)
				defer w.Release()
				defer bias.Release()
				s := tensor.NewScope()
				defer s.Release()
				s.SetReleaseInBackward(true)
				s.SetAutocast(tensor.BFloat16)
				x := tensor.FromFloat32(b, s, xs, append(append([]int(nil), sh.lead...), sh.in)...).SetRequiresGrad(true)
				g := tensor.FromFloat32(b, s, gs, append(append([]int(nil), sh.lead...), sh.out)...)
				var y *tensor.Tensor
				if fused {
					y = tensor.ActivationLinear(sh.op, x, w, bias)
				} else {
					h := sh.act(x)
					y = tensor.Linear(h, w, bias)
					tensor.ReleaseInput(h, y)
				}
				out := y.Float32s()
				tensor.Sum(tensor.Mul(y, g)).Backward()
				r := [][]float32{out, x.Grad().Float32s(), w.Grad().Float32s(), bias.Grad().Float32s()}
				w.Grad().Release()
				bias.Grad().Release()
				return r
			}
			want, got := run(false), run(true)
			for k, name := range []string{"y", "dx", "dw", "db"} {
				for i := range want[k] {
					if got[k][i] != want[k][i] {
						t.Fatalf("%s element %d: %g fused, %g as two operations (want the same bits)", name, i, got[k][i], want[k][i])
					}
				}
			}
		})
	}
}

// The packed attention reads a bfloat16 input (LinearHalf's) as the
// bfloat16 copy it makes of a float32 one: the same output and input
// gradient, bit for bit, for an input whose float32 values are exactly
// bfloat16 ones, at the GPT's layout with dropout.
func TestGPUPackedAttentionBFloat16Input(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const bsz, tt, heads, d = 2, 130, 3, 64
	n := bsz * tt * 3 * heads * d
	rng := rand.New(rand.NewPCG(11, 12))
	bits, gs := make([]uint16, n), make([]float32, bsz*tt*heads*d)
	for i := range bits {
		bits[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
	}
	for i := range gs {
		gs[i] = float32(rng.NormFloat64())
	}
	widened := make([]float32, n)
	for i, h := range bits {
		widened[i] = tensor.BFloat16Float32(h)
	}
	run := func(half bool) [][]float32 {
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		var x *tensor.Tensor
		if half {
			x = tensor.FromBFloat16Bits(b, s, bits, bsz, tt, 3, heads, d)
		} else {
			x = tensor.FromFloat32(b, s, widened, bsz, tt, 3, heads, d)
		}
		x.SetRequiresGrad(true)
		if !tensor.PackedAttentionTakesHalf(b, s, bsz, tt, heads, d, true, 0.2) {
			t.Fatal("PackedAttentionTakesHalf: false under autocast on the GPU at D 64")
		}
		y := tensor.ScaledDotProductAttentionPacked(x, true, 0, 0.2, tensor.NewGenerator(7))
		out := y.Float32s()
		tensor.Sum(tensor.Mul(y, tensor.FromFloat32(b, s, gs, bsz, tt, heads, d))).Backward()
		return [][]float32{out, x.Grad().Float32s()}
	}
	want, got := run(false), run(true)
	for k, name := range []string{"output", "input gradient"} {
		for i := range want[k] {
			if got[k][i] != want[k][i] {
				t.Fatalf("%s element %d: %g from the bfloat16 input, %g from the float32 one (want the same bits)", name, i, got[k][i], want[k][i])
			}
		}
	}
}

// On the GPU, DropoutAdd (ember_dropout with a residual) gives the bits
// of Add(r, Dropout(x)) each way from a device generator's draw, at the
// GPT's residual stream and at an odd length.
func TestGPUDropoutAddSameBits(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	for _, n := range []int{16384 * 384, 4099} {
		rng := rand.New(rand.NewPCG(uint64(n), 3))
		normal := func() []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return v
		}
		rs, xs, gs := normal(), normal(), normal()
		run := func(fused bool) [][]float32 {
			gen := tensor.NewDeviceGenerator(b, 9)
			defer gen.Release()
			s := tensor.NewScope()
			defer s.Release()
			s.SetReleaseInBackward(true)
			r := tensor.FromFloat32(b, s, rs, n).SetRequiresGrad(true)
			x := tensor.FromFloat32(b, s, xs, n).SetRequiresGrad(true)
			var y *tensor.Tensor
			if fused {
				y = tensor.DropoutAdd(r, x, 0.2, true, gen)
			} else {
				y = tensor.Add(r, tensor.Dropout(x, 0.2, true, gen))
			}
			out := y.Float32s()
			tensor.Sum(tensor.Mul(y, tensor.FromFloat32(b, s, gs, n))).Backward()
			return [][]float32{out, r.Grad().Float32s(), x.Grad().Float32s()}
		}
		want, got := run(false), run(true)
		for k, name := range []string{"y", "dr", "dx"} {
			for i := range want[k] {
				if got[k][i] != want[k][i] {
					t.Fatalf("n %d: %s element %d: %g fused, %g as two operations (want the same bits)", n, name, i, got[k][i], want[k][i])
				}
			}
		}
	}
}
