package tensor_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// ActivationLinear gives, bit for bit, what the activation and Linear give
// one after the other, each way, with autocast and without, for every
// activation it takes: on a small input, whose operand the product keeps,
// and on one of recastMin elements, whose operand the backward pass makes
// again from the activation's input. Under autocast its forward pass never
// holds the activation's float32 output: it peaks lower by those bytes.
func TestActivationLinearSameBits(t *testing.T) {
	acts := []struct {
		name string
		op   tensor.UnaryOp
		f    func(*tensor.Tensor) *tensor.Tensor
	}{
		{"gelu", tensor.OpGELU, func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, false) }},
		{"gelu_tanh", tensor.OpGELUTanh, func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, true) }},
		{"silu", tensor.OpSiLU, tensor.SiLU},
		{"tanh", tensor.OpTanh, tensor.Tanh},
		{"sigmoid", tensor.OpSigmoid, tensor.Sigmoid},
	}
	shapes := []struct {
		name    string
		x       []int
		out     int
		onlyOne bool // the large input: one activation is enough
	}{
		{"small", []int{3, 5, 16}, 6, false},
		{"recast", []int{2, 512, 512}, 8, true},
	}
	for _, sh := range shapes {
		for ai, act := range acts {
			if sh.onlyOne && ai > 0 {
				continue
			}
			for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
				t.Run(fmt.Sprintf("%s/%s/%v", sh.name, act.name, dt), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(ai), uint64(len(sh.x))))
					in := sh.x[len(sh.x)-1]
					n := 1
					for _, d := range sh.x {
						n *= d
					}
					xs, ws, bs, gs := normals(rng, n, 1), normals(rng, sh.out*in, 1), normals(rng, sh.out, 1), normals(rng, n/in*sh.out, 1)
					type result struct {
						y, dx, dw, db []float32
						peak          int
					}
					run := func(fused bool) result {
						c := tensor.NewCountingCPU()
						w := tensor.FromFloat32(c, nil, ws, sh.out, in).SetRequiresGrad(true)
						b := tensor.FromFloat32(c, nil, bs, sh.out).SetRequiresGrad(true)
						defer w.Release()
						defer b.Release()
						s := tensor.NewScope()
						defer s.Release()
						s.SetReleaseInBackward(true)
						s.SetAutocast(dt)
						x := tensor.FromFloat32(c, s, xs, sh.x...).SetRequiresGrad(true)
						g := tensor.FromFloat32(c, s, gs, append(append([]int(nil), sh.x[:len(sh.x)-1]...), sh.out)...)
						start := c.Live()
						c.ResetPeak()
						var y *tensor.Tensor
						if fused {
							y = tensor.ActivationLinear(act.op, x, w, b)
						} else {
							h := act.f(x)
							y = tensor.Linear(h, w, b)
							tensor.ReleaseInput(h, y)
						}
						r := result{peak: c.Peak() - start, y: y.Float32s()}
						tensor.Sum(tensor.Mul(y, g)).Backward()
						r.dx, r.dw, r.db = x.Grad().Float32s(), w.Grad().Float32s(), b.Grad().Float32s()
						w.Grad().Release()
						b.Grad().Release()
						if n := c.BadFrees(); n != 0 {
							t.Errorf("fused %v: %d frees of memory not live", fused, n)
						}
						return r
					}
					want, got := run(false), run(true)
					sameBits(t, "y", got.y, want.y)
					sameBits(t, "dx", got.dx, want.dx)
					sameBits(t, "dw", got.dw, want.dw)
					sameBits(t, "db", got.db, want.db)
					if dt == tensor.BFloat16 && got.peak > want.peak-4*n {
						t.Errorf("forward pass peaked %d B above the start, the two operations %d B: want at least the float32 activation's %d B less", got.peak, want.peak, 4*n)
					}
				})
			}
		}
	}
}

// Linear takes a bfloat16 input under autocast only; elsewhere it says so.
func TestLinearBFloat16InputOutsideAutocast(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.Cast(tensor.Full(tensor.CPU, s, 1, 2, 3), tensor.BFloat16)
	w := tensor.Full(tensor.CPU, s, 1, 4, 3)
	defer func() {
		r := recover()
		if msg := fmt.Sprint(r); r == nil || !strings.Contains(msg, "bfloat16 under autocast") {
			t.Errorf("Linear of a bfloat16 input outside autocast: recovered %v; want a panic that says bfloat16 needs autocast", r)
		}
	}()
	tensor.Linear(x, w, nil)
}

