package tensor

import (
	"fmt"
	"math"
)

// Philox4x32-10 constants (Salmon et al., 2011).
const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// philox4x32 returns the ten-round Philox block of counter ctr under key.
func philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	for r := 0; r < 10; r++ {
		if r > 0 {
			key[0] += philoxW0
			key[1] += philoxW1
		}
		p0 := uint64(philoxM0) * uint64(ctr[0])
		p1 := uint64(philoxM1) * uint64(ctr[2])
		ctr = [4]uint32{
			uint32(p1>>32) ^ ctr[1] ^ key[0], uint32(p1),
			uint32(p0>>32) ^ ctr[3] ^ key[1], uint32(p0),
		}
	}
	return ctr
}

// philoxBlock is block number offset+j of the stream of seed (the layout of
// backend_random.go).
func philoxBlock(seed, block uint64) [4]uint32 {
	return philox4x32([4]uint32{uint32(block), uint32(block >> 32), 0, 0}, [2]uint32{uint32(seed), uint32(seed >> 32)})
}

// unit24 maps a word to [0, 1) with 24 random bits.
func unit24(w uint32) float32 { return float32(w>>8) * (1.0 / (1 << 24)) }

// boxMuller turns a pair of words into two standard normals.
func boxMuller(w0, w1 uint32) (float64, float64) {
	u1 := float64((w0>>8)+1) * (1.0 / (1 << 24))
	u2 := float64(w1>>8) * (1.0 / (1 << 24))
	r := math.Sqrt(-2 * math.Log(u1))
	s, c := math.Sincos(2 * math.Pi * u2)
	return r * c, r * s
}

// RandomAt draws at the state's seed and offset and advances the offset.
func (c *cpuBackend) RandomAt(dst Buffer, dist Distribution, state Buffer, a, b float32) {
	seed, offset := stateSeedOffset(state)
	c.Random(dst, dist, seed, offset, a, b)
	setStateOffset(state, offset+uint64(dst.Len+3)/4)
}

func (*cpuBackend) Random(dst Buffer, dist Distribution, seed, offset uint64, a, b float32) {
	d := f32(dst)
	span := b - a
	for j := 0; 4*j < len(d); j++ {
		w := philoxBlock(seed, offset+uint64(j))
		var z [4]float64
		if dist == Normal {
			z[0], z[1] = boxMuller(w[0], w[1])
			z[2], z[3] = boxMuller(w[2], w[3])
		}
		for k := 0; k < 4 && 4*j+k < len(d); k++ {
			var v float32
			switch dist {
			case Uniform:
				v = a + float32(span*unit24(w[k]))
			case Bernoulli:
				if unit24(w[k]) < a {
					v = 1
				}
			case Normal:
				v = float32(float64(a) + float64(b)*z[k])
			default:
				panic(fmt.Sprintf("tensor: cpu: Random of unknown distribution %d", dist))
			}
			d[4*j+k] = v
		}
	}
}

// Dropout is Random's Bernoulli draw, scaled, and applied to x in one loop.
func (*cpuBackend) Dropout(y, mask, x Buffer, seed, offset uint64, keep, scale float32) {
	checkDropoutDims("Dropout", y, mask, x)
	dropoutLoop(f32(y), f32(mask), f32(x), seed, offset, keep, scale)
}

// DropoutRedraw is Dropout's y without its mask.
func (*cpuBackend) DropoutRedraw(y, x Buffer, seed, offset uint64, keep, scale float32) {
	checkDropoutDims("DropoutRedraw", y, y, x)
	dropoutLoop(f32(y), nil, f32(x), seed, offset, keep, scale)
}

// DropoutRedrawAt is DropoutRedraw at saved's seed and offset.
func (c *cpuBackend) DropoutRedrawAt(y, x Buffer, saved Buffer, keep, scale float32) {
	seed, offset := stateSeedOffset(saved)
	c.DropoutRedraw(y, x, seed, offset, keep, scale)
}

// TakeRandomState copies state into saved and advances state's offset.
func (c *cpuBackend) TakeRandomState(saved, state Buffer, blocks uint64) {
	st, sv := i32(state.Slice(0, 4)), i32(saved.Slice(0, 4))
	copy(sv, st)
	_, offset := stateSeedOffset(state)
	setStateOffset(state, offset+blocks)
}

// DropoutRedrawAdd is DropoutRedraw with r added to each element, after
// the product is rounded (tensor.DropoutAddBackend).
func (*cpuBackend) DropoutRedrawAdd(y, x, r Buffer, seed, offset uint64, keep, scale float32) {
	checkDropoutDims("DropoutRedrawAdd", y, r, x)
	dropoutLoopAdd(f32(y), nil, f32(x), f32(r), seed, offset, keep, scale)
}

// DropoutRedrawAddAt is DropoutRedrawAdd at saved's seed and offset.
func (c *cpuBackend) DropoutRedrawAddAt(y, x, r Buffer, saved Buffer, keep, scale float32) {
	seed, offset := stateSeedOffset(saved)
	c.DropoutRedrawAdd(y, x, r, seed, offset, keep, scale)
}

var _ DropoutAddBackend = (*cpuBackend)(nil)

// dropoutLoop sets out = in·mask for the mask (scale where the Bernoulli
// draw of probability keep at (seed, offset) is 1, else 0), written into
// m unless m is nil.
func dropoutLoop(out, m, in []float32, seed, offset uint64, keep, scale float32) {
	dropoutLoopAdd(out, m, in, nil, seed, offset, keep, scale)
}

// dropoutLoopAdd is dropoutLoop with r (when not nil) added to each
// rounded product.
func dropoutLoopAdd(out, m, in, r []float32, seed, offset uint64, keep, scale float32) {
	for j := 0; 4*j < len(in); j++ {
		w := philoxBlock(seed, offset+uint64(j))
		for k := 0; k < 4 && 4*j+k < len(in); k++ {
			var v float32
			if unit24(w[k]) < keep {
				v = scale
			}
			if m != nil {
				m[4*j+k] = v
			}
			o := float32(in[4*j+k] * v) // rounded before the sum: no fused multiply-add
			if r != nil {
				o = r[4*j+k] + o
			}
			out[4*j+k] = o
		}
	}
}

// stateSeedOffset reads a device generator's four state words.
func stateSeedOffset(state Buffer) (seed, offset uint64) {
	st := i32(state.Slice(0, 4))
	return uint64(uint32(st[0])) | uint64(uint32(st[1]))<<32, uint64(uint32(st[2])) | uint64(uint32(st[3]))<<32
}

// setStateOffset writes offset into a device generator's state words.
func setStateOffset(state Buffer, offset uint64) {
	st := i32(state.Slice(0, 4))
	st[2], st[3] = int32(uint32(offset)), int32(uint32(offset>>32))
}

// DropoutAt is Dropout at the state's seed and offset, which it advances.
func (c *cpuBackend) DropoutAt(y, mask, x Buffer, state Buffer, keep, scale float32) {
	seed, offset := stateSeedOffset(state)
	c.Dropout(y, mask, x, seed, offset, keep, scale)
	setStateOffset(state, offset+uint64(x.Len+3)/4)
}

// checkDropoutDims panics unless y, mask and x have the same length.
func checkDropoutDims(op string, y, mask, x Buffer) {
	if y.Len != x.Len || mask.Len != x.Len {
		panic(fmt.Sprintf("tensor: cpu: %s of %d elements into y of %d and a mask of %d", op, x.Len, y.Len, mask.Len))
	}
}
