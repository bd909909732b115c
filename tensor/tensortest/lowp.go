package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Mixed precision: the casts between float32 and bfloat16, the bfloat16
// products with float32 results (tensor.LowPrecisionBackend), and the
// autocast operations (tensor/autocast.go). Backends without
// LowPrecisionBackend skip these cases.

// refBFloat16 rounds f to bfloat16 the long way, independently of the bit
// trick the backends use: it takes the two bfloat16 magnitudes around |f|
// (the truncated pattern and the next one up, the pattern past the largest
// finite one standing for 2¹²⁸ so that overflow rounds to infinity as IEEE
// 754 says), compares the distances in float64 (exact: the values differ
// by less than 2²⁴ units of the smaller's last place) and breaks ties
// toward the even pattern. Every NaN gives torch's 0x7FC0.
func refBFloat16(f float32) uint16 {
	u := math.Float32bits(f)
	sign, mag := uint16(u>>16)&0x8000, u&0x7fffffff
	switch {
	case mag > 0x7f800000:
		return 0x7fc0
	case mag == 0x7f800000:
		return sign | 0x7f80
	}
	value := func(p uint32) float64 {
		if p == 0x7f80 {
			return math.Ldexp(1, 128)
		}
		return float64(math.Float32frombits(p << 16))
	}
	x := float64(math.Float32frombits(mag))
	lo := mag >> 16
	below, above := x-value(lo), value(lo+1)-x
	if above < below || (above == below && lo&1 == 1) {
		lo++
	}
	return sign | uint16(lo)
}

// widened is the float32 of each bfloat16 pattern.
func widened(bits []uint16) []float32 {
	out := make([]float32, len(bits))
	for i, h := range bits {
		out[i] = math.Float32frombits(uint32(h) << 16)
	}
	return out
}

// roundedBF16 is v rounded to bfloat16 and widened again.
func roundedBF16(v []float32) []float32 {
	bits := make([]uint16, len(v))
	for i, x := range v {
		bits[i] = refBFloat16(x)
	}
	return widened(bits)
}

func lowPrecision(e *env) tensor.LowPrecisionBackend {
	lb, ok := e.b.(tensor.LowPrecisionBackend)
	if !ok {
		e.t.Skipf("backend %s has no LowPrecisionBackend", e.b.Name())
	}
	return lb
}

// castSpecials are float32 patterns at the edges of the rounding: exact
// ties to even both ways, one unit past a tie, the largest finite float32
// (rounds to infinity) and the largest that does not, subnormals (a tie,
// one past it, the smallest), zeros of both signs, infinities, and NaNs
// (quiet, signalling, negative, with payloads that truncation would keep).
var castSpecials = []uint32{
	0x3f808000, 0x3f818000, 0x3f808001, 0x3f817fff, 0xbf808000, 0xbf818000,
	0x7f7fffff, 0x7f7f7fff, 0x7f7f8000, 0xff7fffff,
	0x00008000, 0x00018000, 0x00008001, 0x00000001, 0x807fffff, 0x00800000,
	0x00000000, 0x80000000, 0x7f800000, 0xff800000,
	0x7fc00000, 0x7f800001, 0xffc00000, 0x7fffffff, 0x7f80ffff,
}

// testCast converts, in both directions, random bit patterns (every
// exponent, subnormals, infinities and NaNs among them), normal values and
// castSpecials: float32 to bfloat16 must equal refBFloat16 bit for bit,
// bfloat16 to float32 must be exact (the pattern shifted up).
func testCast(e *env) {
	lb := lowPrecision(e)
	for _, n := range append([]int{len(castSpecials)}, sizes...) {
		e.tcase("float32 to bfloat16, n=%d", n)(func() {
			src := make([]float32, n)
			for i := range src {
				switch {
				case n == len(castSpecials):
					src[i] = math.Float32frombits(castSpecials[i])
				case i%2 == 0:
					src[i] = math.Float32frombits(e.rng.Uint32())
				default:
					src[i] = float32(e.rng.NormFloat64())
				}
			}
			want := make([]uint16, n)
			for i, v := range src {
				want[i] = refBFloat16(v)
			}
			dst := e.bf16("dst", make([]uint16, n), false)
			lb.Cast(dst.win, e.f32("src", src, true).win)
			exactI(e, "Cast to bfloat16", dims(n), e.getH(dst), want)
		})
		e.tcase("bfloat16 to float32, n=%d", n)(func() {
			src := make([]uint16, n)
			for i := range src {
				src[i] = uint16(e.rng.Uint32())
			}
			dst := e.nanOut("dst", n)
			lb.Cast(dst.win, e.bf16("src", src, true).win)
			e.exactF("Cast to float32", dims(n), e.getF(dst), widened(src))
		})
	}
}