// ActivationLinear refuses an activation it does not take, saying which
// it does.
func TestActivationLinearRefusesOtherOps(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x, w := tensor.Full(tensor.CPU, s, 1, 2, 3), tensor.Full(tensor.CPU, s, 1, 4, 3)
	defer func() {
		if msg := fmt.Sprint(recover()); !strings.Contains(msg, "want GELU") {
			t.Errorf("ActivationLinear(OpExp): recovered %q; want a panic naming the activations it takes", msg)
		}
	}()
	tensor.ActivationLinear(tensor.OpExp, x, w, nil)
}

// Linear of LayerNormHalf's bfloat16 output gives the bits of Linear of
// LayerNorm's float32 output, each way (the products round the same
// values), and its forward pass peaks lower by the float32 output it
// never writes; without autocast LayerNormHalf is LayerNorm.
func TestLayerNormHalfSameBits(t *testing.T) {
	const rows, cols, out = 1024, 512, 8
	n := rows * cols
	rng := rand.New(rand.NewPCG(3, 4))
	xs, lws, lbs := normals(rng, n, 1), normals(rng, cols, 1), normals(rng, cols, 1)
	ws, bs, gs := normals(rng, out*cols, 1), normals(rng, out, 1), normals(rng, rows*out, 1)
	for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			run := func(half bool) (grads [][]float32, peak int, hType tensor.DType) {
				c := tensor.NewCountingCPU()
				params := []*tensor.Tensor{
					tensor.FromFloat32(c, nil, lws, cols).SetRequiresGrad(true), tensor.FromFloat32(c, nil, lbs, cols).SetRequiresGrad(true),
					tensor.FromFloat32(c, nil, ws, out, cols).SetRequiresGrad(true), tensor.FromFloat32(c, nil, bs, out).SetRequiresGrad(true),
				}
				s := tensor.NewScope()
				defer s.Release()
				s.SetReleaseInBackward(true)
				s.SetAutocast(dt)
				x := tensor.FromFloat32(c, s, xs, 2, rows/2, cols).SetRequiresGrad(true)
				g := tensor.FromFloat32(c, s, gs, 2, rows/2, out)
				start := c.Live()
				c.ResetPeak()
				var h *tensor.Tensor
				if half {
					h = tensor.LayerNormHalf(x, []int{cols}, params[0], params[1], 1e-5)
				} else {
					h = tensor.LayerNorm(x, []int{cols}, params[0], params[1], 1e-5)
				}
				hType = h.DType()
				y := tensor.Linear(h, params[2], params[3])
				tensor.ReleaseInput(h, y)
				peak = c.Peak() - start
				grads = [][]float32{y.Float32s()}
				tensor.Sum(tensor.Mul(y, g)).Backward()
				grads = append(grads, x.Grad().Float32s())
				for _, p := range params {
					grads = append(grads, p.Grad().Float32s())
					p.Grad().Release()
					p.Release()
				}
				return grads, peak, hType
			}
			want, wantPeak, _ := run(false)
			got, gotPeak, hType := run(true)
			for i, name := range []string{"y", "dx", "d ln.weight", "d ln.bias", "dw", "db"} {
				sameBits(t, name, got[i], want[i])
			}
			if hType != dt {
				t.Errorf("LayerNormHalf under autocast %v gave %v; want %v", dt, hType, dt)
			}
			if dt == tensor.BFloat16 && gotPeak > wantPeak-4*n {
				t.Errorf("forward pass peaked %d B above the start, with LayerNorm %d B: want at least the float32 output's %d B less", gotPeak, wantPeak, 4*n)
			}
		})
	}
}

