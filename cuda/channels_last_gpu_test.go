package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// TestGPUChannelsLastMatchesCPU: every method of the backend's
// tensor.ChannelsLastBackend against the CPU's on fresh random inputs
// (tensortest.RunChannelsLast states the bounds).
func TestGPUChannelsLastMatchesCPU(t *testing.T) {
	tensortest.RunChannelsLast(t, newGPUBackend(t, BackendOptions{}))
}

// TestGPUConvChannelsLastBench prints µs per forward, data-gradient and
// filter-gradient pass of channels-last bfloat16 convolutions through
// cuDNN (EMBER_CL_CONV_BENCH=1; -v to see it), with the algorithms the
// search chose. Its geometries are airbench's, and its first layer's
// with the input's channels padded from 24 to 32.
func TestGPUConvChannelsLastBench(t *testing.T) {
	if os.Getenv("EMBER_CL_CONV_BENCH") != "1" {
		t.Skip("set EMBER_CL_CONV_BENCH=1 to time the channels-last convolutions")
	}
	b := newGPUBackend(t, BackendOptions{})
	const warm, iters = 3, 20
	rng := rand.New(rand.NewPCG(7, 8))
	geoms := []tensor.ConvGeom{
		{N: 1024, C: 24, H: 31, W: 31, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1024, C: 32, H: 31, W: 31, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1024, C: 64, H: 15, W: 15, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1024, C: 64, H: 15, W: 15, K: 256, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1024, C: 256, H: 7, W: 7, K: 256, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 1024, C: 256, H: 3, W: 3, K: 256, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	}
	t.Logf("%-22s %10s %10s %10s", "geometry", "fwd µs", "dx µs", "dw µs")
	for _, g := range geoms {
		c := convShapeOf("bench", g)
		bf := func(n int) tensor.Buffer {
			f := gpuBuf(t, b, randFloats(rng, n))
			h, err := b.Alloc(n, tensor.BFloat16)
			gpuCheck(t, err)
			b.ToChannelsLast(h, f, 1, n, 1)
			b.Free(f)
			return h
		}
		x, dy, y, dx := bf(c.xLen), bf(c.yLen), bf(c.yLen), bf(c.xLen)
		w, dw := gpuBuf(t, b, randFloats(rng, c.wLen)), gpuBuf(t, b, randFloats(rng, c.wLen))
		timeIt := func(f func()) float64 { return wallMicros(t, b, warm, iters, f) }
		fwd := timeIt(func() { b.Conv2dChannelsLast(y, x, w, tensor.Buffer{}, g) })
		bdx := timeIt(func() { b.Conv2dBackwardChannelsLast(dx, tensor.Buffer{}, tensor.Buffer{}, dy, x, w, g) })
		bdw := timeIt(func() { b.Conv2dBackwardChannelsLast(tensor.Buffer{}, dw, tensor.Buffer{}, dy, x, w, g) })
		t.Logf("%-22s %10.1f %10.1f %10.1f", fmt.Sprintf("%dx%d %d->%d", g.H, g.W, g.C, g.K), fwd, bdx, bdw)
		if dg, ok := b.lowpGeom(c); ok {
			t.Logf("    %s", b.dnn.describe(dg))
		}
		for _, buf := range []tensor.Buffer{x, dy, y, dx, w, dw} {
			b.Free(buf)
		}
	}
}

// clFlat is a channels-last buffer of n elements holding v rounded to
// bfloat16 (nil: uninitialised).
func clFlat(t *testing.T, b *Backend, n int, v []float32) tensor.Buffer {
	h, err := b.Alloc(n, tensor.BFloat16)
	gpuCheck(t, err)
	t.Cleanup(func() { b.Free(h) })
	if v != nil {
		b.ToChannelsLast(h, gpuBuf(t, b, v), 1, n, 1)
	}
	return h
}

// sameWithinRounding compares two ways' bfloat16 outputs a and b (n
// elements each): within one bfloat16 step of a, and 2e-4 more for sums
// near zero, where orders of float32 additions differ by roundings. It
// logs how many differ by more and reports the first few.
func sameWithinRounding(t *testing.T, b *Backend, what string, x, y tensor.Buffer, n int) {
	widen := func(h tensor.Buffer) []float32 {
		f := gpuBuf(t, b, make([]float32, n))
		b.FromChannelsLast(f, h, 1, n, 1, false)
		return download(b, f)
	}
	want, got := widen(x), widen(y)
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > math.Abs(float64(want[i]))/128+2e-4 {
			if bad++; bad <= 5 {
				t.Errorf("%s: element %d = %g, %g the other way", what, i, got[i], want[i])
			}
		}
	}
	t.Logf("%s: %d of %d elements differ by more than a bfloat16 step", what, bad, n)
}

