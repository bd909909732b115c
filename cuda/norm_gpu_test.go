package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn/nntest"
	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// GPU tests of batch norm's two training paths and of batch norm with its
// activation; skipped without a GPU.

// newOnePassBackend is a backend that normalises in one launch wherever a
// channel fits in shared memory, whatever the number of channels (by
// default only from as many channels as SMs: the conformance cases have
// fewer, and take the split path).
func newOnePassBackend(t *testing.T) *Backend {
	b := newGPUBackend(t, BackendOptions{})
	b.bnOne.anyChannels = true
	if _, _, _, ok := b.bnOnePass(64, 3, 49); !ok {
		t.Fatalf("the one-pass batch norm is not available on %s (shared memory per block: %d bytes)", b.Name(), b.bnOne.bytes)
	}
	return b
}

// TestGPUBackendConformanceBNOnePass runs the conformance suite (its
// BatchNorm and BatchNormAct cases are the point) with the one-pass batch
// norm for any number of channels, in each of its forms (threads x loads
// in flight per thread).
func TestGPUBackendConformanceBNOnePass(t *testing.T) {
	for _, v := range [][2]int{{0, 8}, {512, 16}, {1024, 16}} {
		t.Run(fmt.Sprintf("%dx%d", v[0], v[1]), func(t *testing.T) {
			b := newOnePassBackend(t)
			b.bnOne.threads, b.bnOne.unroll = v[0], v[1]
			tensortest.RunBackend(t, b)
		})
	}
}

// TestGPUBatchNormOnePassShapes: the one-pass path takes the channels
// that fit in one block, when there are at least 16 of them (ResNet-9's
// 7x7 and airbench's 3x3 planes, and fewer channels than SMs); of those,
// the ones that would take one block an SM with as many channels as SMs
// go to the cluster path ([1024,256,7,7]: clusters of 8), and so do
// channels of 64 KiB or more when there are fewer than two thirds of the
// SMs' worth ([512,64,8,8]: 8 blocks a channel; [256,32,8,8]: 4); the rest
// the split path. The cluster sizes assume an H200's 132 SMs.
func TestGPUBatchNormOnePassShapes(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	_, _, _, _, _, clusters := b.bnCluster(1024, 256, 49) // none before sm_90
	for _, c := range []struct {
		n, c, inner int
		want        bool
		cluster     int
	}{
		{512, 256, 49, true, 0}, {1024, 256, 49, true, 8}, {512, 512, 9, true, 0}, {1024, 256, 9, true, 0},
		{512, 128, 196, false, 0}, {512, 64, 784, false, 0}, {64, 3, 49, false, 0}, {64, 8, 49, false, 0},
		{512, 128, 49, true, 0}, {1024, 96, 49, true, 0}, {128, 64, 64, true, 0}, {256, 64, 196, true, 8},
		{512, 64, 64, true, 8}, {256, 32, 64, true, 4}, {512, 16, 64, true, 8},
	} {
		want := c.cluster
		if !clusters {
			want = 0
		}
		if _, _, k, _, _, ok := b.bnCluster(c.n, c.c, c.inner); (ok != (want > 0) || k != want) && (!clusters || b.dev.MultiprocessorCount() == 132) {
			t.Errorf("[%d, %d, %d]: clusters of %d (%v), want %d", c.n, c.c, c.inner, k, ok, want)
		}
		_, threads, shared, ok := b.bnOnePass(c.n, c.c, c.inner)
		t.Logf("[%d, %d, %d]: one pass %v (%d threads, %d bytes of %d)", c.n, c.c, c.inner, ok, threads, shared, b.bnOne.bytes)
		if ok != c.want {
			t.Errorf("[%d, %d, %d]: one pass %v, want %v", c.n, c.c, c.inner, ok, c.want)
		}
	}
}

// TestGPUBatchNormFusion: batch norm with its activation, fused against
// the layers one by one, bit for bit, on both training paths, in float32
// and under bfloat16 autocast.
func TestGPUBatchNormFusion(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		nntest.RunBatchNormFusion(t, newGPUBackend(t, BackendOptions{NoBatchNormOnePass: true}))
	})
	t.Run("one pass", func(t *testing.T) { nntest.RunBatchNormFusion(t, newOnePassBackend(t)) })
	t.Run("cluster", func(t *testing.T) { nntest.RunBatchNormFusion(t, newClusterBackend(t, 4, 0)) })
}

// newClusterBackend is a backend whose training batch norm takes the
// cluster kernel with k blocks a channel of threads threads for every
// channel that fits (0, 0: bnCluster's own choice); it skips where the
// device has no thread block clusters.
func newClusterBackend(t *testing.T, k, threads int) *Backend {
	b := newGPUBackend(t, BackendOptions{})
	b.bnOne.cluster, b.bnOne.clusterThreads = k, threads
	n, c, inner := 1024, 256, 49 // a shape bnCluster takes by itself
	if k > 0 {
		n, c, inner = 64, 3, 49
	}
	if _, _, _, _, _, ok := b.bnCluster(n, c, inner); !ok {
		t.Skipf("no cluster batch norm on %s", b.Name())
	}
	return b
}

// TestGPUBackendConformanceBNCluster runs the conformance suite (its
// BatchNorm and BatchNormAct cases are the point) with the cluster batch
// norm for every channel, at each cluster size, so that tiny channels
// leave some blocks of a cluster with nothing to hold.
func TestGPUBackendConformanceBNCluster(t *testing.T) {
	for _, v := range [][2]int{{2, 256}, {4, 512}, {8, 256}} {
		t.Run(fmt.Sprintf("%dx%d", v[0], v[1]), func(t *testing.T) {
			tensortest.RunBackend(t, newClusterBackend(t, v[0], v[1]))
		})
	}
}

