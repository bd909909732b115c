package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/ember-ml/ember/cuda/driver"
	"github.com/ember-ml/ember/tensor"
)

// probeShared is the dynamic shared memory the probe's kernel may take:
// the one-pass batch norm's largest (the H200's).
var probeShared = bnSharedCandidates[0]

// bnProbeSrc follows norm.cu (compiled with it): the one-pass batch norm
// with a time stamp after each of its phases.
const bnProbeSrc = `
__device__ __forceinline__ unsigned long long probe_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void probe_stamp(unsigned long long* st, int k) {
    __syncthreads();
    if (threadIdx.x == 0 && st != 0) st[blockIdx.x * 8 + k] = probe_gtime();
}
extern "C" __global__ void __launch_bounds__(1024) probe_bn_onepass_timed(unsigned long long* st, float* y,
        float* saveMean, float* saveInvStd, const float* x, int n, int c, int inner, float eps) {
    extern __shared__ float held[];
    const int m = n * inner, ch = blockIdx.x;
    probe_stamp(st, 0);
    const double x0 = ember_bn_shift(x, n, inner, ch);
    double s1, s2, mean, var;
    ember_bn_hold<8>(held, x, c, inner, ch, 0, m, x0, &s1, &s2);
    probe_stamp(st, 1);
    ember_block_sum2_all(&s1, &s2);
    ember_bn_moments(x0, s1, s2, m, &mean, &var);
    const float mean32 = (float)mean, inv32 = (float)(1.0 / sqrt(var + (double)eps));
    if (threadIdx.x == 0) ember_bn_save(saveMean, saveInvStd, 0, 0, ch, mean, var, m, 0.f, mean32, inv32);
    probe_stamp(st, 2);
    ember_bn_emit<8>(y, held, 0, 0, c, inner, ch, 0, m, mean32, inv32, 0);
    probe_stamp(st, 3);
}
`

