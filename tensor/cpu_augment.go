package tensor

import "fmt"

// augmentDecisions are the random choices of one sample (AugmentSpec's
// layout).
type augmentDecisions struct {
	ty, tx int  // the crop's top and left in the padded image
	flip   bool // horizontal flip
	cy, cx int  // the cutout's centre
}

func decideAugment(spec AugmentSpec, sample int32) augmentDecisions {
	key := [2]uint32{uint32(spec.Seed), uint32(spec.Seed >> 32)}
	ctr := spec.Offset + uint64(uint32(sample))
	w := philox4x32(augmentCounter(ctr, 0), key)
	w1 := philox4x32(augmentCounter(ctr, 1), key)
	return augmentDecisions{
		ty:   below(w[0], 2*spec.Pad+1),
		tx:   below(w[1], 2*spec.Pad+1),
		flip: unit24(w[2]) < spec.FlipProb,
		cy:   below(w[3], spec.H),
		cx:   below(w1[0], spec.W),
	}
}

// AugmentGatherAt reads the seed and offset from state.
func (c *cpuBackend) AugmentGatherAt(dst, src, idx, norm, state Buffer, spec AugmentSpec) {
	spec.Seed, spec.Offset = stateSeedOffset(state)
	c.AugmentGather(dst, src, idx, norm, spec)
}

// AugmentGather augments one sample per task, spread over the cores.
func (*cpuBackend) AugmentGather(dst, src, idx, norm Buffer, spec AugmentSpec) {
	if err := spec.Check(); err != nil {
		panic("tensor: cpu: " + err.Error())
	}
	d, s, ix, nm := f32(dst), u8(src), i32(idx), f32(norm)
	C, H, W, P := spec.C, spec.H, spec.W, spec.Pad
	plane, image := H*W, spec.C*H*W
	if len(d) != len(ix)*image || len(s)%image != 0 || len(nm) != 2*C {
		panic(fmt.Sprintf("tensor: cpu: AugmentGather of %d images of %dx%dx%d: dst %d, src %d, norm %d elements",
			len(ix), C, H, W, len(d), len(s), len(nm)))
	}
	n := len(s) / image
	for i, k := range ix {
		if k < 0 || int(k) >= n {
			panic(fmt.Sprintf("tensor: cpu: AugmentGather: index %d at %d outside [0, %d)", k, i, n))
		}
	}
	parallelFor(len(ix), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			a := decideAugment(spec, ix[i])
			img := s[int(ix[i])*image : (int(ix[i])+1)*image]
			out := d[i*image : (i+1)*image]
			cut0y, cut0x := a.cy-spec.Cutout/2, a.cx-spec.Cutout/2
			for c := 0; c < C; c++ {
				scale, shift := nm[c], nm[C+c]
				for y := 0; y < H; y++ {
					sy := y + a.ty - P
					for x := 0; x < W; x++ {
						xs := x
						if a.flip {
							xs = W - 1 - x
						}
						sx := xs + a.tx - P
						v := spec.Fill
						if sy >= 0 && sy < H && sx >= 0 && sx < W {
							v = img[c*plane+sy*W+sx]
						}
						// The conversion rounds the product, so that no
						// compiler fuses it with the add (the GPU's
						// kernel is built with --fmad=false).
						o := float32(float32(v)*scale) + shift
						if y >= cut0y && y < cut0y+spec.Cutout && x >= cut0x && x < cut0x+spec.Cutout {
							o = 0
						}
						out[c*plane+y*W+x] = o
					}
				}
			}
		}
	})
}