// TestGPUConvForwardPaddedMatches: cuDNN's forward pass on x and the
// filter padded with zero channels to a multiple of 32 gives the unpadded
// pass's outputs within a bfloat16 rounding (both sum the same bfloat16
// products in float32, perhaps in another order, then round).
func TestGPUConvForwardPaddedMatches(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if b.dnn == nil {
		t.Skip("no cuDNN")
	}
	const op = "test"
	rng := rand.New(rand.NewPCG(9, 10))
	for _, g := range []tensor.ConvGeom{
		{N: 4, C: 24, H: 31, W: 31, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 3, C: 40, H: 19, W: 21, K: 32, R: 3, S: 2, StrideH: 2, StrideW: 1, PadH: 1, PadW: 0},
	} {
		c := convShapeOf(op, g)
		dg, ok := b.lowpGeom(c)
		if !ok || !dg.nhwc {
			t.Fatalf("%+v: not a channels-last cuDNN geometry", g)
		}
		x, y1, y2 := clFlat(t, b, c.xLen, randFloats(rng, c.xLen)), clFlat(t, b, c.yLen, nil), clFlat(t, b, c.yLen, nil)
		w := gpuBuf(t, b, randFloats(rng, c.wLen))
		px, py1, py2 := b.clPtr(op, "x", x, c.xLen), b.clPtr(op, "y", y1, c.yLen), b.clPtr(op, "y", y2, c.yLen)
		s := b.dnn
		s.mu.Lock()
		wh, done := b.filterCast(op, b.f32(op, w), 0, c)
		p := s.plan(dg)
		a, ok := b.algoFor(op, p, dirForward, px, wh, py1, 0)
		if !ok {
			t.Fatalf("%+v: no forward algorithm", g)
		}
		b.runDNN(op, p, dirForward, a, px, wh, 0, py1)
		pg := dg
		pg.c = padChannelsTo(g.C)
		pp := s.plan(pg)
		xp, wp, padDone, ok := b.paddedBuffers(op, px, wh, c, pg.c)
		if !ok {
			t.Fatalf("%+v: no room for the padded copies", g)
		}
		pa, ok := b.algoFor(op, pp, dirForward, xp, wp, py2, 0)
		padDone()
		if !ok {
			t.Fatalf("%+v: no forward algorithm at %d channels", g, pg.c)
		}
		if !b.forwardPadded(op, pp, pa, py2, px, wh, c) {
			t.Fatalf("%+v: the padded pass found no room", g)
		}
		done()
		s.mu.Unlock()
		sameWithinRounding(t, b, fmt.Sprintf("%dx%d %d->%d padded to %d", g.H, g.W, g.C, g.K, pg.c), y1, y2, c.yLen)
	}
}

// TestGPUConvDataGradAsForwardMatches: the data gradient as a forward pass
// of the transposed geometry (the flipped filter) gives cuDNN's data
// gradient within a bfloat16 rounding.
func TestGPUConvDataGradAsForwardMatches(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if b.dnn == nil {
		t.Skip("no cuDNN")
	}
	const op = "test"
	rng := rand.New(rand.NewPCG(11, 12))
	for _, g := range []tensor.ConvGeom{
		{N: 4, C: 24, H: 31, W: 31, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 8, C: 64, H: 15, W: 15, K: 256, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 3, C: 16, H: 9, W: 11, K: 32, R: 3, S: 2, StrideH: 1, StrideW: 1, PadH: 1, PadW: 0},
	} {
		c := convShapeOf(op, g)
		dg, ok := b.lowpGeom(c)
		tg, tok := transposedGeom(dg)
		if !ok || !tok {
			t.Fatalf("%+v: no transposed channels-last cuDNN geometry", g)
		}
		dy, dx1, dx2 := clFlat(t, b, c.yLen, randFloats(rng, c.yLen)), clFlat(t, b, c.xLen, nil), clFlat(t, b, c.xLen, nil)
		w := gpuBuf(t, b, randFloats(rng, c.wLen))
		pw, pdy, pdx1, pdx2 := b.f32(op, w), b.clPtr(op, "dy", dy, c.yLen), b.clPtr(op, "dx", dx1, c.xLen), b.clPtr(op, "dx", dx2, c.xLen)
		s := b.dnn
		s.mu.Lock()
		wh, done := b.filterCast(op, pw, 0, c)
		p := s.plan(dg)
		a, ok := b.algoFor(op, p, dirBackwardData, wh, pdy, pdx1, 0)
		if !ok {
			t.Fatalf("%+v: no data-gradient algorithm", g)
		}
		b.runDNN(op, p, dirBackwardData, a, wh, pdy, 0, pdx1)
		tp := s.plan(tg)
		wt, flipDone := b.flippedFilter(op, pw, c)
		ta, ok := b.algoFor(op, tp, dirForward, pdy, wt, pdx2, 0)
		flipDone()
		if !ok {
			t.Fatalf("%+v: no forward algorithm of the transposed geometry", g)
		}
		b.dataGradForward(op, tp, ta, pw, pdy, pdx2, c)
		done()
		s.mu.Unlock()
		sameWithinRounding(t, b, fmt.Sprintf("%dx%d %d->%d dx as a forward pass", g.H, g.W, g.C, g.K), dx1, dx2, c.xLen)
	}
}
