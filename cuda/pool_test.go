package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestRecordedGeneralConvPool runs the general convolutions (dilation,
// groups, depthwise) and poolings (padding, ceil mode, average, adaptive)
// on the recording executor: every launch's arguments against its kernel's
// C signature, every pointer inside an allocation.
func TestRecordedGeneralConvPool(t *testing.T) {
	b, rec := newRecordingBackend(t)
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	i := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Int32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	for _, g := range []tensor.ConvGeom{
		{N: 2, C: 3, H: 10, W: 9, K: 5, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2, DilationH: 2, DilationW: 2},
		{N: 2, C: 4, H: 7, W: 8, K: 6, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, Groups: 2},
		{N: 3, C: 5, H: 8, W: 7, K: 5, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, Groups: 5, ReLU: true},
		// Plain 5x5 with many channels: the register-tiled backward would
		// take it, and must still take it.
		{N: 4, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1},
		// The same with dilation: the register-tiled kernels must not.
		{N: 4, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1, DilationH: 1, DilationW: 2},
	} {
		xn, yn, wn := g.N*g.C*g.H*g.W, g.N*g.K*g.OutH()*g.OutW(), g.WeightLen()
		b.Conv2d(f(yn), f(xn), f(wn), f(g.K), g)
		b.Conv2dBackward(f(xn), f(wn), f(g.K), f(yn), f(xn), f(wn), f(yn), g)
		b.Conv2dBackward(f(xn), tensor.Buffer{}, tensor.Buffer{}, f(yn), f(xn), f(wn), f(yn), g)
	}
	for _, pg := range []tensor.PoolGeom{
		{N: 2, C: 3, H: 7, W: 9, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{N: 2, C: 2, H: 7, W: 8, KH: 2, KW: 2, StrideH: 2, StrideW: 2, CeilMode: true},
		{N: 2, C: 2, H: 5, W: 6, KH: 2, KW: 2, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, CeilMode: true},
	} {
		xn, yn := pg.N*pg.C*pg.H*pg.W, pg.N*pg.C*pg.OutH()*pg.OutW()
		b.MaxPool2d(f(yn), i(yn), f(xn), pg)
		b.MaxPool2dBackward(f(xn), f(yn), i(yn), pg, false)
		b.MaxPool2dBackward(f(xn), f(yn), i(yn), pg, true)
		for _, ag := range []tensor.AvgPoolGeom{{PoolGeom: pg}, {PoolGeom: pg, ExcludePad: true}, {PoolGeom: pg, Divisor: 3}} {
			b.AvgPool2d(f(yn), f(xn), ag)
			b.AvgPool2dBackward(f(xn), f(yn), ag, true)
		}
	}
	ad := tensor.AdaptivePoolGeom{N: 2, C: 3, H: 7, W: 9, OutH: 3, OutW: 4}
	xn, yn := ad.N*ad.C*ad.H*ad.W, ad.N*ad.C*ad.OutH*ad.OutW
	b.AdaptiveAvgPool2d(f(yn), f(xn), ad)
	b.AdaptiveAvgPool2dBackward(f(xn), f(yn), ad, false)
	b.AdaptiveMaxPool2d(f(yn), i(yn), f(xn), ad)
	b.AdaptiveMaxPool2dBackward(f(xn), f(yn), i(yn), ad, true)
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
	if rec.kernelLaunches() == 0 {
		t.Fatal("nothing was launched")
	}
}

// TestFusedConvPoolRejectsGeneralGeometry checks the guard that keeps
// dilation, groups and padded pooling away from the fused LeNet kernels.
func TestFusedConvPoolRejectsGeneralGeometry(t *testing.T) {
	b, _ := newRecordingBackend(t)
	plain := tensor.ConvGeom{N: 2, C: 3, H: 9, W: 9, K: 6, R: 3, S: 3, StrideH: 1, StrideW: 1, ReLU: true}
	pool := tensor.PoolGeom{N: 2, C: 6, H: 7, W: 7, KH: 2, KW: 2, StrideH: 2, StrideW: 2}
	dilated, grouped, padded := plain, plain, pool
	dilated.DilationH, grouped.Groups, padded.PadH = 2, 3, 1
	dilated.H, dilated.W = 11, 11 // the same 7x7 output
	for _, c := range []struct {
		what string
		g    tensor.ConvGeom
		p    tensor.PoolGeom
	}{{"dilation", dilated, pool}, {"groups", grouped, pool}, {"pool padding", plain, padded}} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "fused kernels") {
					t.Errorf("%s: Conv2dReLUMaxPool did not refuse the geometry (panic %v)", c.what, r)
				}
			}()
			b.Conv2dReLUMaxPool(tensor.Buffer{}, tensor.Buffer{}, tensor.Buffer{}, tensor.Buffer{}, tensor.Buffer{}, c.g, c.p)
		}()
	}
}