// testUnaryCast: UnaryCast (on backends with tensor.UnaryCastBackend) is
// Unary's float32 result rounded by Cast, bit for bit, for every unary op
// of the suite (NaN included), on lengths of every remainder mod 4 and an
// output at an offset of one element (two bytes: the one-at-a-time path).
func testUnaryCast(e *env) {
	lb := lowPrecision(e)
	ub, ok := e.b.(tensor.UnaryCastBackend)
	if !ok {
		e.t.Skipf("backend %s has no UnaryCastBackend", e.b.Name())
	}
	for _, c := range unaryCases {
		for _, n := range []int{1, 7, 64, 1030} {
			for _, off := range []int{0, 1} {
				e.tcase("%s n=%d dst+%d", c.name, n, off)(func() {
					src := e.domain(c.dom, n)
					src[n/2] = float32(math.NaN())
					x := e.f32("x", src, true)
					f := e.nanOut("f", n)
					e.b.Unary(c.op, f.win, tensor.View{Buf: x.win, Strides: []int{1}}, []int{n}, c.a, c.b)
					want := e.bf16("want", make([]uint16, n), false)
					lb.Cast(want.win, f.win)
					got := e.bf16("got", make([]uint16, n+off), false)
					ub.UnaryCast(c.op, got.win.Slice(off, n), x.win, n, c.a, c.b)
					exactI(e, c.name, dims(n), e.getH(got)[off:], e.getH(want))
				})
			}
		}
	}
}

// testLayerNormCast: LayerNormCast (on backends with
// tensor.LayerNormCastBackend) writes LayerNorm's result rounded by Cast,
// bit for bit, and the same statistics, with and without the affine
// transform, on short rows (a GPU's warp a row) and long ones.
func testLayerNormCast(e *env) {
	lb := lowPrecision(e)
	nb := normBackend(e)
	cb, ok := e.b.(tensor.LayerNormCastBackend)
	if !ok {
		e.t.Skipf("backend %s has no LayerNormCastBackend", e.b.Name())
	}
	for _, cs := range lnCases {
		rows, cols := cs[0], cs[1]
		for _, affine := range []bool{true, false} {
			e.tcase("rows=%d cols=%d affine=%v", rows, cols, affine)(func() {
				const eps = 1e-5
				x := e.normal(rows*cols, 3)
				var wb, bb tensor.Buffer
				if affine {
					wb, bb = e.in("weight", e.normal(cols, 1)), e.in("bias", e.normal(cols, 1))
				}
				xb := e.in("x", x)
				f, sm, si := e.nanOut("f", len(x)), e.nanOut("saveMean", rows), e.nanOut("saveInvStd", rows)
				nb.LayerNorm(f.win, sm.win, si.win, xb, wb, bb, rows, cols, eps)
				want := e.bf16("want", make([]uint16, len(x)), false)
				lb.Cast(want.win, f.win)
				got, gm, gi := e.bf16("got", make([]uint16, len(x)), false), e.nanOut("gotMean", rows), e.nanOut("gotInvStd", rows)
				cb.LayerNormCast(got.win, gm.win, gi.win, xb, wb, bb, rows, cols, eps)
				exactI(e, "LayerNormCast y", dims(rows, cols), e.getH(got), e.getH(want))
				e.exactF("LayerNormCast saveMean", dims(rows), e.getF(gm), e.getF(sm))
				e.exactF("LayerNormCast saveInvStd", dims(rows), e.getF(gi), e.getF(si))
			})
		}
	}
}

