package tensortest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// RunChannelsLast checks b's tensor.ChannelsLastBackend against the CPU's
// (the float32 operation on widened operands, rounded) on fresh random
// inputs: every method, odd spatial sizes, 8 to 64 channels, batch norm
// with and without its affine parameters and activation, in training and
// out of it. Results in bfloat16 may differ by the rounding of a float32
// value summed in another order, so the bound is relative to the scale of
// the vector: |got - want| <= 2^-7·|want| + tol·max|want|, tol 2^-7 for the
// convolutions and batch norm's input gradient (sums that cancel), 1e-5
// elsewhere. Float32 results (statistics, parameter gradients): 1e-4
// relative to the vector's scale.
func RunChannelsLast(t *testing.T, b tensor.Backend) {
	t.Helper()
	cl, ok := b.(tensor.ChannelsLastBackend)
	if !ok {
		t.Skipf("backend %s has no channels-last form", b.Name())
	}
	ref := tensor.CPU.(tensor.ChannelsLastBackend)
	rng := rand.New(rand.NewPCG(41, 43))
	h := clHarness{t: t, b: b, rng: rng}

	t.Run("casts", func(t *testing.T) {
		h := h.with(t)
		for _, s := range [][3]int{{2, 8, 15}, {3, 24, 1}, {2, 64, 49}, {1, 3, 10}} {
			n, c, inner := s[0], s[1], s[2]
			x := h.normal(n * c * inner)
			got := h.bf16(n * c * inner)
			cl.ToChannelsLast(got.on, h.f32(x).on, n, c, inner)
			wb := hostBF16(n * c * inner)
			ref.ToChannelsLast(wb, hostF32(x), n, c, inner)
			h.sameBF16(fmt.Sprintf("to %v", s), got, readBF16(wb))
			back := h.f32(h.normal(n * c * inner)) // added to
			cl.FromChannelsLast(back.on, got.on, n, c, inner, true)
			ref.FromChannelsLast(back.host, wb, n, c, inner, true)
			h.close32(fmt.Sprintf("from %v", s), back, readF32(tensor.CPU, back.host), 0)
		}
	})

	for _, c := range []struct{ rows, c int }{{2 * 7 * 5, 24}, {3 * 9, 64}, {4 * 31, 8}} {
		for _, act := range []tensor.UnaryOp{tensor.OpIdentity, tensor.OpReLU, tensor.OpGELU, tensor.OpGELUTanh} {
			for _, affine := range []bool{false, true} {
				for _, training := range []bool{true, false} {
					name := fmt.Sprintf("batchnorm rows=%d c=%d act=%d affine=%v training=%v", c.rows, c.c, act, affine, training)
					t.Run(name, func(t *testing.T) { h.with(t).batchNorm(cl, ref, c.rows, c.c, act, affine, training) })
				}
			}
		}
	}

	t.Run("elementwise", func(t *testing.T) {
		h := h.with(t)
		n := 8 * 37
		for _, act := range []tensor.UnaryOp{tensor.OpReLU, tensor.OpGELU, tensor.OpGELUTanh} {
			x, dy := h.bf16From(h.normal(n)), h.bf16From(h.normal(n))
			y, dx := h.bf16(n), h.bf16(n)
			cl.UnaryChannelsLast(y.on, x.on, act, n)
			cl.UnaryBackwardChannelsLast(dx.on, dy.on, x.on, act, n)
			wy, wdx := hostBF16(n), hostBF16(n)
			ref.UnaryChannelsLast(wy, x.host, act, n)
			ref.UnaryBackwardChannelsLast(wdx, dy.host, x.host, act, n)
			h.closeBF16(fmt.Sprintf("act %d", act), y, readBF16(wy), 1e-5)
			h.closeBF16(fmt.Sprintf("act %d gradient", act), dx, readBF16(wdx), 1e-5)
		}
		a, c := h.bf16From(h.normal(n)), h.bf16From(h.normal(n))
		cl.AddChannelsLast(a.on, a.on, c.on, n) // in place, as a gradient accumulates
		wa := hostBF16(n)
		ref.AddChannelsLast(wa, a.host, c.host, n)
		h.closeBF16("add", a, readBF16(wa), 0)
	})

	for _, p := range []tensor.PoolGeom{
		{N: 2, C: 16, H: 7, W: 7, KH: 2, KW: 2, StrideH: 2, StrideW: 2},                 // a row and column past the last window
		{N: 2, C: 16, H: 7, W: 7, KH: 2, KW: 2, StrideH: 2, StrideW: 2, CeilMode: true}, // windows hanging off the edge
		{N: 3, C: 8, H: 9, W: 6, KH: 3, KW: 3, StrideH: 3, StrideW: 3},
		{N: 2, C: 24, H: 3, W: 3, KH: 3, KW: 3, StrideH: 3, StrideW: 3},
	} {
		t.Run(fmt.Sprintf("maxpool %+v", p), func(t *testing.T) {
			h := h.with(t)
			in := h.normal(p.N * p.C * p.H * p.W)
			for i := range in { // ties, as ReLU's zeros give
				if i%5 == 0 {
					in[i] = 0
				}
			}
			x := h.bf16From(in)
			o := p.N * p.C * p.OutH() * p.OutW()
			dy := h.bf16From(h.normal(o))
			y, dx := h.bf16(o), h.bf16(len(in))
			idx, err := b.Alloc(o, tensor.Uint8)
			if err != nil {
				t.Fatal(err)
			}
			cl.MaxPoolChannelsLast(y.on, idx, x.on, p)
			cl.MaxPoolBackwardChannelsLast(dx.on, dy.on, idx, p)
			wy, wdx := hostBF16(o), hostBF16(len(in))
			widx, _ := tensor.CPU.Alloc(o, tensor.Uint8)
			ref.MaxPoolChannelsLast(wy, widx, x.host, p)
			ref.MaxPoolBackwardChannelsLast(wdx, dy.host, widx, p)
			h.sameBF16("y", y, readBF16(wy))
			h.sameBF16("dx", dx, readBF16(wdx))
		})
	}

	if pn, ok := b.(tensor.ChannelsLastPoolNormBackend); ok {
		for _, p := range []tensor.PoolGeom{
			{N: 2, C: 16, H: 7, W: 7, KH: 2, KW: 2, StrideH: 2, StrideW: 2}, // a row and column past the last window
			{N: 3, C: 24, H: 9, W: 6, KH: 3, KW: 3, StrideH: 3, StrideW: 3},
			{N: 2, C: 64, H: 4, W: 6, KH: 2, KW: 2, StrideH: 2, StrideW: 2},
		} {
			for _, act := range []tensor.UnaryOp{tensor.OpIdentity, tensor.OpGELU} {
				for _, training := range []bool{true, false} {
					t.Run(fmt.Sprintf("maxpool+batchnorm %+v act=%d training=%v", p, act, training), func(t *testing.T) {
						h.with(t).poolNorm(pn, p, act, training)
					})
				}
			}
		}
	}

	for _, g := range []tensor.ConvGeom{
		{N: 2, C: 3, H: 9, W: 9, K: 24, R: 2, S: 2, StrideH: 1, StrideW: 1},
		{N: 3, C: 1, H: 12, W: 12, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: true},
		{N: 2, C: 2, H: 11, W: 9, K: 16, R: 3, S: 2, StrideH: 2, StrideW: 1, PadH: 1, DilationW: 2},
		{N: 2, C: 3, H: 9, W: 10, K: 32, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: true},
		{N: 2, C: 24, H: 10, W: 10, K: 40, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 4, C: 64, H: 8, W: 8, K: 128, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 3, C: 8, H: 6, W: 5, K: 8, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, ReLU: true},
	} {
		for _, bias := range []bool{false, true} {
			t.Run(fmt.Sprintf("conv %+v bias=%v", g, bias), func(t *testing.T) {
				if !cl.ConvChannelsLast(g) {
					t.Skipf("backend %s does not take the geometry channels-last", b.Name())
				}
				h.with(t).conv(cl, ref, g, bias)
			})
		}
	}
}

