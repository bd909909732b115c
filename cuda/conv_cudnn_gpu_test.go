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

// GPU tests of the cuDNN convolutions: the same convolutions through cuDNN
// and through the im2col + cuBLAS path (a backend with NoCuDNN), on fresh
// random inputs, at ResNet-9's sizes and on grouped, dilated and strided
// geometries; and, with EMBER_CUDNN_BENCH=1, their times both ways. They
// skip without a GPU, and without cuDNN unless EMBER_REQUIRE_CUDNN=1.
// (The conformance suites compare both paths with the CPU on small
// geometries: TestGPUBackendConformance runs cuDNN where it is installed,
// and again without it under EMBER_CUDNN=0.)

// resnet9Convs are the convolutions of ResNet-9 (the prep layer, three
// stages and two residual blocks, 3x3, padding 1) on 28x28 images at batch
// 512: the first of each size.
func resnet9Convs(n int) []tensor.ConvGeom {
	conv := func(c, k, hw int) tensor.ConvGeom {
		return tensor.ConvGeom{N: n, C: c, H: hw, W: hw, K: k, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	}
	return []tensor.ConvGeom{conv(1, 64, 28), conv(64, 128, 28), conv(128, 128, 14), conv(128, 256, 14), conv(256, 512, 7), conv(512, 512, 3)}
}

// cudnnBackends are a backend with cuDNN and one without, on the test GPU.
func cudnnBackends(t *testing.T) (dnn, plain *Backend) {
	t.Helper()
	dnn = newGPUBackend(t, BackendOptions{})
	if _, err := dnn.CuDNN(); err != nil {
		if os.Getenv("EMBER_REQUIRE_CUDNN") == "1" {
			t.Fatalf("EMBER_REQUIRE_CUDNN=1 but cuDNN is not used: %v", err)
		}
		t.Skipf("cuDNN is not used: %v", err)
	}
	// Every geometry through cuDNN, not only where it is faster: the
	// comparison and the benchmark are of cuDNN itself.
	dnn.dnnEverywhere = true
	return dnn, newGPUBackend(t, BackendOptions{NoCuDNN: true})
}

func randFloats(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 2*rng.Float32() - 1
	}
	return v
}

func gpuBuf(t testing.TB, b *Backend, v []float32) tensor.Buffer {
	t.Helper()
	buf, err := b.Alloc(len(v), tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free(buf) })
	b.Upload(buf, v)
	return buf
}

func download(b *Backend, buf tensor.Buffer) []float32 {
	v := make([]float32, buf.Len)
	b.Download(v, buf)
	return v
}