// testMatMulLowp checks the bfloat16 products with float32 results against
// float64 products of the same bfloat16 values. A product of two bfloat16
// values (8-bit significands) is exact in float32, so only float32
// accumulation errs: the k additions, the scaling by alpha and the adding
// of beta·c, at most γ_{k+2} ≈ (k+2)·2⁻²⁴ of Σ|alpha·a·b| + |beta·c|
// (the classic bound for recursive summation). The tolerance doubles it
// for tensor-core accumulation, whose rounding inside one multiply-add
// instruction is not specified as round-to-nearest.
func testMatMulLowp(e *env) {
	lb := lowPrecision(e)
	type lcase struct {
		batch, m, n, k int
		bcastA, bcastB bool
		gap            int
	}
	cases := []lcase{
		{1, 7, 5, 3, false, false, 0}, {1, 64, 48, 96, false, false, 0}, {3, 7, 33, 257, false, false, 0},
		{4, 16, 10, 64, true, false, 0}, {6, 9, 11, 13, false, true, 3}, {2, 2, 3, 0, false, false, 1},
	}
	for _, c := range cases {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, ab := range [][2]float32{{1, 0}, {-0.5, 1}} {
					alpha, beta := ab[0], ab[1]
					e.tcase("batch=%d m=%d n=%d k=%d broadcast a=%v b=%v gap=%d transA=%v transB=%v alpha=%g beta=%g",
						c.batch, c.m, c.n, c.k, c.bcastA, c.bcastB, c.gap, ta, tb, alpha, beta)(func() {
						sa, sb, sc := c.m*c.k, c.k*c.n, c.m*c.n+c.gap
						na, nb := c.batch, c.batch
						if c.bcastA {
							sa, na = 0, 1
						}
						if c.bcastB {
							sb, nb = 0, 1
						}
						bits := func(n int) []uint16 {
							out := make([]uint16, n)
							for i, v := range e.normal(n, 1) {
								out[i] = refBFloat16(v)
							}
							return out
						}
						ha, hb := bits(na*c.m*c.k), bits(nb*c.k*c.n)
						a, b := widened(ha), widened(hb)
						cn := (c.batch-1)*sc + c.m*c.n
						c0 := e.normal(cn, 1)
						var out *dbuf
						if beta == 0 {
							out = e.nanOut("c", cn)
						} else {
							out = e.f32("c", c0, false)
						}
						got0 := e.getF(out)
						want, bound := make([]float64, cn), make([]float64, cn)
						for i := range want {
							want[i] = float64(got0[i])
						}
						for i := 0; i < c.batch; i++ {
							var ci []float32
							if beta != 0 {
								ci = c0[i*sc : i*sc+c.m*c.n]
							}
							w, bd := refMatMul(a[i*sa:i*sa+c.m*c.k], b[i*sb:i*sb+c.k*c.n], ci, c.m, c.n, c.k, ta, tb, float64(alpha), float64(beta))
							copy(want[i*sc:], w)
							copy(bound[i*sc:], bd)
						}
						if c.batch == 1 {
							lb.MatMulLowp(out.win, e.bf16("a", ha, true).win, e.bf16("b", hb, true).win, c.m, c.n, c.k, ta, tb, alpha, beta)
						} else {
							lb.MatMulBatchedLowp(out.win, e.bf16("a", ha, true).win, e.bf16("b", hb, true).win, c.batch, c.m, c.n, c.k, sa, sb, sc, ta, tb, alpha, beta)
						}
						got := e.getF(out)
						for i := range got { // the gaps must hold what they held, bit for bit
							if i%sc >= c.m*c.n {
								if math.Float32bits(got[i]) != math.Float32bits(got0[i]) {
									e.fail("MatMulBatchedLowp wrote element %d, between two matrices of c", i)
								}
								got[i], want[i] = 0, 0
							}
						}
						e.near("MatMulLowp", dims(cn), got, want, bound, 2*float64(c.k+2)*0x1p-24)
					})
				}
			}
		}
	}
}
