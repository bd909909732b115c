package tensor_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestCPUConvLowp checks the CPU's bfloat16 convolution against its
// float32 one on the same inputs: with u = 2^-8 (bfloat16's unit
// roundoff), both operands and the result rounded, each element is within
// (3u + u²)·A + 1e-5·A of float32's, A being the same pass over absolute
// values; y without bias and dx are bfloat16 values (their low 16 bits
// zero), and db is float32's exactly (the float32 dy, the same sums).
func TestCPUConvLowp(t *testing.T) {
	cpu := tensor.CPU
	lb := cpu.(tensor.LowPrecisionConvBackend)
	rng := rand.New(rand.NewPCG(31, 32))
	u := math.Ldexp(1, -8)
	tol := 3*u + u*u + 1e-5
	for _, g := range []tensor.ConvGeom{
		{N: 3, C: 4, H: 9, W: 8, K: 6, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 2, C: 6, H: 11, W: 7, K: 4, R: 3, S: 2, StrideH: 2, StrideW: 1, PadH: 2, PadW: 1, DilationH: 2, DilationW: 1, Groups: 2, ReLU: true},
	} {
		xn, wn, yn := g.N*g.C*g.H*g.W, g.WeightLen(), g.N*g.K*g.OutH()*g.OutW()
		rnd := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return v
		}
		buf := func(v []float32) tensor.Buffer {
			b, _ := cpu.Alloc(len(v), tensor.Float32)
			cpu.Upload(b, v)
			return b
		}
		get := func(b tensor.Buffer) []float32 {
			v := make([]float32, b.Len)
			cpu.Download(v, b)
			return v
		}
		abs := func(v []float32) []float32 {
			a := make([]float32, len(v))
			for i, x := range v {
				a[i] = float32(math.Abs(float64(x)))
			}
			return a
		}
		x, w, dy, mask := rnd(xn), rnd(wn), rnd(yn), rnd(yn)
		// pass runs forward (no bias) and backward with conv and backward.
		pass := func(conv func(y, x, w, b tensor.Buffer, g tensor.ConvGeom), back func(dx, dw, db, dy, x, w, y tensor.Buffer, g tensor.ConvGeom),
			g tensor.ConvGeom, x, w, dy []float32) (y, dx, dw, db []float32) {
			yb, dxb, dwb, dbb := buf(make([]float32, yn)), buf(make([]float32, xn)), buf(make([]float32, wn)), buf(make([]float32, g.K))
			gf := g
			gf.ReLU = false
			conv(yb, buf(x), buf(w), tensor.Buffer{}, gf)
			var mb tensor.Buffer
			if g.ReLU {
				mb = buf(mask)
			}
			back(dxb, dwb, dbb, buf(dy), buf(x), buf(w), mb, g)
			return get(yb), get(dxb), get(dwb), get(dbb)
		}
		y, dx, dw, db := pass(lb.Conv2dLowp, lb.Conv2dBackwardLowp, g, x, w, dy)
		fy, fdx, fdw, fdb := pass(cpu.Conv2d, cpu.Conv2dBackward, g, x, w, dy)
		ag := g
		ag.ReLU = false
		ay, adx, adw, _ := pass(cpu.Conv2d, cpu.Conv2dBackward, ag, abs(x), abs(w), abs(dy))
		for _, c := range []struct {
			what         string
			got, want, a []float32
			bf16         bool
		}{{"y", y, fy, ay, true}, {"dx", dx, fdx, adx, true}, {"dw", dw, fdw, adw, true}} {
			differ := false
			for i := range c.want {
				e := math.Abs(float64(c.got[i]) - float64(c.want[i]))
				if !(e <= tol*float64(c.a[i])) {
					t.Fatalf("%+v: %s[%d] = %v, float32 %v: error %.3g over %.3g·A = %.3g", g, c.what, i, c.got[i], c.want[i], e, tol, tol*float64(c.a[i]))
				}
				if c.bf16 && math.Float32bits(c.got[i])&0xffff != 0 {
					t.Fatalf("%+v: %s[%d] = %v is not a bfloat16 value", g, c.what, i, c.got[i])
				}
				differ = differ || c.got[i] != c.want[i]
			}
			if !differ {
				t.Errorf("%+v: %s equals float32's: nothing was rounded", g, c.what)
			}
		}
		sameBits(t, "db", db, fdb)
	}
}
