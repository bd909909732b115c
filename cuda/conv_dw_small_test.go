package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestConvFilterGradSmallOnHost runs ember_conv_dw_small and its join on
// the CPU through the host emulation (testdata/conv_dw_small_host.cpp):
// each weight gradient against a double sum of the rounded products. It
// skips without clang++ and under -short.
func TestConvFilterGradSmallOnHost(t *testing.T) {
	checkOnHost(t, "convolution", []string{"kernels/common.cu", "kernels/conv.cu"}, "conv_dw_small_host.cpp")
}

// TestGPUConvFilterGradSmallMatchesCPU runs Conv2dBackwardLowp on
// geometries with few taps, whose filter gradient ember_conv_dw_small
// computes, beside the CPU backend's: dw (added to) within one bfloat16
// step of the CPU's sum plus 1e-5 of the sum of |products| (the two sum in
// other orders before rounding), and db and dx (from cuDNN, where wanted)
// normwise within 1e-2 (dx is rounded to bfloat16 too).
func TestGPUConvFilterGradSmallMatchesCPU(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	rng := rand.New(rand.NewPCG(15, 16))
	for _, c := range []struct {
		g      tensor.ConvGeom
		dx, db bool
	}{
		{g: tensor.ConvGeom{N: 8, C: 1, H: 28, W: 28, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}},
		{g: tensor.ConvGeom{N: 4, C: 1, H: 28, W: 28, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: true}, db: true},
		{g: tensor.ConvGeom{N: 5, C: 2, H: 13, W: 11, K: 10, R: 2, S: 3, StrideH: 2, StrideW: 1, PadH: 1, DilationW: 2}},
		{g: tensor.ConvGeom{N: 6, C: 3, H: 32, W: 32, K: 24, R: 2, S: 2, StrideH: 1, StrideW: 1}, dx: true, db: true},
	} {
		g := c.g
		if !b.ConvLowp(g) {
			t.Skipf("%+v: no bfloat16 convolutions (cuDNN)", g)
		}
		if !smallFilterGrad(convShapeOf("test", g)) {
			t.Fatalf("%+v: not a small filter gradient", g)
		}
		oh, ow := g.OutH(), g.OutW()
		P := oh * ow
		randn := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return v
		}
		x, w, dy, y, dw0 := randn(g.N*g.C*g.H*g.W), randn(g.WeightLen()), randn(g.N*g.K*P), randn(g.N*g.K*P), randn(g.WeightLen())
		var dws, dbs, dxs [2][]float32
		for i, be := range []tensor.Backend{tensor.CPU, b} {
			s := tensor.NewScope()
			up := func(v []float32) *tensor.Tensor { return tensor.FromFloat32(be, s, v, len(v)) }
			tdw, tdb, tdx := up(dw0), (*tensor.Tensor)(nil), (*tensor.Tensor)(nil)
			buf := func(t *tensor.Tensor) tensor.Buffer {
				if t == nil {
					return tensor.Buffer{}
				}
				return t.Buffer()
			}
			if c.db {
				tdb = tensor.Zeros(be, s, g.K)
			}
			if c.dx {
				tdx = tensor.Zeros(be, s, len(x))
			}
			be.(tensor.LowPrecisionConvBackend).Conv2dBackwardLowp(buf(tdx), buf(tdw), buf(tdb), up(dy).Buffer(), up(x).Buffer(), up(w).Buffer(), up(y).Buffer(), g)
			down := func(t *tensor.Tensor) []float32 {
				if t == nil {
					return nil
				}
				return t.Float32s()
			}
			dws[i], dbs[i], dxs[i] = down(tdw), down(tdb), down(tdx)
			s.Release()
		}
		dh, dwl := g.Dilation()
		crs := g.C * g.R * g.S
		for k := 0; k < g.K; k++ {
			for q := 0; q < crs; q++ {
				ci, r, sq := q/(g.R*g.S), q%(g.R*g.S)/g.S, q%g.S
				abs := 0.0
				for n := 0; n < g.N; n++ {
					for o := 0; o < P; o++ {
						h, wc := o/ow*g.StrideH-g.PadH+r*dh, o%ow*g.StrideW-g.PadW+sq*dwl
						if h >= 0 && h < g.H && wc >= 0 && wc < g.W {
							abs += math.Abs(float64(dy[(n*g.K+k)*P+o]) * float64(x[((n*g.C+ci)*g.H+h)*g.W+wc]))
						}
					}
				}
				i := k*crs + q
				cpu, gpu := float64(dws[0][i]), float64(dws[1][i])
				if tol := 0x1p-7*math.Abs(cpu-float64(dw0[i])) + 1e-5*abs + 0x1p-22*math.Abs(float64(dw0[i])); math.Abs(gpu-cpu) > tol {
					t.Fatalf("%+v: dw[%d] GPU %.9g, CPU %.9g, allowed %.3g", g, i, gpu, cpu, tol)
				}
			}
		}
		for _, p := range []struct {
			name string
			v    [2][]float32
		}{{"db", dbs}, {"dx", dxs}} {
			var diff, norm float64
			for i, v := range p.v[0] {
				d := float64(p.v[1][i]) - float64(v)
				diff += d * d
				norm += float64(v) * float64(v)
			}
			if norm > 0 && math.Sqrt(diff/norm) > 1e-2 {
				t.Errorf("%+v: %s differs normwise by %.3g", g, p.name, math.Sqrt(diff/norm))
			}
		}
	}
}

// TestSmallConvPartitions checks the host's choices for the first layer's
// channels-last kernels against their shared arrays and group limit, for
// every channel count the form takes up to dwsMaxK: the filter gradient's
// tile of positions fits its dy tile (dwsTile·dwsMaxK floats) and its
// patch tile (clDwsTileMax positions), and the direct convolution's
// groups a thread divide the count's groups of eight, at most four
// (EMBER_CL_SMALL_GROUPS).
func TestSmallConvPartitions(t *testing.T) {
	for k := 8; k <= dwsMaxK; k += 8 {
		if tile := clDwsTile(k); tile < 1 || tile > clDwsTileMax || tile*k > dwsTile*dwsMaxK {
			t.Errorf("K=%d: a tile of %d positions (at most %d, and %d floats of dy)", k, tile, clDwsTileMax, dwsTile*dwsMaxK)
		}
		if gb := clSmallGroups(k / 8); gb < 1 || gb > 4 || (k/8)%gb != 0 {
			t.Errorf("K=%d: %d groups a thread, for %d groups", k, gb, k/8)
		}
	}
}