// clHarness holds what the checks of RunChannelsLast share.
type clHarness struct {
	t   *testing.T
	b   tensor.Backend
	rng *rand.Rand
}

func (h clHarness) with(t *testing.T) clHarness { h.t = t; return h }

// clBuf is a buffer on the backend under test and its host copy (the
// CPU's input).
type clBuf struct {
	on, host tensor.Buffer
	n        int
}

func (h clHarness) normal(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(h.rng.NormFloat64())
	}
	return v
}

func hostF32(v []float32) tensor.Buffer {
	b, _ := tensor.CPU.Alloc(len(v), tensor.Float32)
	tensor.CPU.Upload(b, v)
	return b
}

func hostBF16(n int) tensor.Buffer {
	b, _ := tensor.CPU.Alloc(n, tensor.BFloat16)
	return b
}

func readBF16(b tensor.Buffer) []uint16 {
	out := make([]uint16, b.Len)
	tensor.CPU.Download(out, b)
	return out
}

func readF32(be tensor.Backend, b tensor.Buffer) []float32 {
	out := make([]float32, b.Len)
	be.Download(out, b)
	return out
}

// f32 is v on both backends.
func (h clHarness) f32(v []float32) clBuf {
	on, err := h.b.Alloc(len(v), tensor.Float32)
	if err != nil {
		h.t.Fatal(err)
	}
	h.b.Upload(on, v)
	return clBuf{on: on, host: hostF32(v), n: len(v)}
}

