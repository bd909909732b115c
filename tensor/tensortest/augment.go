package tensortest

import (
	"math"
	"strconv"

	"github.com/ember-ml/ember/tensor"
)

// refAugment is the batch AugmentBackend.AugmentGather must produce,
// written from AugmentSpec's layout without the backends' code: the
// sample's two Philox blocks from refPhilox, the padded image built
// explicitly (Fill all round), the crop cut out of it, then flipped,
// normalised and cut out. The normalisation is the layout's float32
// product then float32 sum, so the result is exact.
func refAugment(src []uint8, idx []int32, scale, shift []float32, s tensor.AugmentSpec) []float32 {
	c, h, w, p := s.C, s.H, s.W, s.Pad
	image := c * h * w
	pick := func(word uint32, n int) int { return int(uint64(word) * uint64(n) >> 32) }
	out := make([]float32, 0, len(idx)*image)
	for _, k := range idx {
		ctr := s.Offset + uint64(k)
		b0 := refPhilox(uint32(ctr), uint32(ctr>>32), 0, 1, uint32(s.Seed), uint32(s.Seed>>32))
		b1 := refPhilox(uint32(ctr), uint32(ctr>>32), 1, 1, uint32(s.Seed), uint32(s.Seed>>32))
		top, left := pick(b0[0], 2*p+1), pick(b0[1], 2*p+1)
		flip := refUniform24(b0[2]) < float64(s.FlipProb)
		cy, cx := pick(b0[3], h), pick(b1[0], w)
		img := src[int(k)*image : (int(k)+1)*image]
		ph, pw := h+2*p, w+2*p
		for ch := 0; ch < c; ch++ {
			padded := make([]uint8, ph*pw)
			for i := range padded {
				padded[i] = s.Fill
			}
			for y := 0; y < h; y++ {
				copy(padded[(y+p)*pw+p:(y+p)*pw+p+w], img[ch*h*w+y*w:ch*h*w+(y+1)*w])
			}
			crop := make([]uint8, h*w)
			for y := 0; y < h; y++ {
				copy(crop[y*w:(y+1)*w], padded[(y+top)*pw+left:(y+top)*pw+left+w])
			}
			if flip {
				for y := 0; y < h; y++ {
					row := crop[y*w : (y+1)*w]
					for a, b := 0, w-1; a < b; a, b = a+1, b-1 {
						row[a], row[b] = row[b], row[a]
					}
				}
			}
			for y := 0; y < h; y++ {
				for x := 0; x < w; x++ {
					prod := float32(float64(crop[y*w+x]) * float64(scale[ch]))
					v := prod + shift[ch]
					if s.Cutout > 0 && y >= cy-s.Cutout/2 && y < cy-s.Cutout/2+s.Cutout &&
						x >= cx-s.Cutout/2 && x < cx-s.Cutout/2+s.Cutout {
						v = 0
					}
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// testAugmentGather checks AugmentBackend.AugmentGather: exactly (bit for
// bit) against refAugment over shapes of one to three channels, odd sizes,
// every augmentation on and off, random seeds, offsets whose low counter
// word wraps, and repeated indices; determinism (the same call twice, and a
// sample's result independent of its place in the batch); and the
// distribution of the decisions, read back from an image whose bytes name
// their own position (flip rate and crop offsets).
func testAugmentGather(e *env) {
	ab, ok := e.b.(tensor.AugmentBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.AugmentBackend", e.b.Name())
	}
	type shape struct{ c, h, w int }
	shapes := []shape{{1, 28, 28}, {3, 32, 32}, {2, 5, 7}, {1, 1, 1}, {4, 9, 3}}
	run := func(s tensor.AugmentSpec, src []uint8, idx []int32, scale, shift []float32) ([]float32, *dbuf) {
		image := s.C * s.H * s.W
		dst := e.nanOut("dst", len(idx)*image)
		norm := e.f32("norm", append(append([]float32(nil), scale...), shift...), true)
		ab.AugmentGather(dst.win, e.u8("src", src, true).win, e.i32("idx", idx, true).win, norm.win, s)
		return e.getF(dst), dst
	}
	for _, sh := range shapes {
		for _, pad := range []int{0, 1, 4} {
			if pad > min(sh.h, sh.w) {
				continue
			}
			for _, aug := range []struct {
				flip   float32
				cutout int
			}{{0, 0}, {0.5, 0}, {1, 3}, {0.3, 8}} {
				n := 1 + e.rng.IntN(40)
				batch := []int{1, 7, 300}[e.rng.IntN(3)]
				s := tensor.AugmentSpec{C: sh.c, H: sh.h, W: sh.w, Pad: pad, Fill: uint8(e.rng.IntN(256)),
					FlipProb: aug.flip, Cutout: aug.cutout, Seed: e.rng.Uint64(), Offset: e.rng.Uint64() >> 1}
				if e.rng.IntN(2) == 0 {
					s.Offset = 1<<32 - uint64(e.rng.IntN(n)) - 1 // some samples' counters carry into the high word
				}
				e.tcase("%dx%dx%d n=%d batch=%d pad=%d fill=%d flip=%g cutout=%d seed=%d offset=%d",
					sh.c, sh.h, sh.w, n, batch, pad, s.Fill, aug.flip, aug.cutout, s.Seed, s.Offset)(func() {
					image := sh.c * sh.h * sh.w
					src := make([]uint8, n*image)
					for i := range src {
						src[i] = uint8(e.rng.IntN(256))
					}
					idx := make([]int32, batch)
					for i := range idx {
						idx[i] = int32(e.rng.IntN(n)) // repeats when batch > n
					}
					scale, shift := e.uniform(sh.c, 0.001, 0.05), e.uniform(sh.c, -3, 3)
					got, _ := run(s, src, idx, scale, shift)
					want := refAugment(src, idx, scale, shift, s)
					e.exactF("AugmentGather", dims(batch, sh.c, sh.h, sh.w), got, want)

					// The same call again gives the same bits; the batch
					// reversed gives the samples reversed.
					again, _ := run(s, src, idx, scale, shift)
					e.exactF("AugmentGather repeated", dims(batch, sh.c, sh.h, sh.w), again, got)
					rev := make([]int32, batch)
					for i, k := range idx {
						rev[batch-1-i] = k
					}
					back, _ := run(s, src, rev, scale, shift)
					for i := 0; i < batch; i++ {
						e.exactF("AugmentGather of the reversed batch", dims(sh.c, sh.h, sh.w),
							back[(batch-1-i)*image:(batch-i)*image], got[i*image:(i+1)*image])
					}
				})
			}
		}
	}
	e.tcase("state")(func() {
		// AugmentGatherAt takes the seed and offset from the state words
		// (the offset's low word about to wrap), not from the spec.
		seed, offset := e.rng.Uint64(), uint64(1<<32-3)
		s := tensor.AugmentSpec{C: 3, H: 8, W: 6, Pad: 2, Fill: 9, FlipProb: 0.5, Cutout: 3, Seed: ^seed, Offset: 12345}
		src := make([]uint8, 10*3*8*6)
		for i := range src {
			src[i] = uint8(e.rng.IntN(256))
		}
		idx := []int32{0, 9, 3, 3, 7, 1}
		scale, shift := e.uniform(3, 0.001, 0.05), e.uniform(3, -3, 3)
		state := e.i32("state", []int32{int32(uint32(seed)), int32(uint32(seed >> 32)), int32(uint32(offset)), int32(uint32(offset >> 32))}, true)
		dst := e.nanOut("dst", len(idx)*3*8*6)
		norm := e.f32("norm", append(append([]float32(nil), scale...), shift...), true)
		ab.AugmentGatherAt(dst.win, e.u8("src", src, true).win, e.i32("idx", idx, true).win, norm.win, state.win, s)
		s.Seed, s.Offset = seed, offset
		e.exactF("AugmentGatherAt", dims(len(idx), 3, 8, 6), e.getF(dst), refAugment(src, idx, scale, shift, s))
	})
	e.tcase("epochs differ")(func() {
		// 64 samples of 1x16x16 with pad 4: the chance that two epochs
		// crop and flip every sample alike is (1/(9·9·2))^64.
		s := tensor.AugmentSpec{C: 1, H: 16, W: 16, Pad: 4, FlipProb: 0.5, Seed: e.rng.Uint64()}
		src := make([]uint8, 64*256)
		for i := range src {
			src[i] = uint8(e.rng.IntN(256))
		}
		idx := make([]int32, 64)
		for i := range idx {
			idx[i] = int32(i)
		}
		one := []float32{1}
		zero := []float32{0}
		s.Offset = tensor.AugmentOffset(0, 64)
		a, _ := run(s, src, idx, one, zero)
		s.Offset = tensor.AugmentOffset(1, 64)
		b, _ := run(s, src, idx, one, zero)
		same := 0
		for i := 0; i < 64; i++ {
			eq := true
			for j := i * 256; j < (i+1)*256; j++ {
				eq = eq && a[j] == b[j]
			}
			if eq {
				same++
			}
		}
		if same > 8 {
			e.fail("epochs 0 and 1 augment %d of 64 samples alike; want a few at most", same)
		}
	})
	testAugmentDistribution(e, run)
}

// testAugmentDistribution decodes each sample's crop and flip from the
// output and checks their frequencies. The image is 1x15x15 with byte
// y·15+x+1 at (y, x) (0 is the fill), so an output pixel names the source
// pixel it came from; with pad 3 the centre pixel and its right neighbour
// always come from inside the image.
func testAugmentDistribution(e *env, run func(tensor.AugmentSpec, []uint8, []int32, []float32, []float32) ([]float32, *dbuf)) {
	const (
		side, pad, n = 15, 3, 20000
		flipProb     = 0.5
	)
	e.tcase("distribution n=%d pad=%d flip=%g", n, pad, flipProb)(func() {
		src := make([]uint8, n*side*side)
		for k := 0; k < n; k++ {
			for i := 0; i < side*side; i++ {
				src[k*side*side+i] = uint8(i + 1)
			}
		}
		idx := make([]int32, n)
		for i := range idx {
			idx[i] = int32(i)
		}
		s := tensor.AugmentSpec{C: 1, H: side, W: side, Pad: pad, FlipProb: flipProb, Seed: e.rng.Uint64(), Offset: e.rng.Uint64() >> 2}
		got, _ := run(s, src, idx, []float32{1}, []float32{0})
		var tops, lefts [2*pad + 1]int
		flips := 0
		const c = side / 2
		for k := 0; k < n; k++ {
			at := func(x int) (int, int) {
				v := int(got[k*side*side+c*side+x]) - 1
				return v / side, v % side
			}
			sy, sx := at(c)
			_, sx1 := at(c + 1)
			flip := sx1 < sx
			if flip {
				flips++
				sx = side - 1 - sx // the unflipped column
			}
			top, left := sy-c+pad, sx-c+pad
			if top < 0 || top > 2*pad || left < 0 || left > 2*pad {
				e.fail("sample %d: decoded crop offset (%d, %d) outside [0, %d]", k, top, left, 2*pad)
				return
			}
			tops[top]++
			lefts[left]++
		}
		// Binomial counts: 6 standard deviations bound a correct
		// generator's failures to about 2e-9 per count.
		within := func(what string, count int, p float64) {
			mean, sd := n*p, math.Sqrt(n*p*(1-p))
			if math.Abs(float64(count)-mean) > 6*sd {
				e.fail("%s: %d of %d, want %.0f ± %.0f", what, count, n, mean, 6*sd)
			}
		}
		within("flips", flips, flipProb)
		for i := range tops {
			within("crop top "+strconv.Itoa(i), tops[i], 1.0/(2*pad+1))
			within("crop left "+strconv.Itoa(i), lefts[i], 1.0/(2*pad+1))
		}
	})
}
