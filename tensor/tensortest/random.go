package tensortest

import (
	"math"
	"math/bits"

	"github.com/ember-ml/ember/tensor"
)

// refPhilox is Philox4x32-10 (Salmon et al., 2011) written out again for
// the suite, independently of the backends: ten rounds of two 32×32→64-bit
// products, the key bumped by the Weyl constants between rounds.
func refPhilox(c0, c1, c2, c3, k0, k1 uint32) [4]uint32 {
	for round := 0; round < 10; round++ {
		hi0, lo0 := bits.Mul32(0xD2511F53, c0)
		hi1, lo1 := bits.Mul32(0xCD9E8D57, c2)
		c0, c1, c2, c3 = hi1^c1^k0, lo1, hi0^c3^k1, lo0
		k0 += 0x9E3779B9
		k1 += 0xBB67AE85
	}
	return [4]uint32{c0, c1, c2, c3}
}

// refWords returns the n output words of the stream (seed, offset): word i
// is output i%4 of block offset + i/4 (the layout of tensor.Random).
func refWords(seed, offset uint64, n int) []uint32 {
	w := make([]uint32, 0, n+3)
	for j := uint64(0); len(w) < n; j++ {
		ctr := offset + j
		out := refPhilox(uint32(ctr), uint32(ctr>>32), 0, 0, uint32(seed), uint32(seed>>32))
		w = append(w, out[:]...)
	}
	return w[:n]
}

// refUniform24 is (w >> 8) / 2^24, exact in float32 and float64.
func refUniform24(w uint32) float64 { return float64(w>>8) / (1 << 24) }

// refRandom returns the float32 values tensor.Random must produce for the
// uniform and Bernoulli distributions (exactly) and the float64 values of
// the normal one (which the float32 result rounds).
func refRandom(dist tensor.Distribution, seed, offset uint64, n int, a, b float32) []float64 {
	w := refWords(seed, offset, n+(4-n%4)%4) // whole blocks: normals come in pairs
	out := make([]float64, n)
	for i := range out {
		switch dist {
		case tensor.Uniform:
			// The layout's two float32 roundings: the product, then the sum.
			span := b - a
			prod := float32(float64(span) * refUniform24(w[i]))
			out[i] = float64(a + prod)
		case tensor.Bernoulli:
			if refUniform24(w[i]) < float64(a) {
				out[i] = 1
			}
		case tensor.Normal:
			p := i &^ 1 // the pair (first, second) of words this element shares
			u1 := float64((w[p]>>8)+1) / (1 << 24)
			u2 := refUniform24(w[p+1])
			r := math.Sqrt(-2 * math.Log(u1))
			z := r * math.Cos(2*math.Pi*u2)
			if i%2 == 1 {
				z = r * math.Sin(2*math.Pi*u2)
			}
			out[i] = float64(a) + float64(b)*z
		}
	}
	return out
}