// bf16From is v rounded to bfloat16 on both backends.
func (h clHarness) bf16From(v []float32) clBuf {
	bits := make([]uint16, len(v))
	for i, f := range v {
		bits[i] = tensor.BFloat16Bits(f)
	}
	on, err := h.b.Alloc(len(v), tensor.BFloat16)
	if err != nil {
		h.t.Fatal(err)
	}
	h.b.Upload(on, bits)
	host := hostBF16(len(v))
	tensor.CPU.Upload(host, bits)
	return clBuf{on: on, host: host, n: len(v)}
}

// bf16 is an output: n bfloat16 values on the test backend.
func (h clHarness) bf16(n int) clBuf {
	return h.bf16From(make([]float32, n))
}

func (h clHarness) got(c clBuf) []float32 {
	if c.on.DType == tensor.Float32 {
		return readF32(h.b, c.on)
	}
	bits := make([]uint16, c.n)
	h.b.Download(bits, c.on)
	out := make([]float32, c.n)
	for i, v := range bits {
		out[i] = tensor.BFloat16Float32(v)
	}
	return out
}

func widenBits(bits []uint16) []float32 {
	out := make([]float32, len(bits))
	for i, v := range bits {
		out[i] = tensor.BFloat16Float32(v)
	}
	return out
}

// sameBF16 wants the bits of want (NaN for NaN).
func (h clHarness) sameBF16(what string, c clBuf, want []uint16) {
	h.t.Helper()
	got := h.got(c)
	for i, w := range widenBits(want) {
		if got[i] != w && !(got[i] != got[i] && w != w) {
			h.t.Errorf("%s: [%d] = %v, want %v (of %d)", what, i, got[i], w, len(want))
			return
		}
	}
}

// closeBF16 is the bound of RunChannelsLast for a bfloat16 result.
func (h clHarness) closeBF16(what string, c clBuf, want []uint16, tol float64) {
	h.t.Helper()
	h.closeTo(what, h.got(c), widenBits(want), math.Ldexp(1, -7), tol)
}

// close32 is the bound for a float32 result.
func (h clHarness) close32(what string, c clBuf, want []float32, tol float64) {
	h.t.Helper()
	h.closeTo(what, h.got(c), want, 0, max(tol, 1e-4))
}

func (h clHarness) closeTo(what string, got, want []float32, rel, tol float64) {
	h.t.Helper()
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	for i, w := range want {
		d := math.Abs(float64(got[i]) - float64(w))
		if !(d <= rel*math.Abs(float64(w))+tol*scale) {
			h.t.Errorf("%s: [%d] = %v, want %v (bound %.3g; scale %.3g; of %d)", what, i, got[i], w, rel*math.Abs(float64(w))+tol*scale, scale, len(want))
			return
		}
	}
}

