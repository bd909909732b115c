package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUAttentionGPTShape runs the fused attention at the GPT's head shape
// (T = S = 256, D = 64, causal, dropout 0.2 from a DeviceGenerator, inside
// and outside a captured graph) against the CPU's composed operators from
// the same seed: the output and the three gradients must agree normwise
// within 1e-5 (float32 sums of 256 terms in different orders), which they
// can only do if both drop the same weights. A replayed graph must draw a
// new mask (a different output) and leave the generator where two draws
// leave it.
func TestGPUAttentionGPTShape(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const bsz, heads, T, D, p = 2, 3, 256, 64, 0.2
	rng := rand.New(rand.NewPCG(7, 18))
	shape := []int{bsz, heads, T, D}
	host := make([][]float32, 4)
	for i := range host {
		host[i] = make([]float32, bsz*heads*T*D)
		for j := range host[i] {
			host[i][j] = float32(rng.NormFloat64())
		}
	}
	run := func(be tensor.Backend) (out []float32, grads [3][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		var in [3]*tensor.Tensor
		for i := range in {
			in[i] = tensor.FromFloat32(be, s, host[i], shape...).SetRequiresGrad(true)
		}
		gen := tensor.NewDeviceGenerator(be, 18)
		defer gen.Release()
		y := tensor.ScaledDotProductAttentionDropout(in[0], in[1], in[2], true, 0, p, gen)
		tensor.Sum(tensor.Mul(y, tensor.FromFloat32(be, s, host[3], shape...))).Backward()
		for i := range in {
			grads[i] = in[i].Grad().Float32s()
		}
		return y.Float32s(), grads
	}
	gotOut, gotGrads := run(b)
	wantOut, wantGrads := run(tensor.CPU)
	near := func(what string, got, want []float32) {
		m, worst := 0.0, 0.0
		for i := range want {
			m = math.Max(m, math.Abs(float64(want[i])))
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
		}
		if worst > 1e-5*m {
			t.Errorf("%s: largest difference %g, %g of the largest value %g", what, worst, worst/m, m)
		}
	}
	near("output", gotOut, wantOut)
	for i, name := range []string{"dq", "dk", "dv"} {
		near(name, gotGrads[i], wantGrads[i])
	}

	// Captured: each replay draws at the generator's current offset.
	s := tensor.NewScope()
	defer s.Release()
	q := tensor.FromFloat32(b, nil, host[0], shape...)
	defer q.Release()
	gen := tensor.NewDeviceGenerator(b, 18)
	defer gen.Release()
	var y *tensor.Tensor
	g, err := b.Capture(func() {
		s.Reset()
		x := s.Borrow(q)
		y = tensor.ScaledDotProductAttentionDropout(x, x, x, true, 0, p, gen)
	})
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	first := y.Float32s()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	second := y.Float32s()
	same := true
	for i := range first {
		same = same && first[i] == second[i]
	}
	if same {
		t.Error("two replays of a captured attention dropped the same weights")
	}
	if _, off := gen.SeedOffset(); off != 2*uint64(bsz*heads*T*T)/4 {
		t.Errorf("generator offset %d after a capture and two replays; want %d", off, 2*bsz*heads*T*T/4)
	}
}

// TestGPUAttentionBF16 checks the tensor-core attention (attention_bf16.cu,
// taken under autocast to bfloat16 for D = 64) on fresh random inputs,
// causal or not, with T and S that are no multiple of the 64-row tiles
// (S = 45 and 37 also no multiple of 4: the dropout bits' slow path), with
// dropout from a Generator and a DeviceGenerator and without. The output
// and the three gradients of Σ out·G must agree normwise (largest
// difference over largest reference value) with:
//
//   - the float64 attention of the bfloat16-rounded inputs that rounds the
//     dropped weights and the score gradients where they enter a product:
//     dV within 2e-3 (it rounds the same normalised weights, but a weight
//     w whose float32 value lies within its exp2f and float32 error of a
//     bfloat16 tie rounds the other way, moving dV by 2^-8·w·|dO|: measured
//     2.4e-4 at the GPT's shape, where weights near 1 of the first causal
//     rows weigh most; a wrong dropout bit moves it by w·|dO|), the others
//     within 1e-2 (the kernel rounds each weight before normalising it,
//     against the running maximum, so a weight may round the other way by
//     2^-8 relative, and dQ, dK see that through rowsum(dO·O): ≈ 5·2^-9;
//     measured on the host at most 4.4e-3);
//   - the CPU's composed attention under the same autocast (the same bits,
//     the weights rounded after normalising): 1e-2 likewise;
//   - the float64 attention of the unrounded inputs, and the float32 fused
//     kernels: 3e-2, tensortest's tolAutocast (the inputs' 2^-9 rounding
//     carried through the softmax; measured on the host at most 7.5e-3).
//
// The float64 reference's gradients are checked against central
// differences on the smallest case.
func TestGPUAttentionBF16(t *testing.T) {
	checkAttentionBF16(t, newGPUBackend(t, BackendOptions{}))
}

// checkAttentionBF16 is TestGPUAttentionBF16 on backend b.
func checkAttentionBF16(t *testing.T, b tensor.Backend) {
	const D = 64
	cases := []struct {
		batch     []int
		T, S      int
		causal    bool
		p         float32
		device    bool // a DeviceGenerator (else a Generator)
		finiteDif bool
	}{
		{[]int{1}, 19, 21, true, 0, false, true},
		{[]int{2}, 70, 45, true, 0.2, false, false},
		{[]int{2}, 45, 70, false, 0, false, false},
		{[]int{3}, 33, 40, false, 0.5, true, false},
		{[]int{1}, 100, 37, false, 0.3, true, false},
		{[]int{1, 2}, 130, 130, true, 0, false, false},
		{[]int{2, 3}, 256, 256, true, 0.2, true, false},
	}
	for ci, c := range cases {
		name := fmt.Sprintf("T%d_S%d_causal%v_p%g", c.T, c.S, c.causal, c.p)
		t.Run(name, func(t *testing.T) {
			bh := 1
			for _, n := range c.batch {
				bh *= n
			}
			shape := func(rows int) []int { return append(append([]int(nil), c.batch...), rows, D) }
			rng := rand.New(rand.NewPCG(uint64(ci)+1, uint64(time.Now().UnixNano())))
			normal := func(n int) []float32 {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				return x
			}
			host := [][]float32{normal(bh * c.T * D), normal(bh * c.S * D), normal(bh * c.S * D), normal(bh * c.T * D)}
			const seed = 18
			run := func(be tensor.Backend, autocast bool) (out []float32, grads [3][]float32) {
				s := tensor.NewScope()
				defer s.Release()
				if autocast {
					s.SetAutocast(tensor.BFloat16)
				}
				var in [3]*tensor.Tensor
				for i, rows := range []int{c.T, c.S, c.S} {
					in[i] = tensor.FromFloat32(be, s, host[i], shape(rows)...).SetRequiresGrad(true)
				}
				var y *tensor.Tensor
				switch {
				case c.p == 0:
					y = tensor.ScaledDotProductAttention(in[0], in[1], in[2], c.causal, 0)
				case c.device:
					gen := tensor.NewDeviceGenerator(be, seed)
					defer gen.Release()
					y = tensor.ScaledDotProductAttentionDropout(in[0], in[1], in[2], c.causal, 0, c.p, gen)
				default:
					y = tensor.ScaledDotProductAttentionDropout(in[0], in[1], in[2], c.causal, 0, c.p, tensor.NewGenerator(seed))
				}
				tensor.Sum(tensor.Mul(y, tensor.FromFloat32(be, s, host[3], shape(c.T)...))).Backward()
				for i := range in {
					grads[i] = in[i].Grad().Float32s()
				}
				return y.Float32s(), grads
			}
			gotOut, gotGrads := run(b, true)
			got := append([][]float32{gotOut}, gotGrads[:]...)
			cpuOut, cpuGrads := run(tensor.CPU, true)
			f32Out, f32Grads := run(b, false)

			var mask []float64 // the dropout's mask values (0 or 1/(1-p)), as Dropout draws them
			if c.p > 0 {
				s := tensor.NewNoGradScope()
				ones := tensor.Full(tensor.CPU, s, 1, bh*c.T*c.S)
				for _, m := range tensor.Dropout(ones, c.p, true, tensor.NewGenerator(seed)).Float32s() {
					mask = append(mask, float64(m))
				}
				s.Release()
			}
			f64 := func(x []float32, round bool) []float64 {
				r := make([]float64, len(x))
				for i, v := range x {
					if round {
						v = tensor.BFloat16Float32(tensor.BFloat16Bits(v))
					}
					r[i] = float64(v)
				}
				return r
			}
			sc := 1 / math.Sqrt(D)
			ref := func(round bool) [][]float64 {
				o, dq, dk, dv := attention64(f64(host[0], round), f64(host[1], round), f64(host[2], round), f64(host[3], round),
					mask, bh, c.T, c.S, D, c.causal, sc, round)
				return [][]float64{o, dq, dk, dv}
			}
			rounded, exact := ref(true), ref(false)
			names := []string{"output", "dq", "dk", "dv"}
			check := func(against string, want [][]float64, tol []float64) {
				for i := range want {
					m, worst := 0.0, 0.0
					for j := range want[i] {
						m = math.Max(m, math.Abs(want[i][j]))
						worst = math.Max(worst, math.Abs(float64(got[i][j])-want[i][j]))
					}
					t.Logf("%s against %s: %.2e", names[i], against, worst/m)
					if !(worst <= tol[i]*m) {
						t.Errorf("%s: %.3g of the largest value %g from %s; want at most %g", names[i], worst/m, m, against, tol[i])
					}
				}
			}
			widen := func(out []float32, grads [3][]float32) [][]float64 {
				r := [][]float64{f64(out, false)}
				for _, g := range grads {
					r = append(r, f64(g, false))
				}
				return r
			}
			check("the rounded float64 reference", rounded, []float64{1e-2, 1e-2, 1e-2, 2e-3})
			check("the CPU's composed autocast", widen(cpuOut, cpuGrads), []float64{1e-2, 1e-2, 1e-2, 1e-2})
			check("the float64 reference", exact, []float64{3e-2, 3e-2, 3e-2, 3e-2})
			check("the float32 fused kernels", widen(f32Out, f32Grads), []float64{3e-2, 3e-2, 3e-2, 3e-2})

			if c.finiteDif {
				ins := [][]float64{f64(host[0], false), f64(host[1], false), f64(host[2], false)}
				g := f64(host[3], false)
				loss := func() float64 {
					o, _, _, _ := attention64(ins[0], ins[1], ins[2], g, mask, bh, c.T, c.S, D, c.causal, sc, false)
					l := 0.0
					for i, v := range o {
						l += v * g[i]
					}
					return l
				}
				const h = 1e-6 // truncation and rounding errors near 1e-10
				for w, in := range ins {
					for _, i := range []int{0, len(in) / 3, len(in) - 1} {
						x0 := in[i]
						in[i] = x0 + h
						up := loss()
						in[i] = x0 - h
						down := loss()
						in[i] = x0
						if fd := (up - down) / (2 * h); math.Abs(fd-exact[w+1][i]) > 1e-6*(1+math.Abs(fd)) {
							t.Errorf("float64 reference: gradient %d of input %d is %g, central differences %g", i, w, exact[w+1][i], fd)
						}
					}
				}
			}
		})
	}
}

// attention64 is attention in float64 and its gradients for the output
// gradient g, with dropout mask values mask over [bh, T, S] (nil: none).
// With lowp the dropped weights and the score gradients are rounded to
// bfloat16 where they enter a product (the caller rounds the inputs), as
// autocast's composed attention rounds them.
func attention64(q, k, v, g, mask []float64, bh, T, S, D int, causal bool, scale float64, lowp bool) (out, dq, dk, dv []float64) {
	rb := func(x float64) float64 {
		if !lowp {
			return x
		}
		return float64(tensor.BFloat16Float32(tensor.BFloat16Bits(float32(x))))
	}
	out, dq = make([]float64, bh*T*D), make([]float64, bh*T*D)
	dk, dv = make([]float64, bh*S*D), make([]float64, bh*S*D)
	p, dp, m := make([]float64, S), make([]float64, S), make([]float64, S)
	for h := 0; h < bh; h++ {
		for i := 0; i < T; i++ {
			keys := S
			if causal {
				keys = min(i+1, S)
			}
			qi, gi := q[(h*T+i)*D:][:D], g[(h*T+i)*D:][:D]
			mx := math.Inf(-1)
			for j := 0; j < keys; j++ {
				s := 0.0
				for c, x := range qi {
					s += x * k[(h*S+j)*D+c]
				}
				p[j] = s * scale
				mx = math.Max(mx, p[j])
			}
			z := 0.0
			for j := 0; j < keys; j++ {
				p[j] = math.Exp(p[j] - mx)
				z += p[j]
			}
			sum := 0.0
			for j := 0; j < keys; j++ {
				p[j] /= z
				m[j] = 1
				if mask != nil {
					m[j] = mask[(h*T+i)*S+j]
				}
				pm := rb(p[j] * m[j])
				dp[j] = 0
				for c := 0; c < D; c++ {
					out[(h*T+i)*D+c] += pm * v[(h*S+j)*D+c]
					dv[(h*S+j)*D+c] += pm * gi[c]
					dp[j] += gi[c] * v[(h*S+j)*D+c]
				}
				dp[j] *= m[j]
				sum += p[j] * dp[j]
			}
			for j := 0; j < keys; j++ {
				ds := rb(p[j]*(dp[j]-sum)) * scale
				for c := 0; c < D; c++ {
					dq[(h*T+i)*D+c] += ds * k[(h*S+j)*D+c]
					dk[(h*S+j)*D+c] += ds * qi[c]
				}
			}
		}
	}
	return out, dq, dk, dv
}

// TestRecordedAttentionStrided runs the packed attention and the attention
// of permuted views forward and backward on the recorder (which checks
// every launch against its kernel's C signature): the fused kernels run,
// float32 and under autocast the bfloat16 ones for D = 64 (the packed
// attention's from one bfloat16 copy of its input, the bf16h kernels), and
// the packed attention launches no strided copy either way.
func TestRecordedAttentionStrided(t *testing.T) {
	b, rec := newRecordingBackend(t)
	for _, c := range []struct {
		dt             tensor.DType
		d              int
		packed, prefix string
	}{{tensor.Float32, 16, "ember_attention_", "ember_attention_"}, {tensor.BFloat16, 64, "ember_attention_bf16h_", "ember_attention_bf16_"}} {
		s := tensor.NewScope()
		s.SetAutocast(c.dt)
		qkv := tensor.Zeros(b, s, 2, 5, 3, 3, c.d).SetRequiresGrad(true)
		rec.reset()
		tensor.Sum(tensor.ScaledDotProductAttentionPacked(qkv, true, 0, 0, nil).Reshape(2, 5, 3*c.d)).Backward()
		for _, k := range []string{"fwd", "dq", "dkv"} {
			name := fmt.Sprintf("%s%s_d%d", c.packed, k, c.d)
			if rec.launches[name] != 1 {
				t.Errorf("%v packed: %d launches of %s, want 1 (launches %v)", c.dt, rec.launches[name], name, rec.launches)
			}
		}
		for name, n := range rec.launches {
			if strings.Contains(name, "copy_strided") || strings.Contains(name, "copy_view") {
				t.Errorf("%v packed: %d launches of %s", c.dt, n, name)
			}
		}
		x := tensor.Zeros(b, s, 2, 5, 3, c.d).SetRequiresGrad(true)
		rec.reset()
		v := x.Permute(0, 2, 1, 3)
		tensor.Sum(tensor.ScaledDotProductAttention(v, v, v, false, 0)).Backward()
		if name := fmt.Sprintf("%sfwd_d%d", c.prefix, c.d); rec.launches[name] != 1 {
			t.Errorf("%v permuted views: %d launches of %s, want 1", c.dt, rec.launches[name], name)
		}
		if err := b.Synchronize(); err != nil {
			t.Errorf("Synchronize: %v", err)
		}
		s.Release()
	}
}

// withoutBF16Inputs is the backend with its attention taking float32 q, k
// and v only.
type withoutBF16Inputs struct{ *Backend }

func (withoutBF16Inputs) AttentionTakesBF16(tensor.AttentionShape) bool { return false }

// TestGPUAttentionBF16InputsSameBits: under autocast the packed attention
// reads q, k and v from one bfloat16 copy of its input (the bf16h kernels)
// and gives the same bits, output and gradients, as the kernels that round
// the float32 input as they load it: the GPT's layout (T no multiple of
// the 64-row tiles), causal, with dropout from a Generator and a
// DeviceGenerator and without.
func TestGPUAttentionBF16InputsSameBits(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if !b.AttentionTakesBF16(tensor.AttentionShape{D: 64, BFloat16: true}) {
		t.Skip("no bfloat16-input attention kernels on this device")
	}
	const bsz, T, H, D = 2, 130, 3, 64
	rng := rand.New(rand.NewPCG(41, uint64(time.Now().UnixNano())))
	host := make([]float32, bsz*T*3*H*D)
	for i := range host {
		host[i] = float32(rng.NormFloat64())
	}
	weights := make([]float32, bsz*T*H*D)
	for i := range weights {
		weights[i] = float32(rng.NormFloat64())
	}
	for _, c := range []struct {
		p      float32
		device bool
	}{{0, false}, {0.2, false}, {0.2, true}} {
		run := func(be tensor.Backend) (out, grad []float32) {
			s := tensor.NewScope()
			defer s.Release()
			s.SetAutocast(tensor.BFloat16)
			x := tensor.FromFloat32(be, s, host, bsz, T, 3, H, D).SetRequiresGrad(true)
			var src tensor.RandomSource
			switch {
			case c.p == 0:
			case c.device:
				gen := tensor.NewDeviceGenerator(be, 7)
				defer gen.Release()
				src = gen
			default:
				src = tensor.NewGenerator(7)
			}
			y := tensor.ScaledDotProductAttentionPacked(x, true, 0, c.p, src)
			tensor.Sum(tensor.Mul(y, tensor.FromFloat32(be, s, weights, bsz, T, H, D))).Backward()
			return y.Float32s(), x.Grad().Float32s()
		}
		gotOut, gotGrad := run(b)
		wantOut, wantGrad := run(withoutBF16Inputs{b})
		for _, r := range []struct {
			name      string
			got, want []float32
		}{{"output", gotOut, wantOut}, {"gradient", gotGrad, wantGrad}} {
			if !sameBits(r.got, r.want) {
				i := firstDiff(r.got, r.want)
				t.Errorf("p %g device %v: %s[%d] %g from the bfloat16 copy, %g from float32: want the same bits", c.p, c.device, r.name, i, r.got[i], r.want[i])
			}
		}
	}
}