// testRandom checks tensor.Random against refRandom: uniform and Bernoulli
// draws bit for bit, normal draws within 2 ulp of float32 (tolNormal), on
// every size (odd, so partial blocks occur), random seeds and offsets, and
// offsets whose low word wraps within the draw (the carry into counter word
// 1). The reference itself is first checked against the Random123
// known-answer vectors for philox4x32-10.
func testRandom(e *env) {
	kat := []struct{ in, want [4]uint32 }{
		// counter (4 words), then key in the first two words of the next.
		{[4]uint32{0, 0, 0, 0}, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{^uint32(0), ^uint32(0), ^uint32(0), ^uint32(0)}, [4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
	}
	for _, k := range kat {
		if got := refPhilox(k.in[0], k.in[1], k.in[2], k.in[3], k.in[0], k.in[1]); got != k.want {
			e.fail("reference philox4x32-10 of %08x: %08x, want %08x", k.in, got, k.want)
		}
	}
	if got, want := refPhilox(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0),
		[4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}; got != want {
		e.fail("reference philox4x32-10 of the π vector: %08x, want %08x", got, want)
	}
	// tolNormal: the normal draw is computed in float64 and rounded once to
	// float32; another backend's float64 log, sqrt and sincos may differ by
	// an ulp of float64, which moves the float32 result by at most one ulp
	// (2⁻²³ relative) when it lies near a rounding boundary.
	const tolNormal = 2.4e-7
	type dcase struct {
		dist tensor.Distribution
		a, b float32
	}
	dists := []dcase{
		{tensor.Uniform, 0, 1}, {tensor.Uniform, -2.5, 3}, {tensor.Uniform, 1, 1},
		{tensor.Bernoulli, 0.3, 0}, {tensor.Bernoulli, 0, 0}, {tensor.Bernoulli, 1, 0},
		{tensor.Normal, 0, 1}, {tensor.Normal, 1.5, 2},
	}
	for _, n := range sizes {
		for _, dc := range dists {
			seed, offset := e.rng.Uint64(), e.rng.Uint64()>>1
			if n > 4 && e.rng.IntN(2) == 0 {
				offset = 1<<32 - uint64(e.rng.IntN(n/4)) // the low counter word wraps in this draw
			}
			e.tcase("%s dist=%d a=%g b=%g seed=%d offset=%d", sizeStr(n), dc.dist, dc.a, dc.b, seed, offset)(func() {
				dst := e.nanOut("dst", n)
				e.b.Random(dst.win, dc.dist, seed, offset, dc.a, dc.b)
				got := e.getF(dst)
				want := refRandom(dc.dist, seed, offset, n, dc.a, dc.b)
				if dc.dist == tensor.Normal {
					bound := make([]float64, n)
					for i, v := range want {
						bound[i] = math.Abs(float64(dc.a)) + math.Abs(v-float64(dc.a))
					}
					e.near("Random normal", dims(n), got, want, bound, tolNormal)
					return
				}
				w32 := make([]float32, n)
				for i, v := range want {
					w32[i] = float32(v)
				}
				e.exactF("Random", dims(n), got, w32)
			})
		}
	}
	// Moments of large draws: a check of the mapping independent of the
	// reference's reading of the layout. With n = 65537 the sample mean's
	// standard error is σ/256; 6 of them bound a correct generator's
	// failures to about 1e-9 per check.
	const n = 65537
	for _, dc := range []struct {
		dist       tensor.Distribution
		a, b       float32
		mean, vari float64
	}{
		{tensor.Uniform, 0, 1, 0.5, 1.0 / 12},
		{tensor.Normal, 0, 1, 0, 1},
		{tensor.Bernoulli, 0.25, 0, 0.25, 0.25 * 0.75},
	} {
		e.tcase("moments dist=%d", dc.dist)(func() {
			dst := e.nanOut("dst", n)
			e.b.Random(dst.win, dc.dist, e.rng.Uint64(), e.rng.Uint64()>>8, dc.a, dc.b)
			var s, s2 float64
			for _, v := range e.getF(dst) {
				s += float64(v)
				s2 += float64(v) * float64(v)
			}
			m := s / n
			v := s2/n - m*m
			se := math.Sqrt(dc.vari / n)
			if math.Abs(m-dc.mean) > 6*se {
				e.fail("mean %.5f, want %.5f ± %.5f", m, dc.mean, 6*se)
			}
			if math.Abs(v-dc.vari) > 0.05*dc.vari {
				e.fail("variance %.5f, want %.5f ± 5%%", v, dc.vari)
			}
		})
	}
}

// testRandomAt checks RandomStateBackend.RandomAt: three successive draws
// from one device state equal Random at the offsets the state holds (bit
// for bit for uniform and Bernoulli, tolNormal for normal draws), and the
// state's offset advances by the blocks drawn, carrying into its high word,
// with the seed words untouched.
func testRandomAt(e *env) {
	rb, ok := e.b.(tensor.RandomStateBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.RandomStateBackend", e.b.Name())
	}
	for _, dist := range []tensor.Distribution{tensor.Uniform, tensor.Bernoulli, tensor.Normal} {
		seed := e.rng.Uint64()
		offset := uint64(1<<32 - 5) // the second draw carries into the high word
		e.tcase("dist=%d seed=%d", dist, seed)(func() {
			words := func(off uint64) []int32 { return stateWords(seed, off) }
			state := e.i32("state", words(offset), false)
			a, b := float32(-1), float32(2)
			if dist == tensor.Bernoulli {
				a = 0.6
			}
			for _, n := range []int{17, 1000, 3} {
				dst := e.nanOut("dst", n)
				rb.RandomAt(dst.win, dist, state.win, a, b)
				want := refRandom(dist, seed, offset, n, a, b)
				if dist == tensor.Normal {
					bound := make([]float64, n)
					for i, v := range want {
						bound[i] = math.Abs(float64(a)) + math.Abs(v-float64(a))
					}
					e.near("RandomAt normal", dims(n), e.getF(dst), want, bound, 2.4e-7) // tolNormal of testRandom
				} else {
					w32 := make([]float32, n)
					for i, v := range want {
						w32[i] = float32(v)
					}
					e.exactF("RandomAt", dims(n), e.getF(dst), w32)
				}
				offset += uint64(n+3) / 4
				exactI(e, "RandomAt state after the draw", dims(4), e.getI(state), words(offset))
			}
		})
	}
}

// stateWords is a generator's device state: the seed's and the offset's
// low and high words.
func stateWords(seed, off uint64) []int32 {
	return []int32{int32(uint32(seed)), int32(uint32(seed >> 32)), int32(uint32(off)), int32(uint32(off >> 32))}
}

// Dropout and DropoutAt against refRandom's Bernoulli draws: the mask is
// exactly scale where the draw is 1 and 0 elsewhere, y is exactly x·mask
// (one float32 product), and DropoutAt advances the state as RandomAt.
// Windows at the odd places of the other tests, and 16-byte aligned ones
// (the GPU's vector path).
func testDropout(e *env) {
	db, ok := e.b.(tensor.DropoutBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.DropoutBackend", e.b.Name())
	}
	const keep = 0.8
	scale := float32(1) / keep
	for _, aligned := range []bool{false, true} {
		for _, atState := range []bool{false, true} {
			seed := e.rng.Uint64()
			offset := uint64(1<<32 - 3) // the second draw carries into the high word
			e.tcase("aligned=%v state=%v seed=%d", aligned, atState, seed)(func() {
				words := func(off uint64) []int32 { return stateWords(seed, off) }
				state := e.i32("state", words(offset), false)
				for _, n := range []int{4099, 1, 4, 7, 1024} {
					pre := func() int {
						if aligned {
							return 4
						}
						return 1 + e.rng.IntN(7)
					}
					x := e.normal(n, 1)
					xb := e.f32Pre("x", x, true, pre())
					y := e.f32Pre("y", fill(n, float32(math.NaN())), false, pre())
					mask := e.f32Pre("mask", fill(n, float32(math.NaN())), false, pre())
					if atState {
						db.DropoutAt(y.win, mask.win, xb.win, state.win, keep, scale)
					} else {
						db.Dropout(y.win, mask.win, xb.win, seed, offset, keep, scale)
					}
					draw := refRandom(tensor.Bernoulli, seed, offset, n, keep, 0)
					wantMask, wantY := make([]float32, n), make([]float32, n)
					for i, d := range draw {
						if d == 1 {
							wantMask[i] = scale
						}
						wantY[i] = x[i] * wantMask[i]
					}
					e.exactF("Dropout mask", dims(n), e.getF(mask), wantMask)
					e.exactF("Dropout y", dims(n), e.getF(y), wantY)
					offset += uint64(n+3) / 4
					if atState {
						exactI(e, "DropoutAt state after the draw", dims(4), e.getI(state), words(offset))
					}
				}
			})
		}
	}
}

// testDropoutAdd: DropoutRedrawAdd and DropoutRedrawAddAt (on backends
// with tensor.DropoutAddBackend) write r + x·mask for DropoutRedraw's
// mask, the product rounded before the sum (no fused multiply-add), bit
// for bit; on lengths of every remainder mod 4, aligned and not.
func testDropoutAdd(e *env) {
	ab, ok := e.b.(tensor.DropoutAddBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.DropoutAddBackend", e.b.Name())
	}
	const keep = 0.8
	scale := float32(1) / keep
	for _, aligned := range []bool{false, true} {
		for _, atState := range []bool{false, true} {
			seed, offset := e.rng.Uint64(), uint64(1<<32-3)
			e.tcase("aligned=%v saved=%v seed=%d", aligned, atState, seed)(func() {
				saved := e.i32("saved", stateWords(seed, offset), false)
				for _, n := range []int{4099, 1, 6, 7, 1024} {
					pre := 4
					if !aligned {
						pre = 1 + e.rng.IntN(7)
					}
					x, r := e.normal(n, 1), e.normal(n, 1)
					xb, rb := e.f32Pre("x", x, true, pre), e.f32Pre("r", r, true, pre)
					y := e.f32Pre("y", fill(n, float32(math.NaN())), false, pre)
					if atState {
						e.b.Copy(saved.win, e.i32("words", stateWords(seed, offset), true).win)
						ab.DropoutRedrawAddAt(y.win, xb.win, rb.win, saved.win, keep, scale)
					} else {
						ab.DropoutRedrawAdd(y.win, xb.win, rb.win, seed, offset, keep, scale)
					}
					draw := refRandom(tensor.Bernoulli, seed, offset, n, keep, 0)
					want := make([]float32, n)
					for i, d := range draw {
						var m float32
						if d == 1 {
							m = scale
						}
						want[i] = r[i] + float32(x[i]*m)
					}
					e.exactF("DropoutRedrawAdd y", dims(n), e.getF(y), want)
					offset += uint64(n+3) / 4
				}
			})
		}
	}
}

// DropoutRedraw, DropoutRedrawAt and TakeRandomState against Dropout's y
// (refRandom's draws, as testDropout): y exactly x·mask with no mask
// written; DropoutRedrawAt reads the saved state and leaves it as it is;
// TakeRandomState copies the state and advances it by the blocks given.
func testDropoutRedraw(e *env) {
	rb, ok := e.b.(tensor.DropoutRedrawBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.DropoutRedrawBackend", e.b.Name())
	}
	const keep = 0.7
	scale := float32(1) / keep
	for _, aligned := range []bool{false, true} {
		for _, atState := range []bool{false, true} {
			seed := e.rng.Uint64()
			offset := uint64(1<<32 - 2)
			e.tcase("aligned=%v saved=%v seed=%d", aligned, atState, seed)(func() {
				words := func(off uint64) []int32 { return stateWords(seed, off) }
				state := e.i32("state", words(offset), false)
				saved := e.i32("saved", []int32{-1, -1, -1, -1}, false)
				for _, n := range []int{4099, 1, 4, 7, 1024} {
					pre := 4
					if !aligned {
						pre = 1 + e.rng.IntN(7)
					}
					x := e.normal(n, 1)
					xb := e.f32Pre("x", x, true, pre)
					y := e.f32Pre("y", fill(n, float32(math.NaN())), false, pre)
					if atState {
						rb.TakeRandomState(saved.win, state.win, uint64(n+3)/4)
						exactI(e, "TakeRandomState saved", dims(4), e.getI(saved), words(offset))
						exactI(e, "TakeRandomState state after", dims(4), e.getI(state), words(offset+uint64(n+3)/4))
						rb.DropoutRedrawAt(y.win, xb.win, saved.win, keep, scale)
						exactI(e, "DropoutRedrawAt leaves saved", dims(4), e.getI(saved), words(offset))
					} else {
						rb.DropoutRedraw(y.win, xb.win, seed, offset, keep, scale)
					}
					draw := refRandom(tensor.Bernoulli, seed, offset, n, keep, 0)
					want := make([]float32, n)
					for i, d := range draw {
						var m float32 // x·0 keeps x's sign, as Dropout's product
						if d == 1 {
							m = scale
						}
						want[i] = x[i] * m
					}
					e.exactF("DropoutRedraw y", dims(n), e.getF(y), want)
					offset += uint64(n+3) / 4
				}
			})
		}
	}
}