// LinearHalf under autocast gives Linear's result with the bias rounded to
// bfloat16, rounded by Cast, and Linear's gradients, bit for bit on the
// CPU (which has no LinearCastBackend: the float32 result is cast);
// without autocast it is Linear. (Both results are widened by Cast for the
// loss, whose backward pass rounds the gradient through bfloat16 for both
// alike.)
func TestLinearHalf(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	xs, ws, bs, gs := normals(rng, 2*3*7, 1), normals(rng, 5*7, 1), normals(rng, 5, 1), normals(rng, 2*3*5, 1)
	for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
		run := func(half bool) (y []float32, yType tensor.DType, grads [][]float32) {
			s := tensor.NewScope()
			defer s.Release()
			s.SetAutocast(dt)
			x := tensor.FromFloat32(tensor.CPU, s, xs, 2, 3, 7).SetRequiresGrad(true)
			w := tensor.FromFloat32(tensor.CPU, s, ws, 5, 7).SetRequiresGrad(true)
			var b *tensor.Tensor
			var out *tensor.Tensor
			if half {
				b = tensor.FromFloat32(tensor.CPU, s, bs, 5).SetRequiresGrad(true)
				out = tensor.LinearHalf(x, w, b)
			} else {
				rb := slices.Clone(bs)
				if dt == tensor.BFloat16 {
					for i, v := range rb {
						rb[i] = tensor.BFloat16Float32(tensor.BFloat16Bits(v))
					}
				}
				b = tensor.FromFloat32(tensor.CPU, s, rb, 5).SetRequiresGrad(true)
				out = tensor.Cast(tensor.Linear(x, w, b), dt)
			}
			yType = out.DType()
			y32 := tensor.Cast(out, tensor.Float32)
			y = y32.Float32s()
			tensor.Sum(tensor.Mul(y32, tensor.FromFloat32(tensor.CPU, s, gs, 2, 3, 5))).Backward()
			return y, yType, [][]float32{x.Grad().Float32s(), w.Grad().Float32s(), b.Grad().Float32s()}
		}
		wy, _, wg := run(false)
		gy, gType, gg := run(true)
		if gType != dt {
			t.Errorf("LinearHalf under autocast %v gave %v; want %v", dt, gType, dt)
		}
		sameBits(t, fmt.Sprintf("%v: y", dt), gy, wy)
		for i, name := range []string{"dx", "dw", "db"} {
			sameBits(t, fmt.Sprintf("%v: %s", dt, name), gg[i], wg[i])
		}
	}
}

// DropoutAdd gives the bits of Add(r, Dropout(x)) each way, from the same
// draw (a host and a device generator end at the same offset), and its
// forward pass peaks lower by the dropout's output, which it never
// writes; in evaluation it is r + x.
func TestDropoutAddSameBits(t *testing.T) {
	const n = 4099
	rng := rand.New(rand.NewPCG(7, 8))
	rs, xs, gs := normals(rng, n, 1), normals(rng, n, 1), normals(rng, n, 1)
	for _, device := range []bool{false, true} {
		for _, train := range []bool{true, false} {
			t.Run(fmt.Sprintf("device generator %v, training %v", device, train), func(t *testing.T) {
				run := func(fused bool) (out [][]float32, peak int, offset uint64) {
					c := tensor.NewCountingCPU()
					var gen tensor.RandomSource
					if device {
						dg := tensor.NewDeviceGenerator(c, 5)
						defer dg.Release()
						defer func() { _, offset = dg.SeedOffset() }()
						gen = dg
					} else {
						g := tensor.NewGenerator(5)
						defer func() { offset = g.Offset() }()
						gen = g
					}
					s := tensor.NewScope()
					defer s.Release()
					s.SetReleaseInBackward(true)
					r := tensor.FromFloat32(c, s, rs, n).SetRequiresGrad(true)
					x := tensor.FromFloat32(c, s, xs, n).SetRequiresGrad(true)
					start := c.Live()
					c.ResetPeak()
					var y *tensor.Tensor
					if fused {
						y = tensor.DropoutAdd(r, x, 0.3, train, gen)
					} else {
						d := tensor.Dropout(x, 0.3, train, gen)
						y = tensor.Add(r, d)
						if d != x {
							tensor.ReleaseInput(d, y)
						}
					}
					peak = c.Peak() - start
					out = [][]float32{y.Float32s()}
					tensor.Sum(tensor.Mul(y, tensor.FromFloat32(c, s, gs, n))).Backward()
					return append(out, r.Grad().Float32s(), x.Grad().Float32s()), peak, offset
				}
				want, wantPeak, wantOff := run(false)
				got, gotPeak, gotOff := run(true)
				for i, name := range []string{"y", "dr", "dx"} {
					sameBits(t, name, got[i], want[i])
				}
				if gotOff != wantOff {
					t.Errorf("the generator ends at offset %d, %d after Dropout and Add", gotOff, wantOff)
				}
				if train && gotPeak > wantPeak-4*n {
					t.Errorf("forward pass peaked %d B above the start, Dropout and Add %d B: want at least the dropout output's %d B less", gotPeak, wantPeak, 4*n)
				}
			})
		}
	}
}