// normRelErr is ||got - want|| / ||want|| (0 for two zero vectors).
func normRelErr(got, want []float32) float64 {
	var d, w float64
	for i := range want {
		e := float64(got[i]) - float64(want[i])
		d += e * e
		w += float64(want[i]) * float64(want[i])
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}

// convResults are one backend's outputs of a forward and backward pass.
type convResults struct{ y, dx, dw, db []float32 }

// runConv runs g forward and backward on b from the host inputs; dw and db
// start from dw0 and db0 (the backward adds into them); mask is the
// forward output the fused ReLU's backward reads (the same on both
// backends, so that values near 0 cannot be masked differently).
func runConv(t *testing.T, b *Backend, g tensor.ConvGeom, x, w, bias, dy, dw0, db0, mask []float32) convResults {
	xb, wb, bb, dyb := gpuBuf(t, b, x), gpuBuf(t, b, w), gpuBuf(t, b, bias), gpuBuf(t, b, dy)
	yb, dxb := gpuBuf(t, b, make([]float32, len(dy))), gpuBuf(t, b, make([]float32, len(x)))
	dwb, dbb := gpuBuf(t, b, dw0), gpuBuf(t, b, db0)
	b.Conv2d(yb, xb, wb, bb, g)
	r := convResults{y: download(b, yb)}
	mb := tensor.Buffer{}
	if g.ReLU {
		mb = gpuBuf(t, b, mask)
	}
	b.Conv2dBackward(dxb, dwb, dbb, dyb, xb, wb, mb, g)
	r.dx, r.dw, r.db = download(b, dxb), download(b, dwb), download(b, dbb)
	gpuCheck(t, b.Synchronize())
	return r
}

func TestGPUConvCuDNNMatchesIm2col(t *testing.T) {
	dnn, plain := cudnnBackends(t)
	geoms := resnet9Convs(512)
	geoms = append(geoms,
		// Grouped, dilated and strided, with bias and ReLU.
		tensor.ConvGeom{N: 32, C: 64, H: 28, W: 28, K: 128, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 2, PadW: 2, DilationH: 2, DilationW: 2, Groups: 4, ReLU: true},
		// Depthwise, rectangular kernel and padding.
		tensor.ConvGeom{N: 16, C: 64, H: 20, W: 24, K: 64, R: 3, S: 5, StrideH: 1, StrideW: 2, PadH: 1, PadW: 2, Groups: 64},
	)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, g := range geoms {
		name := fmt.Sprintf("N%d_C%d_%dx%d_K%d_%dx%d_s%d_d%d_g%d_relu%v", g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.StrideH, max(g.DilationH, 1), g.GroupCount(), g.ReLU)
		t.Run(name, func(t *testing.T) {
			c := convShapeOf("test", g)
			x, w, bias := randFloats(rng, c.xLen), randFloats(rng, c.wLen), randFloats(rng, g.K)
			dy, dw0, db0 := randFloats(rng, c.yLen), randFloats(rng, c.wLen), randFloats(rng, g.K)
			var mask []float32
			if g.ReLU {
				mask = randFloats(rng, c.yLen)
			}
			got := runConv(t, dnn, g, x, w, bias, dy, dw0, db0, mask)
			want := runConv(t, plain, g, x, w, bias, dy, dw0, db0, mask)
			// Both in FP32 with different summation orders (sums of up
			// to C·R·S = 4608 terms for y and dx, N·P = 401,408 for
			// dw): a normwise relative error of about 1e-6 is expected,
			// a few times more for Winograd and FFT algorithms; TF32
			// would give about 2e-4, a wrong index O(1).
			for _, c := range []struct {
				what      string
				got, want []float32
				tol       float64
			}{
				{"y", got.y, want.y, 5e-5}, {"dx", got.dx, want.dx, 5e-5},
				{"dw", got.dw, want.dw, 1e-4}, {"db", got.db, want.db, 1e-5},
			} {
				e := normRelErr(c.got, c.want)
				if !(e <= c.tol) {
					t.Errorf("%s: cuDNN vs im2col: normwise relative error %.3g > %.1g", c.what, e, c.tol)
				} else {
					t.Logf("%s: normwise relative error %.3g (tolerance %.1g)", c.what, e, c.tol)
				}
			}
			dg, ok := dnn.descGeom(c)
			if !ok {
				t.Fatalf("%+v is not sent to cuDNN", g)
			}
			plan := dnn.dnn.plans[dg]
			if plan == nil || !plan.found[dirForward] || !plan.found[dirBackwardData] || !plan.found[dirBackwardFilter] {
				t.Errorf("cuDNN did not run every direction: %s", dnn.dnn.describe(dg))
			}
			t.Log(dnn.dnn.describe(dg))
			// Deterministic algorithms: a second run gives the same bits.
			again := runConv(t, dnn, g, x, w, bias, dy, dw0, db0, mask)
			for _, c := range []struct {
				what string
				a, b []float32
			}{{"y", got.y, again.y}, {"dx", got.dx, again.dx}, {"dw", got.dw, again.dw}} {
				for i := range c.a {
					if math.Float32bits(c.a[i]) != math.Float32bits(c.b[i]) {
						t.Errorf("%s[%d]: %v then %v: not deterministic", c.what, i, c.a[i], c.b[i])
						break
					}
				}
			}
		})
	}
}

// TestGPUConvCuDNNBench prints µs per forward and per backward (dx, dw and
// db) pass of ResNet-9's convolutions through cuDNN and through im2col +
// cuBLAS (EMBER_CUDNN_BENCH=1; -v to see it).
func TestGPUConvCuDNNBench(t *testing.T) {
	if os.Getenv("EMBER_CUDNN_BENCH") != "1" {
		t.Skip("set EMBER_CUDNN_BENCH=1 to time cuDNN against im2col")
	}
	dnn, plain := cudnnBackends(t)
	const warm, iters = 3, 20
	rng := rand.New(rand.NewPCG(5, 6))
	t.Logf("cuDNN %d; batch 512, 3x3 padding 1; µs per pass (wall time over %d passes after %d)", dnn.dnn.n.Version(), iters, warm)
	t.Logf("%-22s %12s %12s %12s %12s", "geometry", "fwd cuDNN", "fwd im2col", "bwd cuDNN", "bwd im2col")
	for _, g := range resnet9Convs(512) {
		c := convShapeOf("bench", g)
		x, w, bias, dy := randFloats(rng, c.xLen), randFloats(rng, c.wLen), randFloats(rng, g.K), randFloats(rng, c.yLen)
		var us [2][2]float64
		for i, b := range []*Backend{dnn, plain} {
			xb, wb, bb, dyb := gpuBuf(t, b, x), gpuBuf(t, b, w), gpuBuf(t, b, bias), gpuBuf(t, b, dy)
			yb, dxb, dwb, dbb := gpuBuf(t, b, dy), gpuBuf(t, b, x), gpuBuf(t, b, w), gpuBuf(t, b, bias)
			timeIt := func(f func()) float64 { return wallMicros(t, b, warm, iters, f) }
			us[i][0] = timeIt(func() { b.Conv2d(yb, xb, wb, bb, g) })
			us[i][1] = timeIt(func() { b.Conv2dBackward(dxb, dwb, dbb, dyb, xb, wb, tensor.Buffer{}, g) })
		}
		t.Logf("%-22s %12.1f %12.1f %12.1f %12.1f", fmt.Sprintf("%dx%d %d->%d", g.H, g.W, g.C, g.K), us[0][0], us[1][0], us[0][1], us[1][1])
		if dg, ok := dnn.descGeom(c); ok {
			t.Logf("    %s", dnn.dnn.describe(dg))
		}
	}
}

// TestGPUBackendConformanceNoCuDNN runs the conformance suite with the
// convolutions on im2col + cuBLAS, the fallback where cuDNN is missing.
func TestGPUBackendConformanceNoCuDNN(t *testing.T) {
	tensortest.RunBackend(t, newGPUBackend(t, BackendOptions{NoCuDNN: true}))
}
