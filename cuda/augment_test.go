package cuda

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TestRecordedAugmentGather runs tensor.AugmentGather on the recorder for
// grey and colour images and odd sizes: every launch is checked against the
// kernel's signature and the allocated memory, each batch is one launch of
// ember_augment_gather (ember_augment_gather_state with the seed and offset
// on the device) and nothing is copied (a batch needs no host work).
func TestRecordedAugmentGather(t *testing.T) {
	b, rec := newRecordingBackend(t)
	for _, c := range []struct{ n, ch, h, w, batch, pad, cutout int }{
		{100, 1, 28, 28, 64, 2, 0}, {50, 3, 32, 32, 7, 4, 8}, {5, 2, 5, 7, 300, 1, 3}, {3, 1, 1, 1, 1, 0, 0},
	} {
		s := tensor.NewScope()
		images := tensor.FromUint8(b, s, make([]uint8, c.n*c.ch*c.h*c.w), c.n, c.ch, c.h, c.w)
		idx := tensor.FromInt32(b, s, make([]int32, c.batch), c.batch)
		mean, std := make([]float32, c.ch), make([]float32, c.ch)
		for i := range std {
			mean[i], std[i] = 0.5, 0.25
		}
		norm := tensor.AugmentNorm(b, s, mean, std)
		rec.reset()
		x := tensor.AugmentGather(s, images, idx, norm, tensor.AugmentSpec{Pad: c.pad, FlipProb: 0.5, Cutout: c.cutout, Seed: 7, Offset: 1 << 40})
		if got, want := x.Shape(), []int{c.batch, c.ch, c.h, c.w}; !equalInts(got, want) {
			t.Errorf("%+v: shape %v, want %v", c, got, want)
		}
		if rec.launches["ember_augment_gather"] != 1 || rec.kernelLaunches() != 1 {
			t.Errorf("%+v: launches %v, want one of ember_augment_gather", c, rec.launches)
		}
		if rec.copies != 0 {
			t.Errorf("%+v: %d copies, want none", c, rec.copies)
		}
		state := tensor.NewAugmentState(b, s, 7, 1<<40)
		rec.reset()
		tensor.AugmentGatherAt(s, images, idx, norm, state, tensor.AugmentSpec{Pad: c.pad, FlipProb: 0.5, Cutout: c.cutout})
		if rec.launches["ember_augment_gather_state"] != 1 || rec.kernelLaunches() != 1 || rec.copies != 0 {
			t.Errorf("%+v, state: launches %v and %d copies, want one of ember_augment_gather_state and none", c, rec.launches, rec.copies)
		}
		s.Release()
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestGPUAugmentGatherMatchesCPU compares the GPU's augmented batches with
// the CPU backend's, bit for bit, on fresh random images of Fashion-MNIST's
// and CIFAR's shapes with every augmentation on (the conformance suite
// checks both against an independent reference; this checks the two
// against each other on larger batches).
func TestGPUAugmentGatherMatchesCPU(t *testing.T) {
	g := newGPUBackend(t, BackendOptions{})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	for _, c := range []struct{ n, ch, h, w, batch, pad, cutout int }{
		{2000, 1, 28, 28, 512, 2, 0}, {1000, 3, 32, 32, 256, 4, 8}, {64, 2, 9, 13, 1000, 3, 5},
	} {
		seed, offset := rng.Uint64(), rng.Uint64()>>1
		pix := make([]uint8, c.n*c.ch*c.h*c.w)
		for i := range pix {
			pix[i] = uint8(rng.IntN(256))
		}
		idx := make([]int32, c.batch)
		for i := range idx {
			idx[i] = int32(rng.IntN(c.n))
		}
		mean, std := make([]float32, c.ch), make([]float32, c.ch)
		for i := range mean {
			mean[i], std[i] = rng.Float32(), 0.1+rng.Float32()
		}
		spec := tensor.AugmentSpec{Pad: c.pad, Fill: uint8(rng.IntN(256)), FlipProb: 0.5, Cutout: c.cutout, Seed: seed, Offset: offset}
		batch := func(b tensor.Backend) []float32 {
			s := tensor.NewScope()
			defer s.Release()
			x := tensor.AugmentGather(s, tensor.FromUint8(b, s, pix, c.n, c.ch, c.h, c.w), tensor.FromInt32(b, s, idx, c.batch),
				tensor.AugmentNorm(b, s, mean, std), spec)
			return x.Float32s()
		}
		got, want := batch(g), batch(tensor.CPU)
		if !sameBits(got, want) {
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("%+v seed %d offset %d: element %d: GPU %g, CPU %g", c, seed, offset, i, got[i], want[i])
					break
				}
			}
		}
	}
}