// TestGPUBatchNormProbe times the training batch norm on each of its
// paths that a shape fits (as built; split; one pass, a block a channel;
// clusters of 2, 4 and 8 blocks a channel) beside a copy of its size,
// and prints, for the one-pass kernel, when the first, median and last
// block ends each phase: loads and sums, statistics, y. The shapes
// include fewer channels than SMs.
func TestGPUBatchNormProbe(t *testing.T) {
	if os.Getenv("EMBER_BN_PROBE") != "1" {
		t.Skip("the batch norm probe runs with EMBER_BN_PROBE=1")
	}
	b := newGPUBackend(t, BackendOptions{})
	base, err := concatKernels([]string{"kernels/common.cu", "kernels/norm.cu"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.dev.Compile(base+bnProbeSrc, kernelOptions...)
	if err != nil {
		t.Fatal(err)
	}
	timed, err := m.Function("probe_bn_onepass_timed")
	if err != nil {
		t.Fatal(err)
	}
	if err := timed.SetMaxDynamicSharedMemory(probeShared); err != nil {
		t.Fatal(err)
	}
	const eps = 1e-5
	for _, shape := range [][3]int{
		{512, 256, 49}, {1024, 256, 49}, {512, 128, 49}, {256, 128, 49}, {1024, 96, 49}, {256, 120, 25},
		{512, 64, 64}, {128, 64, 64}, {64, 64, 64}, {2048, 64, 16}, {256, 32, 64}, {128, 32, 256}, {512, 16, 64},
	} {
		n, c, inner := shape[0], shape[1], shape[2]
		total := n * c * inner
		host := make([]float32, total)
		rng := rand.New(rand.NewPCG(1, uint64(total)))
		for i := range host {
			host[i] = float32(rng.NormFloat64()*2 + 0.5)
		}
		x := tensor.FromFloat32(b, nil, host, total)
		y, yp := tensor.Empty(b, nil, total), tensor.Empty(b, nil, total)
		sMean, sInv, pMean, pInv := tensor.Empty(b, nil, c), tensor.Empty(b, nil, c), tensor.Empty(b, nil, c), tensor.Empty(b, nil, c)
		rm, rv, w, bias := tensor.Zeros(b, nil, c), tensor.Full(b, nil, 1, c), tensor.Full(b, nil, 1, c), tensor.Zeros(b, nil, c)
		stamps := tensor.Zeros(b, nil, 2*8*c)
		f := func(v *tensor.Tensor) uintptr { return b.f32("probe", v.Buffer()) }
		report := func(what string, us float64) {
			fmt.Printf("bnprobe %v %-44s %8.2f us %7.0f GB/s\n", shape, what, us, 8*float64(total)/us/1e3)
		}
		time1 := func(launch func()) float64 {
			us, _, err := timeCalls(b, launch)
			if err != nil {
				t.Fatal(err)
			}
			return us
		}
		report("Copy of its size", time1(func() { b.Copy(yp.Buffer(), x.Buffer()) }))
		for _, v := range []struct {
			what                string
			split, any, noClust bool
			cluster             int
		}{{"as built", false, false, false, 0}, {"split", true, false, false, 0}, {"one pass", false, true, true, 0},
			{"clusters of 2", false, true, false, 2}, {"clusters of 4", false, true, false, 4}, {"clusters of 8", false, true, false, 8}} {
			b.opt.NoBatchNormOnePass, b.bnOne.anyChannels, b.noClusters, b.bnOne.cluster = v.split, v.any, v.noClust, v.cluster
			_, _, _, _, _, clustered := b.bnCluster(n, c, inner)
			_, threads, _, onePass := b.bnOnePass(n, c, inner)
			path := "split"
			switch {
			case clustered:
				path = "cluster"
			case onePass:
				path = fmt.Sprintf("one pass x%d", threads)
			}
			if (v.cluster > 0 && !clustered) || (v.any && v.cluster == 0 && !onePass) {
				continue
			}
			out, outMean, outInv := yp, pMean, pInv
			if v.what == "as built" {
				out, outMean, outInv = y, sMean, sInv
			}
			report(v.what+" ("+path+")", time1(func() {
				b.BatchNorm(out.Buffer(), outMean.Buffer(), outInv.Buffer(), rm.Buffer(), rv.Buffer(), x.Buffer(), w.Buffer(), bias.Buffer(), n, c, inner, true, 0.1, eps)
			}))
			if v.what != "as built" {
				compareProbe(t, b, v.what, y, yp, sMean, pMean, sInv, pInv)
			}
		}
		b.opt.NoBatchNormOnePass, b.bnOne.anyChannels, b.noClusters, b.bnOne.cluster = false, false, false, 0
		if shared := 4 * n * inner; shared <= probeShared {
			launch := func(st uintptr) {
				devCheck("probe", timed.Launch(driver.Dim3{X: c, Y: 1, Z: 1}, driver.Dim3{X: 512, Y: 1, Z: 1}, shared, b.stream,
					st, f(yp), f(pMean), f(pInv), f(x), int32(n), int32(c), int32(inner), float32(eps)))
			}
			report("one pass x512, time stamps", time1(func() { launch(0) }))
			launch(f(stamps))
			bnTimeline(b, stamps, fmt.Sprintf("bnprobe %v one pass", shape), c, 4)
			compareProbe(t, b, "one pass x512, time stamps", y, yp, sMean, pMean, sInv, pInv)
		}
		for _, v := range []*tensor.Tensor{x, y, yp, sMean, sInv, pMean, pInv, rm, rv, w, bias, stamps} {
			v.Release()
		}
	}
}

// bnTimeline prints, for each phase k of the blocks' time stamps (block
// b's k-th at 8b + k, in ns), when the first, the median and the last
// block ended it, in µs after the first block's start.
func bnTimeline(b *Backend, stamps *tensor.Tensor, what string, blocks, phases int) {
	got := make([]float32, stamps.Len())
	b.Download(got, stamps.Buffer())
	st := make([]uint64, len(got)/2)
	for i := range st {
		st[i] = uint64(math.Float32bits(got[2*i])) | uint64(math.Float32bits(got[2*i+1]))<<32
	}
	t0 := uint64(math.MaxUint64)
	for bl := range blocks {
		t0 = min(t0, st[bl*8])
	}
	line := what + " timeline (µs; first/median/last block):"
	for k := 1; k < phases; k++ {
		at := make([]float64, blocks)
		for bl := range blocks {
			at[bl] = float64(st[bl*8+k]-t0) / 1e3
		}
		slices.Sort(at)
		line += fmt.Sprintf(" [%d] %.2f/%.2f/%.2f", k, at[0], at[blocks/2], at[blocks-1])
	}
	fmt.Println(line)
}

// compareProbe checks the probe's y and statistics against the built
// kernel's within 1e-5 of each value's magnitude (plus 1e-6).
func compareProbe(t *testing.T, b *Backend, what string, pairs ...*tensor.Tensor) {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		want, got := make([]float32, pairs[i].Len()), make([]float32, pairs[i+1].Len())
		b.Download(want, pairs[i].Buffer())
		b.Download(got, pairs[i+1].Buffer())
		worst := 0.0
		for j := range want {
			d := math.Abs(float64(got[j]-want[j])) / (1e-6 + 1e-5*math.Abs(float64(want[j])))
			worst = max(worst, d)
		}
		if worst > 1 {
			t.Errorf("%s: output %d differs from the built kernel's by %.3g of the tolerance", what, i/2, worst)
		}
	}
}
