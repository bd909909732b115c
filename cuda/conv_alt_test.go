package cuda

import (
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TestCuDNNAlternativeWays: a channels-last convolution times another way
// of a direction on its first call (the forward pass on 24 input channels
// padded to 32; the data gradient as a forward pass of the transposed
// geometry) against the direction's own, and each later call takes the
// faster; inside a capture an undecided plan runs its own way and stays
// undecided.
func TestCuDNNAlternativeWays(t *testing.T) {
	g := tensor.ConvGeom{N: 2, C: 24, H: 31, W: 31, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	c := convShapeOf("test", g)
	for _, w := range []struct {
		name    string
		kernel  string                // the alternative's own kernel, launched twice a call for padding
		kernels int                   // launches of it a call
		altC    int                   // the alternative plan's input channels
		own     string                // the cuDNN function of the direction's own way
		state   func(p *convPlan) int // the plan's decision
		call    func(b *Backend, x, y, w tensor.Buffer)
	}{
		{"padded forward", "ember_cl_pad_channels", 2, 32, "fwd", func(p *convPlan) int { return p.padForward },
			func(b *Backend, x, y, w tensor.Buffer) { b.Conv2dChannelsLast(y, x, w, tensor.Buffer{}, g) }},
		{"data gradient as a forward pass", "ember_cl_filter_flip_bf16", 1, 64, "bwd", func(p *convPlan) int { return p.dxForward },
			func(b *Backend, dx, dy, w tensor.Buffer) {
				b.Conv2dBackwardChannelsLast(dx, tensor.Buffer{}, tensor.Buffer{}, dy, tensor.Buffer{}, w, g)
			}},
	} {
		for _, altFirst := range []bool{true, false} {
			b, rec, f := fakeBackend(t, false)
			timed := 0
			b.dnn.clock = func(warm, run func() error) (time.Duration, error) {
				if err := warm(); err != nil {
					return 0, err
				}
				if err := run(); err != nil {
					return 0, err
				}
				timed++
				if timed == 2 && altFirst { // the own way is timed first
					return time.Millisecond, nil
				}
				return 2 * time.Millisecond, nil
			}
			bf := func(n int) tensor.Buffer {
				buf, err := b.Alloc(n, tensor.BFloat16)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Free(buf) })
				return buf
			}
			x, y, wt := bf(c.xLen), bf(c.yLen), recBuf(t, b, c.wLen)
			plans := func() (own, alt *convPlan) {
				for geom, p := range b.dnn.plans {
					switch {
					case geom.c == g.C && geom.k == g.K:
						own = p
					case geom.c == w.altC:
						alt = p
					}
				}
				return own, alt
			}
			launched := func() int { return rec.launches[w.kernel] }

			b.capturing.Store(true)
			w.call(b, x, y, wt)
			b.capturing.Store(false)
			own, _ := plans()
			if own == nil || w.state(own) != altUndecided || launched() != 0 || timed != 0 {
				t.Fatalf("%s inside a capture: plan %v, %d launches of %s, %d timings; want an undecided plan, none and none",
					w.name, own, launched(), w.kernel, timed)
			}
			own.found = [dirCount]bool{} // searched as outside a capture

			w.call(b, x, y, wt)
			own, alt := plans()
			if timed != 2 || alt == nil {
				t.Fatalf("%s, first call: %d timings and plan %v; want 2 and a plan of %d input channels", w.name, timed, alt, w.altC)
			}
			want, wantDesc, wantKernels := altSlower, own.descs.x, 0
			if altFirst {
				want, wantDesc, wantKernels = altFaster, alt.descs.x, w.kernels
			}
			if w.state(own) != want {
				t.Errorf("%s, alternative faster %v: the plan says %d, want %d", w.name, altFirst, w.state(own), want)
			}
			before, owns := launched(), f.count(w.own)
			w.call(b, x, y, wt)
			if got := launched() - before; got != wantKernels {
				t.Errorf("%s, alternative faster %v: a later call launched %s %d times, want %d", w.name, altFirst, w.kernel, got, wantKernels)
			}
			if altFirst {
				if w.own != "fwd" && f.count(w.own) != owns {
					t.Errorf("%s: a later call ran cuDNN's %s, not the faster way", w.name, w.own)
				}
				if got := f.last("fwd").args[2]; got != wantDesc {
					t.Errorf("%s: the forward pass read its input through descriptor %#x, want %#x", w.name, got, wantDesc)
				}
			} else if got := f.last(w.own).args[2]; w.own == "fwd" && got != wantDesc {
				t.Errorf("%s: the forward pass read x through descriptor %#x, want %#x", w.name, got, wantDesc)
			}
			if timed != 2 {
				t.Errorf("%s: a later call timed again (%d timings)", w.name, timed)
			}
		}
	}
}

func TestPadChannelsTo(t *testing.T) {
	for c, want := range map[int]int{24: 32, 32: 32, 8: 32, 40: 64, 64: 64, 3: 3, 12: 12, 96: 96, 104: 128} {
		if got := padChannelsTo(c); got != want {
			t.Errorf("padChannelsTo(%d) = %d, want %d", c, got, want)
		}
	}
}

func TestTransposedGeom(t *testing.T) {
	dg := convDescGeom{n: 2, c: 24, h: 31, w: 29, k: 64, r: 3, s: 2, strideH: 1, strideW: 1, padH: 1, padW: 0,
		dilH: 1, dilW: 1, groups: 1, oh: 31, ow: 28, dtype: cudnnDataBFloat16, nhwc: true}
	tg, ok := transposedGeom(dg)
	want := convDescGeom{n: 2, c: 64, h: 31, w: 28, k: 24, r: 3, s: 2, strideH: 1, strideW: 1, padH: 1, padW: 1,
		dilH: 1, dilW: 1, groups: 1, oh: 31, ow: 29, dtype: cudnnDataBFloat16, nhwc: true}
	if !ok || tg != want {
		t.Errorf("transposedGeom = %+v, %v; want %+v", tg, ok, want)
	}
	// The transposed pass's output is the input's size: OH + 2·pad' - R + 1 = H.
	if tg.h+2*tg.padH-tg.r+1 != dg.h || tg.w+2*tg.padW-tg.s+1 != dg.w {
		t.Errorf("the transposed pass of %+v does not give x's size", dg)
	}
	for _, bad := range []func(*convDescGeom){
		func(g *convDescGeom) { g.strideH = 2 },
		func(g *convDescGeom) { g.dilW = 2 },
		func(g *convDescGeom) { g.groups = 2 },
		func(g *convDescGeom) { g.padH = 3 },
		func(g *convDescGeom) { g.nhwc = false },
	} {
		g := dg
		bad(&g)
		if _, ok := transposedGeom(g); ok {
			t.Errorf("transposedGeom(%+v) took a geometry it cannot transpose", g)
		}
	}
}