// batchNorm checks BatchNormChannelsLast and its backward pass.
func (h clHarness) batchNorm(cl, ref tensor.ChannelsLastBackend, rows, c int, act tensor.UnaryOp, affine, training bool) {
	n := rows * c
	in := h.normal(n)
	for i := range in {
		in[i] = 3 + 2*in[i] // a mean away from zero, as a shifted sum must handle
	}
	x, dy := h.bf16From(in), h.bf16From(h.normal(n))
	var w, bias clBuf
	if affine {
		w, bias = h.f32(h.normal(c)), h.f32(h.normal(c))
	}
	vars := make([]float32, c)
	for i := range vars {
		vars[i] = 0.5 + float32(i%3)
	}
	rm, rv := h.f32(h.normal(c)), h.f32(vars)
	mean, inv := h.f32(make([]float32, c)), h.f32(make([]float32, c))
	y := h.bf16(n)
	cl.BatchNormChannelsLast(y.on, mean.on, inv.on, rm.on, rv.on, x.on, w.on, bias.on, rows, c, training, 0.1, 1e-5, act)
	wy := hostBF16(n)
	ref.BatchNormChannelsLast(wy, mean.host, inv.host, rm.host, rv.host, x.host, w.host, bias.host, rows, c, training, 0.1, 1e-5, act)
	h.close32("saved mean", mean, readF32(tensor.CPU, mean.host), 0)
	h.close32("saved 1/std", inv, readF32(tensor.CPU, inv.host), 0)
	h.close32("running mean", rm, readF32(tensor.CPU, rm.host), 0)
	h.close32("running var", rv, readF32(tensor.CPU, rv.host), 0)
	h.closeBF16("y", y, readBF16(wy), 1e-5)

	// The backward pass from the CPU's statistics on both, dweight and
	// dbias added to what they hold.
	mean, inv = h.f32(readF32(tensor.CPU, mean.host)), h.f32(readF32(tensor.CPU, inv.host))
	dx := h.bf16(n)
	var dw, db clBuf
	if affine {
		dw, db = h.f32(h.normal(c)), h.f32(h.normal(c))
	}
	cl.BatchNormBackwardChannelsLast(dx.on, dw.on, db.on, dy.on, x.on, w.on, bias.on, mean.on, inv.on, rows, c, training, act, true, true)
	wdx := hostBF16(n)
	ref.BatchNormBackwardChannelsLast(wdx, dw.host, db.host, dy.host, x.host, w.host, bias.host, mean.host, inv.host, rows, c, training, act, true, true)
	h.closeBF16("dx", dx, readBF16(wdx), math.Ldexp(1, -7))
	if affine {
		h.close32("dweight", dw, readF32(tensor.CPU, dw.host), 0)
		h.close32("dbias", db, readF32(tensor.CPU, db.host), 0)
	}
}

