package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// The convolutions in each precision (fp32 strict, tf32, bf16 autocast)
// against the float32 CPU backend, forward and backward, on fresh random
// inputs, with elementwise tolerances derived from the formats.
//
// With u the unit roundoff of the operands' format (the largest relative
// error of rounding to it: 2^-24 for float32, 2^-11 for TF32 rounded to
// nearest, 2^-10 if it is truncated, 2^-8 for bfloat16), a sum of products
// of rounded operands, each exact and summed in float32, is off by at most
// (2u + u²)·A plus float32's summation error, where A is the same sum over
// the absolute values (computed here by the CPU on |x|, |w|, |dy|). A
// result rounded to bfloat16 adds u·|result| <= u·A. So:
//
//	fp32: |got - want| <= 1e-5·A      (float32 sums in another order:
//	                                   ~sqrt(terms)·2^-24 typically, 168·2^-24 allowed)
//	tf32: |got - want| <= (2·2^-10 + 1e-5)·A
//	bf16: |got - want| <= (3·2^-8 + 2^-16 + 1e-5)·A   (operands and result rounded)
//
// The bias gradient is a float32 sum of dy in every precision (1e-5·A).
// A wrong index or a missed pass gives errors of order A.

// precisionTol is the relative bound (times A) of each precision.
func precisionTol(p tensor.Precision) float64 {
	const fp32 = 1e-5
	switch p {
	case tensor.TF32:
		return 2*math.Ldexp(1, -10) + fp32
	case tensor.BF16:
		u := math.Ldexp(1, -8)
		return 3*u + u*u + fp32
	}
	return fp32
}

// cpuConv runs g forward and backward on the CPU in float32: y from x, w,
// bias; dx, and dw and db added into dw0 and db0, from dy, masked by mask
// under g.ReLU.
func cpuConv(g tensor.ConvGeom, x, w, bias, dy, dw0, db0, mask []float32) convResults {
	cpu := tensor.CPU
	buf := func(v []float32) tensor.Buffer {
		b, err := cpu.Alloc(len(v), tensor.Float32)
		if err != nil {
			panic(err)
		}
		cpu.Upload(b, v)
		return b
	}
	get := func(b tensor.Buffer) []float32 {
		v := make([]float32, b.Len)
		cpu.Download(v, b)
		return v
	}
	xb, wb, bb, dyb := buf(x), buf(w), buf(bias), buf(dy)
	yb, dxb, dwb, dbb := buf(make([]float32, len(dy))), buf(make([]float32, len(x))), buf(dw0), buf(db0)
	cpu.Conv2d(yb, xb, wb, bb, g)
	var mb tensor.Buffer
	if g.ReLU {
		mb = buf(mask)
	}
	cpu.Conv2dBackward(dxb, dwb, dbb, dyb, xb, wb, mb, g)
	return convResults{y: get(yb), dx: get(dxb), dw: get(dwb), db: get(dbb)}
}

// absAll returns the magnitudes of v (the inputs of an error bound).
func absAll(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(math.Abs(float64(x)))
	}
	return out
}

// runConvLowp is runConv through Conv2dLowp and Conv2dBackwardLowp.
func runConvLowp(t *testing.T, b *Backend, g tensor.ConvGeom, x, w, bias, dy, dw0, db0, mask []float32) convResults {
	xb, wb, bb, dyb := gpuBuf(t, b, x), gpuBuf(t, b, w), gpuBuf(t, b, bias), gpuBuf(t, b, dy)
	yb, dxb := gpuBuf(t, b, make([]float32, len(dy))), gpuBuf(t, b, make([]float32, len(x)))
	dwb, dbb := gpuBuf(t, b, dw0), gpuBuf(t, b, db0)
	b.Conv2dLowp(yb, xb, wb, bb, g)
	r := convResults{y: download(b, yb)}
	mb := tensor.Buffer{}
	if g.ReLU {
		mb = gpuBuf(t, b, mask)
	}
	b.Conv2dBackwardLowp(dxb, dwb, dbb, dyb, xb, wb, mb, g)
	r.dx, r.dw, r.db = download(b, dxb), download(b, dwb), download(b, dbb)
	gpuCheck(t, b.Synchronize())
	return r
}

// precisionMode is one way of running a convolution: a precision, and for
// bfloat16 the layout cuDNN sees.
type precisionMode struct {
	name string
	prec tensor.Precision
	b    *Backend
}