// TestGPUBatchNormClusterMatchesCPU: the cluster batch norm's output,
// statistics and running statistics against the CPU's (float64 sums) on
// fresh random inputs, at the shapes it is chosen for and at forced
// cluster sizes with odd rows (batchNormAgainstCPU).
func TestGPUBatchNormClusterMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
	for _, c := range []struct{ n, c, inner, k int }{
		{1024, 256, 49, 0}, {512, 256, 49, 4}, {100, 40, 60, 2}, {300, 40, 143, 8}, {7, 3, 5, 8},
		{512, 64, 64, 0}, {256, 32, 64, 0}, // fewer channels than SMs: bnCluster's choice
	} {
		g := newClusterBackend(t, c.k, 0)
		_, _, k, threads, shared, ok := g.bnCluster(c.n, c.c, c.inner)
		if !ok {
			t.Fatalf("[%d, %d, %d]: not the cluster path", c.n, c.c, c.inner)
		}
		batchNormAgainstCPU(t, g, rng, fmt.Sprintf("K=%d", k), c.n, c.c, c.inner, 0, 0)
		t.Logf("[%d, %d, %d]: clusters of %d blocks of %d threads, %d bytes each", c.n, c.c, c.inner, k, threads, shared)
	}
}

// TestGPUBatchNormOnePassMatchesCPU: the one-pass batch norm against the
// CPU as above, at the shapes it is chosen for, at rows of 1 to 7 floats
// (one float4 holds several rows), at tensors whose length is no multiple
// of 4 (the last float4 runs past the end), and with x and y views that
// start off a 16-byte boundary (the single-float loads and stores).
func TestGPUBatchNormOnePassMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 9))
	g := newOnePassBackend(t)
	for _, c := range []struct{ n, c, inner, xOff, yOff int }{
		{512, 256, 49, 0, 0}, {512, 512, 9, 0, 0}, {1024, 256, 9, 0, 0}, {512, 128, 49, 0, 0},
		{37, 11, 1, 0, 0}, {33, 5, 3, 0, 0}, {64, 3, 7, 0, 0}, {9, 7, 5, 0, 0}, {21, 6, 49, 0, 0},
		{50, 13, 49, 1, 0}, {50, 13, 49, 0, 3}, {31, 9, 6, 2, 1},
	} {
		if _, _, _, ok := g.bnOnePass(c.n, c.c, c.inner); !ok {
			t.Fatalf("[%d, %d, %d]: not the one-pass path", c.n, c.c, c.inner)
		}
		batchNormAgainstCPU(t, g, rng, fmt.Sprintf("x+%d y+%d", c.xOff, c.yOff), c.n, c.c, c.inner, c.xOff, c.yOff)
	}
}

// batchNormAgainstCPU runs a training batch norm of [n, c, inner] on g and
// on the CPU on fresh random inputs (mean 0.3, deviation 1.5; random
// parameters and running statistics) with x and y views starting xOff and
// yOff floats into their buffers, and checks the output, statistics and
// running statistics within 2e-6 of each value's magnitude (at least 1):
// the float32 rounding of x̂·w + b and of the statistics.
func batchNormAgainstCPU(t *testing.T, g *Backend, rng *rand.Rand, what string, n, c, inner, xOff, yOff int) {
	t.Helper()
	m := n * inner
	x := make([]float32, m*c)
	for i := range x {
		x[i] = float32(rng.NormFloat64()*1.5 + 0.3)
	}
	w, bias, rm, rv := make([]float32, c), make([]float32, c), make([]float32, c), make([]float32, c)
	for i := range w {
		w[i], bias[i], rm[i], rv[i] = float32(rng.Float64()+0.5), float32(rng.NormFloat64()), float32(rng.NormFloat64()), float32(rng.Float64()+0.5)
	}
	run := func(be tensor.Backend) (y, mean, inv, runMean, runVar []float32) {
		up := func(v []float32) *tensor.Tensor { return tensor.FromFloat32(be, nil, v, len(v)) }
		tx := up(append(make([]float32, xOff), x...))
		tw, tb, trm, trv := up(w), up(bias), up(rm), up(rv)
		ty, tm, ti := tensor.Empty(be, nil, yOff+len(x)), tensor.Empty(be, nil, c), tensor.Empty(be, nil, c)
		be.(tensor.NormBackend).BatchNorm(ty.Buffer().Slice(yOff, len(x)), tm.Buffer(), ti.Buffer(), trm.Buffer(), trv.Buffer(),
			tx.Buffer().Slice(xOff, len(x)), tw.Buffer(), tb.Buffer(), n, c, inner, true, 0.1, 1e-5)
		y, mean, inv, runMean, runVar = ty.Float32s()[yOff:], tm.Float32s(), ti.Float32s(), trm.Float32s(), trv.Float32s()
		for _, v := range []*tensor.Tensor{tx, tw, tb, trm, trv, ty, tm, ti} {
			v.Release()
		}
		return
	}
	gy, gm, gi, grm, grv := run(g)
	cy, cm, ci, crm, crv := run(tensor.CPU)
	for _, p := range []struct {
		what      string
		got, want []float32
	}{{"y", gy, cy}, {"saveMean", gm, cm}, {"saveInvStd", gi, ci}, {"runMean", grm, crm}, {"runVar", grv, crv}} {
		bad := 0
		for i := range p.want {
			if d := math.Abs(float64(p.got[i] - p.want[i])); d > 2e-6*max(1, math.Abs(float64(p.want[i]))) || math.IsNaN(d) {
				if bad++; bad <= 3 {
					t.Errorf("[%d, %d, %d] %s: %s[%d] = %g, CPU %g", n, c, inner, what, p.what, i, p.got[i], p.want[i])
				}
			}
		}
	}
}