// poolNorm checks MaxPoolBatchNormChannelsLast and
// BatchNormMaxPoolBackwardChannelsLast against the two passes each
// replaces on the same backend (the pooling, then batch norm; batch norm's
// backward pass into the pooled gradient, then the pooling's): the same
// bits, statistics and running statistics included.
func (h clHarness) poolNorm(pn tensor.ChannelsLastPoolNormBackend, p tensor.PoolGeom, act tensor.UnaryOp, training bool) {
	rows, c := p.N*p.OutH()*p.OutW(), p.C
	n, full := rows*c, p.N*p.H*p.W*c
	in := h.normal(full)
	for i := range in {
		in[i] = 1 + 2*in[i]
	}
	x, dy := h.bf16From(in), h.bf16From(h.normal(n))
	pooled := h.bf16(n)
	idx, err := h.b.Alloc(n, tensor.Uint8)
	if err != nil {
		h.t.Fatal(err)
	}
	pn.MaxPoolChannelsLast(pooled.on, idx, x.on, p)
	w, bias := h.f32(h.normal(c)), h.f32(h.normal(c))
	vars := make([]float32, c)
	for i := range vars {
		vars[i] = 0.5 + float32(i%3)
	}
	rm0 := h.normal(c)
	rm, rv := h.f32(rm0), h.f32(vars)
	mean, inv, y := h.f32(make([]float32, c)), h.f32(make([]float32, c)), h.bf16(n)
	pn.BatchNormChannelsLast(y.on, mean.on, inv.on, rm.on, rv.on, pooled.on, w.on, bias.on, rows, c, training, 0.1, 1e-5, act)

	// The forward pass as one operation: the two passes' bits.
	fp, fy := h.bf16(n), h.bf16(n)
	fidx, err := h.b.Alloc(n, tensor.Uint8)
	if err != nil {
		h.t.Fatal(err)
	}
	frm, frv := h.f32(rm0), h.f32(vars)
	fmean, finv := h.f32(make([]float32, c)), h.f32(make([]float32, c))
	pn.MaxPoolBatchNormChannelsLast(fy.on, fp.on, fidx, fmean.on, finv.on, frm.on, frv.on, x.on, w.on, bias.on, p, training, 0.1, 1e-5, act)
	h.sameBF16("fused y", fy, bitsOf(h.got(y)))
	h.sameBF16("fused pooled", fp, bitsOf(h.got(pooled)))
	gotIdx, wantIdx := make([]uint8, n), make([]uint8, n)
	h.b.Download(gotIdx, fidx)
	h.b.Download(wantIdx, idx)
	if !slices.Equal(gotIdx, wantIdx) {
		h.t.Errorf("fused idx differs from the pooling's")
	}
	for _, v := range []struct {
		what      string
		got, want clBuf
	}{{"fused mean", fmean, mean}, {"fused 1/std", finv, inv}, {"fused running mean", frm, rm}, {"fused running var", frv, rv}} {
		if g, w := h.got(v.got), h.got(v.want); !slices.Equal(g, w) {
			h.t.Errorf("%s = %v, want %v (the two passes')", v.what, g, w)
		}
	}

	dx, dw, db := h.bf16(full), h.f32(make([]float32, c)), h.f32(make([]float32, c))
	pn.BatchNormMaxPoolBackwardChannelsLast(dx.on, dw.on, db.on, dy.on, pooled.on, idx, w.on, bias.on, mean.on, inv.on, p, training, act, false, false)
	dp, dx2, dw2, db2 := h.bf16(n), h.bf16(full), h.f32(make([]float32, c)), h.f32(make([]float32, c))
	pn.BatchNormBackwardChannelsLast(dp.on, dw2.on, db2.on, dy.on, pooled.on, w.on, bias.on, mean.on, inv.on, rows, c, training, act, false, false)
	pn.MaxPoolBackwardChannelsLast(dx2.on, dp.on, idx, p)
	h.sameBF16("dx", dx, bitsOf(h.got(dx2)))
	for _, v := range []struct {
		what      string
		got, want clBuf
	}{{"dweight", dw, dw2}, {"dbias", db, db2}} {
		if g, w := h.got(v.got), h.got(v.want); !slices.Equal(g, w) {
			h.t.Errorf("%s = %v, want %v (the two passes')", v.what, g, w)
		}
	}
}

// bitsOf is the bfloat16 bits of values read back from bfloat16 memory
// (exact: each is a bfloat16 widened).
func bitsOf(v []float32) []uint16 {
	bits := make([]uint16, len(v))
	for i, f := range v {
		bits[i] = tensor.BFloat16Bits(f)
	}
	return bits
}

// conv checks Conv2dChannelsLast and its backward pass.
func (h clHarness) conv(cl, ref tensor.ChannelsLastBackend, g tensor.ConvGeom, withBias bool) {
	xLen, yLen := g.N*g.C*g.H*g.W, g.N*g.K*g.OutH()*g.OutW()
	x, w := h.bf16From(h.normal(xLen)), h.f32(h.normal(g.WeightLen()))
	var bias, db clBuf
	if withBias {
		bias, db = h.f32(h.normal(g.K)), h.f32(make([]float32, g.K))
	}
	y := h.bf16(yLen)
	cl.Conv2dChannelsLast(y.on, x.on, w.on, bias.on, g)
	wy := hostBF16(yLen)
	ref.Conv2dChannelsLast(wy, x.host, w.host, bias.host, g)
	h.closeBF16("y", y, readBF16(wy), math.Ldexp(1, -7))

	bg := g
	bg.ReLU = false
	dy := h.bf16From(h.normal(yLen))
	dx, dw := h.bf16(xLen), h.f32(h.normal(g.WeightLen()))
	cl.Conv2dBackwardChannelsLast(dx.on, dw.on, db.on, dy.on, x.on, w.on, bg)
	wdx := hostBF16(xLen)
	ref.Conv2dBackwardChannelsLast(wdx, dw.host, db.host, dy.host, x.host, w.host, bg)
	h.closeBF16("dx", dx, readBF16(wdx), math.Ldexp(1, -7))
	h.close32("dw", dw, readF32(tensor.CPU, dw.host), math.Ldexp(1, -7))
	if withBias {
		h.close32("db", db, readF32(tensor.CPU, db.host), 0)
	}
}