// TestGPUAugmentGatherCaptured captures AugmentGatherAt in a CUDA graph
// and replays it after writing each epoch's offset into the state: every
// replay equals the CPU's AugmentGather at that epoch, bit for bit, so a
// captured training step augments afresh each epoch.
func TestGPUAugmentGatherCaptured(t *testing.T) {
	g := newGPUBackend(t, BackendOptions{})
	const n, batch = 300, 128
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))
	pix := make([]uint8, n*3*12*10)
	for i := range pix {
		pix[i] = uint8(rng.IntN(256))
	}
	idx := make([]int32, batch)
	for i := range idx {
		idx[i] = int32(rng.IntN(n))
	}
	mean, std := []float32{0.4, 0.5, 0.6}, []float32{0.2, 0.25, 0.3}
	spec := tensor.AugmentSpec{Pad: 3, FlipProb: 0.5, Cutout: 4, Seed: rng.Uint64()}
	s := tensor.NewScope()
	defer s.Release()
	images, ix := tensor.FromUint8(g, s, pix, n, 3, 12, 10), tensor.FromInt32(g, s, idx, batch)
	norm, state := tensor.AugmentNorm(g, s, mean, std), tensor.NewAugmentState(g, s, spec.Seed, 0)
	out := tensor.Empty(g, s, batch, 3, 12, 10)
	full := spec
	full.C, full.H, full.W = 3, 12, 10
	graph, err := g.Capture(func() {
		g.AugmentGatherAt(out.Buffer(), images.Buffer(), ix.Buffer(), norm.Buffer(), state.Buffer(), full)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	cs := tensor.NewScope()
	defer cs.Release()
	cImages, cIdx, cNorm := tensor.FromUint8(tensor.CPU, cs, pix, n, 3, 12, 10), tensor.FromInt32(tensor.CPU, cs, idx, batch), tensor.AugmentNorm(tensor.CPU, cs, mean, std)
	for epoch := range 3 {
		spec.Offset = tensor.AugmentOffset(epoch, n)
		tensor.SetAugmentState(state, spec.Seed, spec.Offset)
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		got, want := out.Float32s(), tensor.AugmentGather(cs, cImages, cIdx, cNorm, spec).Float32s()
		if !sameBits(got, want) {
			t.Errorf("epoch %d: the replayed gather differs from the CPU's", epoch)
		}
	}
}

// BenchmarkGPUAugmentGatherResNet9 times the augmented gather of ResNet-9's
// Fashion-MNIST input (60000 images 1x28x28 on the device, batches of 512,
// crop padding 2, flip 0.5), reporting the time of one batch and of the
// gathers of a whole epoch (118 batches), for comparison with an epoch's
// training time.
func BenchmarkGPUAugmentGatherResNet9(bm *testing.B) {
	g := newGPUBackend(bm, BackendOptions{})
	const n, batch = 60000, 512
	rng := rand.New(rand.NewPCG(1, 2))
	pix := make([]uint8, n*28*28)
	for i := range pix {
		pix[i] = uint8(rng.IntN(256))
	}
	s := tensor.NewScope()
	defer s.Release()
	images := tensor.FromUint8(g, s, pix, n, 1, 28, 28)
	norm := tensor.AugmentNorm(g, s, []float32{0.2860}, []float32{0.3530})
	perm := rng.Perm(n)
	idx := make([]int32, batch)
	for i := range idx {
		idx[i] = int32(perm[i])
	}
	ix := tensor.FromInt32(g, s, idx, batch)
	out := tensor.Empty(g, s, batch, 1, 28, 28)
	spec := tensor.AugmentSpec{C: 1, H: 28, W: 28, Pad: 2, FlipProb: 0.5, Seed: 1}
	run := func(i int) {
		spec.Offset = tensor.AugmentOffset(i, n)
		g.AugmentGather(out.Buffer(), images.Buffer(), ix.Buffer(), norm.Buffer(), spec)
	}
	run(0)
	if err := g.Synchronize(); err != nil {
		bm.Fatal(err)
	}
	bm.ResetTimer()
	start := time.Now()
	for i := 0; i < bm.N; i++ {
		run(i)
	}
	if err := g.Synchronize(); err != nil {
		bm.Fatal(err)
	}
	per := time.Since(start) / time.Duration(bm.N)
	bm.ReportMetric(float64(per.Nanoseconds())/1e3, "us/batch")
	bm.ReportMetric(float64(per.Nanoseconds())*float64((n+batch-1)/batch)/1e6, "ms/epoch")
}
