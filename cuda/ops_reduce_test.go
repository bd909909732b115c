package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUReduceChannelsMatchesCPU checks SumAxes and MeanAxes over the
// axes 0, 2, 3 of NCHW tensors (the per-channel reduction, with a dozen
// blocks per channel on ResNet-9's first activation) against the CPU on
// fresh random inputs, within 1e-5 of the sum of |terms| (the conformance
// suite's tolAcc: float32 groups of four, then double sums), on 16-byte
// aligned tensors and on views one float off alignment (the one-float
// path), and checks that two runs give the same bits.
func TestGPUReduceChannelsMatchesCPU(t *testing.T) {
	g := newGPUBackend(t, BackendOptions{})
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 15))
	// The rows' kernel on its wave: many blocks a channel ([512,64,28,28],
	// [512,128,14,14]), a few blocks a channel with most blocks on two
	// channels ([7,300,16,16]), and more channels than the wave: a block a
	// channel ([3,2000,8,16]).
	for _, dims := range [][]int{{512, 64, 28, 28}, {512, 128, 14, 14}, {7, 300, 16, 16}, {3, 2000, 8, 16}, {512, 256, 7, 7}, {3, 5, 1, 1}, {100003, 3, 1, 3}, {2, 3, 200, 301}} {
		n := dims[0] * dims[1] * dims[2] * dims[3]
		data := make([]float32, n+1)
		for i := range data {
			data[i] = float32(rng.NormFloat64())
		}
		for _, off := range []int{0, 1} {
			for _, mean := range []bool{false, true} {
				run := func(b tensor.Backend) []float32 {
					s := tensor.NewScope()
					defer s.Release()
					x := tensor.FromFloat32(b, s, data, n+1).Narrow(0, off, n).Reshape(dims...)
					if mean {
						return tensor.MeanAxes(x, []int{0, 2, 3}, false).Float32s()
					}
					return tensor.SumAxes(x, []int{0, 2, 3}, false).Float32s()
				}
				got, again, want := run(g), run(g), run(tensor.CPU)
				if !sameBits(got, again) {
					t.Errorf("%v offset %d mean=%v: two runs differ (seed %d)", dims, off, mean, seed)
				}
				count := float64(n / dims[1])
				for c := range want {
					var bound float64
					for o := 0; o < dims[0]; o++ {
						for _, v := range data[off+(o*dims[1]+c)*dims[2]*dims[3] : off+(o*dims[1]+c+1)*dims[2]*dims[3]] {
							bound += math.Abs(float64(v))
						}
					}
					if mean {
						bound /= count
					}
					if d := math.Abs(float64(got[c]) - float64(want[c])); !(d <= 1e-5*bound) {
						t.Errorf("%v offset %d mean=%v: channel %d: GPU %g, CPU %g (bound %g, seed %d)", dims, off, mean, c, got[c], want[c], bound, seed)
						break
					}
				}
			}
		}
	}
}