// precisionModes are the GPU backends of the three precisions, every
// convolution pass on cuDNN; bfloat16 runs on the fp32 backend's Lowp
// methods, in NHWC (the default) and in NCHW.
func precisionModes(t *testing.T) []precisionMode {
	fp32, _ := cudnnBackends(t)
	tf32 := newGPUBackend(t, BackendOptions{TF32: true})
	tf32.dnnEverywhere = true
	nchw := newGPUBackend(t, BackendOptions{})
	nchw.dnnEverywhere = true
	nchw.dnn.lowpNCHW = true
	return []precisionMode{{"fp32", tensor.FP32, fp32}, {"tf32", tensor.TF32, tf32}, {"bf16", tensor.BF16, fp32}, {"bf16-nchw", tensor.BF16, nchw}}
}

func TestGPUConvPrecisionsMatchCPU(t *testing.T) {
	modes := precisionModes(t)
	conv := func(n, c, k, hw int) tensor.ConvGeom {
		return tensor.ConvGeom{N: n, C: c, H: hw, W: hw, K: k, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	}
	// ResNet-9's convolutions at small batches (the CPU computes the
	// reference), airbench's first two (three and 24 channels: the layout
	// casts' narrow tiles and odd channel counts, 31x31 planes), a fused
	// ReLU, and grouped, dilated, strided and rectangular ones.
	geoms := []tensor.ConvGeom{conv(8, 1, 64, 28), conv(4, 64, 128, 28), conv(8, 128, 256, 14), conv(16, 512, 512, 3),
		{N: 6, C: 3, H: 32, W: 32, K: 24, R: 2, S: 2, StrideH: 1, StrideW: 1}, conv(4, 24, 64, 31),
		{N: 8, C: 64, H: 14, W: 14, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: true},
		{N: 4, C: 32, H: 20, W: 20, K: 64, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 2, PadW: 2, DilationH: 2, DilationW: 2, Groups: 4, ReLU: true},
		{N: 4, C: 16, H: 12, W: 18, K: 16, R: 3, S: 5, StrideH: 1, StrideW: 2, PadH: 1, PadW: 2, Groups: 16},
	}
	rng := rand.New(rand.NewPCG(21, 22))
	for _, g := range geoms {
		c := convShapeOf("test", g)
		x, w, bias := randFloats(rng, c.xLen), randFloats(rng, c.wLen), randFloats(rng, g.K)
		dy, dw0, db0 := randFloats(rng, c.yLen), randFloats(rng, c.wLen), randFloats(rng, g.K)
		var mask []float32
		if g.ReLU {
			mask = randFloats(rng, c.yLen)
		}
		want := cpuConv(g, x, w, bias, dy, dw0, db0, mask)
		// A: the same passes over absolute values (no ReLU: |mask| > 0
		// would pass everything; without it the bound only grows).
		ga := g
		ga.ReLU = false
		a := cpuConv(ga, absAll(x), absAll(w), absAll(bias), absAll(dy), make([]float32, c.wLen), make([]float32, g.K), nil)
		for i := range a.dw {
			a.dw[i] += float32(math.Abs(float64(dw0[i])))
		}
		for i := range a.db {
			a.db[i] += float32(math.Abs(float64(db0[i])))
		}
		for _, m := range modes {
			p := m.prec
			name := fmt.Sprintf("%s/N%d_C%d_%dx%d_K%d_%dx%d_s%d_d%d_g%d_relu%v", m.name, g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.StrideH, max(g.DilationH, 1), g.GroupCount(), g.ReLU)
			t.Run(name, func(t *testing.T) {
				b := m.b
				var got convResults
				if p == tensor.BF16 {
					if !b.ConvLowp(g) {
						t.Fatalf("ConvLowp(%+v) is false: the geometry would stay float32 under autocast", g)
					}
					got = runConvLowp(t, b, g, x, w, bias, dy, dw0, db0, mask)
				} else {
					got = runConv(t, b, g, x, w, bias, dy, dw0, db0, mask)
				}
				tol := precisionTol(p)
				for _, r := range []struct {
					what         string
					got, want, a []float32
					tol          float64
				}{
					{"y", got.y, want.y, a.y, tol}, {"dx", got.dx, want.dx, a.dx, tol},
					{"dw", got.dw, want.dw, a.dw, tol}, {"db", got.db, want.db, a.db, precisionTol(tensor.FP32)},
				} {
					worst, at := 0.0, -1
					for i := range r.want {
						e := math.Abs(float64(r.got[i]) - float64(r.want[i]))
						bound := r.tol*float64(r.a[i]) + 1e-30
						if !(e <= bound) { // NaN fails
							t.Errorf("%s[%d] = %v, CPU float32 %v: error %.3g > %.3g·A = %.3g", r.what, i, r.got[i], r.want[i], e, r.tol, bound)
							break
						}
						if q := e / bound; q > worst {
							worst, at = q, i
						}
					}
					t.Logf("%s: worst error %.3f of the bound (at %d)", r.what, worst, at)
				}
				dg, ok := b.descGeom(c)
				if p == tensor.BF16 {
					dg, ok = b.lowpGeom(c)
				}
				if ok {
					t.Log(b.dnn.describe(dg))
				}
			})
		}
	}
}

// TestGPUConvPrecisionBench prints µs per pass (forward; backward data,
// filter and bias together; and each backward direction alone) of
// ResNet-9's convolutions at batch 512 in each precision, through cuDNN
// and through im2col + cuBLAS (EMBER_CUDNN_BENCH=1; -v to see it). bf16
// has no im2col rows (its fallback is the float32 convolution); it runs
// with cuDNN in NHWC (the default) and NCHW, casts included.
func TestGPUConvPrecisionBench(t *testing.T) {
	if os.Getenv("EMBER_CUDNN_BENCH") != "1" {
		t.Skip("set EMBER_CUDNN_BENCH=1 to time the convolutions")
	}
	fp32, plain := cudnnBackends(t)
	tf32 := newGPUBackend(t, BackendOptions{TF32: true})
	tf32.dnnEverywhere = true
	plainTF32 := newGPUBackend(t, BackendOptions{TF32: true, NoCuDNN: true})
	nchw := newGPUBackend(t, BackendOptions{})
	nchw.dnn.lowpNCHW = true
	const warm, iters = 3, 20
	rng := rand.New(rand.NewPCG(5, 6))
	t.Logf("cuDNN %d; batch 512, 3x3 padding 1; µs per pass (wall time over %d passes after %d); bwd = dx + dw + db", fp32.dnn.n.Version(), iters, warm)
	t.Logf("%-16s %-12s %9s %9s %9s %9s", "geometry", "path", "fwd", "bwd", "bwd dx", "bwd dw")
	for _, g := range resnet9Convs(512) {
		c := convShapeOf("bench", g)
		x, w, bias, dy := randFloats(rng, c.xLen), randFloats(rng, c.wLen), randFloats(rng, g.K), randFloats(rng, c.yLen)
		for _, r := range []struct {
			name string
			b    *Backend
			lowp bool
		}{{"fp32 cuDNN", fp32, false}, {"fp32 im2col", plain, false}, {"tf32 cuDNN", tf32, false}, {"tf32 im2col", plainTF32, false},
			{"bf16 NHWC", fp32, true}, {"bf16 NCHW", nchw, true}} {
			b := r.b
			xb, wb, bb, dyb := gpuBuf(t, b, x), gpuBuf(t, b, w), gpuBuf(t, b, bias), gpuBuf(t, b, dy)
			yb, dxb, dwb, dbb := gpuBuf(t, b, dy), gpuBuf(t, b, x), gpuBuf(t, b, w), gpuBuf(t, b, bias)
			fwd := func() { b.Conv2d(yb, xb, wb, bb, g) }
			bwd := func(dx, dw, db tensor.Buffer) func() {
				return func() { b.Conv2dBackward(dx, dw, db, dyb, xb, wb, tensor.Buffer{}, g) }
			}
			if r.lowp {
				fwd = func() { b.Conv2dLowp(yb, xb, wb, bb, g) }
				bwd = func(dx, dw, db tensor.Buffer) func() {
					return func() { b.Conv2dBackwardLowp(dx, dw, db, dyb, xb, wb, tensor.Buffer{}, g) }
				}
			}
			timeIt := func(f func()) float64 { return wallMicros(t, b, warm, iters, f) }
			none := tensor.Buffer{}
			t.Logf("%-16s %-12s %9.1f %9.1f %9.1f %9.1f", fmt.Sprintf("%dx%d %d->%d", g.H, g.W, g.C, g.K), r.name,
				timeIt(fwd), timeIt(bwd(dxb, dwb, dbb)), timeIt(bwd(dxb, none, none)), timeIt(bwd(none, dwb, none)))
			dg, ok := b.descGeom(c)
			if r.lowp {
				dg, ok = b.lowpGeom(c)
			}
			if ok {
				t.Logf("    %s", b.dnn.describe(dg))
			}
		}
	}
}
