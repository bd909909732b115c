package tensortest

import (
	"fmt"
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Tolerances, relative to the bound of each element (|want| for
// elementwise operations, the sum of the magnitudes of the accumulated terms
// otherwise). The device computes in float32 (unit roundoff u = 2⁻²⁴ ≈
// 6e-8) and the references in float64.
const (
	// tolElem: an elementwise operation rounds once or a few times (a fused
	// multiply-add rounds differently from a multiply then an add), so its
	// error is a few u relative to the magnitudes of its operands.
	tolElem = 1e-6
	// tolAcc: a sum of k float32 terms errs by at most about k·u times the
	// sum of their magnitudes, and by about √k·u (or log k·u for a tree)
	// in practice; 1e-5 of Σ|terms| holds for the lengths used here
	// (up to ~100k for Sum, 1000 for GEMM, 500 for convolution) with any
	// summation order. It fails a GEMM done in TF32 or half precision,
	// which the backends must not use for these float32 operations.
	tolAcc = 1e-5
)

// RunBackend checks every operation of b against the float64 references of
// this package, one subtest per operation: the core, CompleteBackend's
// operations through tensor.Complete(b) (b's own kernels, or the fallbacks
// composed from its core), and each optional interface b has (the subtests
// of the others skip, naming them).
func RunBackend(t *testing.T, b tensor.Backend) {
	seed := baseSeed(t)
	t.Logf("tensortest: backend %s, seed %d (rerun with %s=%d)", b.Name(), seed, seedEnv, seed)
	tests := append(append([]namedTest{
		{"Name", testName},
		{"AllocUploadDownload", testUploadDownload},
		{"Fill", testFill},
		{"Copy", testCopy},
		{"CopyStrided", testCopyStrided},
		{"MatMul", testMatMul},
		{"Conv2d", testConv2d},
		{"Conv2dBackward", testConv2dBackward},
		{"Conv2dGeneral", testConvGeneral},
		{"Pooling", testPooling},
		{"Softmax", testSoftmax}, {"SoftmaxBackward", testSoftmaxBackward}, {"CausalSoftmax", testCausalSoftmax},
		{"IndexSelect", testIndexSelect}, {"IndexAdd", testIndexAdd}, {"MatMulBatched", testMatMulBatched},
		{"Optim", testOptim},
		{"Random", testRandom},
		{"RandomAt", testRandomAt}, {"Dropout", testDropout}, {"DropoutRedraw", testDropoutRedraw}, {"DropoutAdd", testDropoutAdd},
		{"BatchNorm", testBatchNorm},
		{"BatchNormBackward", testBatchNormBackward},
		{"BatchNormAct", testBatchNormAct},
		{"BatchNormActBackward", testBatchNormActBackward},
		{"LayerNorm", testLayerNorm},
		{"LayerNormBackward", testLayerNormBackward},
		{"ClassLoss", testClassLoss},
		{"AugmentGather", testAugmentGather},
		{"Cast", testCast}, {"UnaryCast", testUnaryCast}, {"LayerNormCast", testLayerNormCast}, {"MatMulLowp", testMatMulLowp},
	}, completeTests...), elementwiseTests...)
	t.Run("Backend", func(t *testing.T) {
		for _, tc := range tests {
			subtest(t, b, seed, tc.name, tc.f)
		}
	})
}

// RunComplete runs the subtests of RunBackend that check the operations
// of tensor.CompleteBackend through tensor.Complete(b): on CoreOnly(b) it
// checks the fallbacks composed from b's core, without repeating the
// checks of the core itself.
func RunComplete(t *testing.T, b tensor.Backend) {
	seed := baseSeed(t)
	t.Logf("tensortest: CompleteBackend on %s, seed %d (rerun with %s=%d)", b.Name(), seed, seedEnv, seed)
	t.Run("Complete", func(t *testing.T) {
		for _, tc := range completeTests {
			subtest(t, b, seed, tc.name, tc.f)
		}
	})
}

type namedTest struct {
	name string
	f    func(e *env)
}

// completeTests check tensor.CompleteBackend's operations.
var completeTests = []namedTest{
	{"Add", testAdd},
	{"Mul", testMul},
	{"Axpy", testAxpy},
	{"ScaleBy", testScaleBy},
	{"Sum", testSum},
	{"Broadcast", testBroadcast},
	{"ReLU", testReLU},
	{"ReLUBackward", testReLUBackward},
	{"AddBias", testAddBias},
	{"BiasGrad", testBiasGrad},
	{"ReduceChannels", testReduceChannels},
	{"MaxPool2d", testMaxPool2d},
	{"MaxPool2dBackward", testMaxPool2dBackward},
	{"MaxPool2dGeneral", testMaxPoolGeneral},
	{"CrossEntropy", testCrossEntropy},
	{"Argmax", testArgmax},
	{"SGD", testSGD},
	{"GatherNormalize", testGatherNormalize},
}

func testName(e *env) {
	if e.b.Name() == "" {
		e.fail("Name is empty")
	}
	if err := e.b.Synchronize(); err != nil {
		e.fail("Synchronize on an idle backend: %v", err)
	}
}

// Upload then Download must give back exactly what was uploaded, for every
// dtype, including special float values; the guards check that a window
// upload writes only its window.
func testUploadDownload(e *env) {
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1.17549435e-38}
	for _, n := range append(sizes, len(special)) {
		e.tcase("%s", sizeStr(n))(func() {
			f := e.normal(n, 10)
			if n == len(special) {
				copy(f, special)
			}
			d := e.f32("f32", f, true)
			e.exactF("float32 round trip", dims(n), e.getF(d), f)
			// A second upload overwrites the first.
			g := e.normal(n, 1)
			e.b.Upload(d.win, g)
			d.host = g
			e.exactF("float32 re-upload", dims(n), e.getF(d), g)

			iv := make([]int32, n)
			for i := range iv {
				iv[i] = int32(e.rng.Uint32())
			}
			iv[0] = math.MinInt32
			if n > 1 {
				iv[1] = math.MaxInt32
			}
			di := e.i32("i32", iv, true)
			exactI(e, "int32 round trip", dims(n), e.getI(di), iv)

			u := make([]uint8, n)
			for i := range u {
				u[i] = uint8(i*7 + e.rng.IntN(256))
			}
			u[0] = 255
			du := e.u8("u8", u, true)
			got := make([]uint8, n)
			e.b.Download(got, du.win)
			exactI(e, "uint8 round trip", dims(n), got, u)
		})
	}
}

// Fill sets every element exactly, float32 and int32 (integral values).
func testFill(e *env) {
	for _, n := range sizes {
		for k, v := range []float32{0, 1.5, -3.25} {
			iv := []int32{0, 7, -3}[k] // integral values only: rounding is not specified
			e.tcase("%s v=%g int v=%d", sizeStr(n), v, iv)(func() {
				d := e.f32("dst", e.normal(n, 1), false)
				e.b.Fill(d.win, v)
				e.exactF("float32 Fill", dims(n), e.getF(d), fill(n, v))
				di := e.i32("dst", fillI(n, 99), false)
				e.b.Fill(di.win, float32(iv))
				exactI(e, "int32 Fill", dims(n), e.getI(di), fillI(n, iv))
			})
		}
	}
}

// Copy copies exactly, all dtypes.
func testCopy(e *env) {
	for _, n := range sizes {
		e.tcase("%s", sizeStr(n))(func() {
			src := e.normal(n, 3)
			dst := e.nanOut("dst", n)
			e.b.Copy(dst.win, e.in("src", src))
			e.exactF("float32 Copy", dims(n), e.getF(dst), src)

			si := make([]int32, n)
			for i := range si {
				si[i] = int32(e.rng.Uint32())
			}
			di := e.i32("dst", make([]int32, n), false)
			e.b.Copy(di.win, e.i32("src", si, true).win)
			exactI(e, "int32 Copy", dims(n), e.getI(di), si)

			su := make([]uint8, n)
			for i := range su {
				su[i] = uint8(e.rng.IntN(256))
			}
			du := e.u8("dst", make([]uint8, n), false)
			e.b.Copy(du.win, e.u8("src", su, true).win)
			got := make([]uint8, n)
			e.b.Download(got, du.win)
			exactI(e, "uint8 Copy", dims(n), got, su)
		})
	}
}

// CopyStrided gathers views: transposes, permutations, steps, broadcast
// (stride 0) and size-1 dimensions with arbitrary strides.
func testCopyStrided(e *env) {
	cases := []struct {
		srcLen         int
		shape, strides []int
	}{
		{231, []int{7, 33}, []int{1, 7}},                           // transpose of [33,7]
		{120, []int{6, 4, 5}, []int{1, 30, 6}},                     // permutation of [4,5,6]
		{2 * 3 * 4 * 10, []int{2, 3, 4, 5}, []int{120, 40, 10, 2}}, // every other element
		{771, []int{257}, []int{3}},
		{7, []int{5, 7}, []int{0, 1}}, // broadcast rows
		{1, []int{1}, []int{1}},
		{40, []int{1, 33, 1}, []int{999, 1, 5}},
		{1000 * 3, []int{1000, 3}, []int{1, 1000}},               // transpose of [3,1000]
		{2 * 3 * 9 * 7, []int{2, 7, 9, 3}, []int{189, 1, 7, 63}}, // NCHW -> NWHC
	}
	for _, c := range cases {
		e.tcase("shape %v strides %v", c.shape, c.strides)(func() {
			src := e.normal(c.srcLen, 1)
			n := 1
			for _, d := range c.shape {
				n *= d
			}
			want := make([]float32, n)
			idx := make([]int, len(c.shape))
			for i := range want {
				off := 0
				for k := range idx {
					off += idx[k] * c.strides[k]
				}
				want[i] = src[off]
				for k := len(idx) - 1; k >= 0; k-- {
					idx[k]++
					if idx[k] < c.shape[k] {
						break
					}
					idx[k] = 0
				}
			}
			dst := e.nanOut("dst", n)
			e.b.CopyStrided(dst.win, e.in("src", src), c.shape, c.strides)
			e.exactF("CopyStrided", c.shape, e.getF(dst), want)
		})
	}
}

// Add and Mul round once: tolElem relative to the magnitudes of the
// operands (Add: |a|+|b|, since a sum may cancel). Add may alias its output
// with an input.
func testAdd(e *env) {
	for _, n := range sizes {
		e.tcase("%s", sizeStr(n))(func() {
			a, b := e.normal(n, 1), e.normal(n, 100)
			want, bound := make([]float64, n), make([]float64, n)
			for i := range a {
				want[i] = float64(a[i]) + float64(b[i])
				bound[i] = math.Abs(float64(a[i])) + math.Abs(float64(b[i]))
			}
			dst := e.nanOut("dst", n)
			tensor.Complete(e.b).Add(dst.win, e.in("a", a), e.in("b", b))
			e.near("Add", dims(n), e.getF(dst), want, bound, tolElem)

			da := e.f32("a", a, false)
			tensor.Complete(e.b).Add(da.win, da.win, e.in("b", b))
			e.near("Add dst=a", dims(n), e.getF(da), want, bound, tolElem)
			db := e.f32("b", b, false)
			tensor.Complete(e.b).Add(db.win, e.in("a", a), db.win)
			e.near("Add dst=b", dims(n), e.getF(db), want, bound, tolElem)
			dd := e.f32("a", a, false)
			tensor.Complete(e.b).Add(dd.win, dd.win, dd.win)
			e.near("Add dst=a=b", dims(n), e.getF(dd), f64Scale(a, 2), nil, tolElem)
		})
	}
}

func f64Scale(s []float32, k float64) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = k * float64(v)
	}
	return out
}

func testMul(e *env) {
	for _, n := range sizes {
		e.tcase("%s", sizeStr(n))(func() {
			a, b := e.normal(n, 1), e.normal(n, 10)
			want := make([]float64, n)
			for i := range a {
				want[i] = float64(a[i]) * float64(b[i])
			}
			dst := e.nanOut("dst", n)
			tensor.Complete(e.b).Mul(dst.win, e.in("a", a), e.in("b", b))
			e.near("Mul", dims(n), e.getF(dst), want, nil, tolElem)
		})
	}
}

// Axpy: dst += alpha·x, tolElem relative to |dst| + |alpha·x|.
func testAxpy(e *env) {
	for _, n := range sizes {
		for _, alpha := range []float32{1, -0.5, 2.75, 0} {
			e.tcase("%s alpha=%g", sizeStr(n), alpha)(func() {
				e.alignedOdd(n)
				d0, x := e.normal(n, 1), e.normal(n, 1)
				want, bound := make([]float64, n), make([]float64, n)
				for i := range x {
					ax := float64(alpha) * float64(x[i])
					want[i] = float64(d0[i]) + ax
					bound[i] = math.Abs(float64(d0[i])) + math.Abs(ax)
				}
				dst := e.f32("dst", d0, false)
				tensor.Complete(e.b).Axpy(dst.win, alpha, e.in("x", x))
				e.near("Axpy", dims(n), e.getF(dst), want, bound, tolElem)
			})
		}
	}
}

// ScaleBy: dst = x·s[0] (+ dst), tolElem relative to the magnitudes.
func testScaleBy(e *env) {
	for _, n := range sizes {
		for _, acc := range []bool{false, true} {
			e.tcase("%s accumulate=%v", sizeStr(n), acc)(func() {
				e.alignedOdd(n)
				x, d0 := e.normal(n, 1), e.normal(n, 1)
				s := float32(e.rng.NormFloat64())
				want, bound := make([]float64, n), make([]float64, n)
				for i := range x {
					want[i] = float64(x[i]) * float64(s)
					bound[i] = math.Abs(want[i])
					if acc {
						want[i] += float64(d0[i])
						bound[i] += math.Abs(float64(d0[i]))
					}
				}
				var dst *dbuf
				if acc {
					dst = e.f32("dst", d0, false)
				} else {
					dst = e.nanOut("dst", n)
				}
				tensor.Complete(e.b).ScaleBy(dst.win, e.in("x", x), e.in("s", []float32{s}), acc)
				e.near("ScaleBy", dims(n), e.getF(dst), want, bound, tolElem)
			})
		}
	}
}

// Sum: tolAcc relative to Σ|x|.
func testSum(e *env) {
	for _, n := range append(sizes, 100003) {
		e.tcase("%s", sizeStr(n))(func() {
			e.alignedOdd(n) // both of the GPU's paths: float4 groups (with a tail) and one float at a time
			x := e.normal(n, 1)
			for i := range x { // a non-zero mean, so that the sum is large
				x[i] += 0.25
			}
			var s, sa float64
			for _, v := range x {
				s += float64(v)
				sa += math.Abs(float64(v))
			}
			dst := e.nanOut("dst", 1)
			tensor.Complete(e.b).Sum(dst.win, e.in("x", x))
			e.near("Sum", dims(1), e.getF(dst), []float64{s}, []float64{sa}, tolAcc)
		})
	}
}

// Broadcast: dst = s[0] (+ dst), tolElem.
func testBroadcast(e *env) {
	for _, n := range sizes {
		for _, acc := range []bool{false, true} {
			e.tcase("%s accumulate=%v", sizeStr(n), acc)(func() {
				e.alignedOdd(n)
				d0 := e.normal(n, 1)
				s := float32(e.rng.NormFloat64())
				want, bound := make([]float64, n), make([]float64, n)
				for i := range want {
					want[i] = float64(s)
					bound[i] = math.Abs(float64(s))
					if acc {
						want[i] += float64(d0[i])
						bound[i] += math.Abs(float64(d0[i]))
					}
				}
				var dst *dbuf
				if acc {
					dst = e.f32("dst", d0, false)
				} else {
					dst = e.nanOut("dst", n)
				}
				tensor.Complete(e.b).Broadcast(dst.win, e.in("s", []float32{s}), acc)
				e.near("Broadcast", dims(n), e.getF(dst), want, bound, tolElem)
			})
		}
	}
}

// ReLU is exact (a max with 0); the input has exact zeros.
func testReLU(e *env) {
	for _, n := range sizes {
		e.tcase("%s", sizeStr(n))(func() {
			x := e.normal(n, 1)
			for i := 0; i < n; i += 5 {
				x[i] = 0
			}
			want := make([]float64, n)
			for i, v := range x {
				want[i] = math.Max(float64(v), 0)
			}
			y := e.nanOut("y", n)
			tensor.Complete(e.b).ReLU(y.win, e.in("x", x))
			e.near("ReLU", dims(n), e.getF(y), want, nil, 0)
		})
	}
}

// ReLUBackward: dx = dy where y > 0 (y has exact zeros), exact when
// overwriting, tolElem when accumulating.
func testReLUBackward(e *env) {
	for _, n := range sizes {
		for _, acc := range []bool{false, true} {
			e.tcase("%s accumulate=%v", sizeStr(n), acc)(func() {
				e.alignedOdd(n)
				y, dy, d0 := e.normal(n, 1), e.normal(n, 1), e.normal(n, 1)
				for i := range y {
					y[i] = max(y[i], 0)
				}
				want, bound := make([]float64, n), make([]float64, n)
				for i := range y {
					if y[i] > 0 {
						want[i] = float64(dy[i])
					}
					bound[i] = math.Abs(want[i])
					if acc {
						want[i] += float64(d0[i])
						bound[i] += math.Abs(float64(d0[i]))
					}
				}
				var dx *dbuf
				if acc {
					dx = e.f32("dx", d0, false)
				} else {
					dx = e.nanOut("dx", n)
				}
				tensor.Complete(e.b).ReLUBackward(dx.win, e.in("dy", dy), e.in("y", y), acc)
				e.near("ReLUBackward", dims(n), e.getF(dx), want, bound, tolElem)
			})
		}
	}
}

// MatMul: all transpose combinations, beta 0 (the output holds NaN and must
// not be read) and 1, alpha 1 and -0.5; tolAcc relative to
// |alpha|·Σ|a·b| + |beta·c|.
func testMatMul(e *env) {
	shapes := [][3]int{{1, 1, 1}, {7, 33, 257}, {33, 1, 7}, {1, 257, 33}, {64, 10, 500}, {65, 33, 1000}, {2, 3, 1}, {128, 64, 64}}
	for _, s := range shapes {
		m, n, k := s[0], s[1], s[2]
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, ab := range [][2]float32{{1, 0}, {1, 1}, {-0.5, 1}, {2, 0}} {
					alpha, beta := ab[0], ab[1]
					e.tcase("m=%d n=%d k=%d transA=%v transB=%v alpha=%g beta=%g", m, n, k, ta, tb, alpha, beta)(func() {
						a, b := e.normal(m*k, 1), e.normal(k*n, 1)
						var c *dbuf
						var c0 []float32
						if beta == 0 {
							c = e.nanOut("c", m*n)
						} else {
							c0 = e.normal(m*n, 1)
							c = e.f32("c", c0, false)
						}
						want, bound := refMatMul(a, b, c0, m, n, k, ta, tb, float64(alpha), float64(beta))
						e.b.MatMul(c.win, e.in("a", a), e.in("b", b), m, n, k, ta, tb, alpha, beta)
						e.near("MatMul", dims(m, n), e.getF(c), want, bound, tolAcc)
					})
				}
			}
		}
	}
}

// AddBias: y[o,c,i] += bias[c], tolElem.
func testAddBias(e *env) {
	for _, s := range [][3]int{{1, 1, 1}, {7, 33, 1}, {3, 20, 257}, {64, 10, 1}, {2, 5, 1000}, {1, 1000, 7}, {4, 50, 64}} {
		outer, ch, inner := s[0], s[1], s[2]
		e.tcase("outer=%d channels=%d inner=%d", outer, ch, inner)(func() {
			y0, bias := e.normal(outer*ch*inner, 1), e.normal(ch, 1)
			want, bound := make([]float64, len(y0)), make([]float64, len(y0))
			for o := 0; o < outer; o++ {
				for c := 0; c < ch; c++ {
					for i := 0; i < inner; i++ {
						j := (o*ch+c)*inner + i
						want[j] = float64(y0[j]) + float64(bias[c])
						bound[j] = math.Abs(float64(y0[j])) + math.Abs(float64(bias[c]))
					}
				}
			}
			y := e.f32("y", y0, false)
			tensor.Complete(e.b).AddBias(y.win, e.in("bias", bias), outer, ch, inner)
			e.near("AddBias", dims(outer, ch, inner), e.getF(y), want, bound, tolElem)
		})
	}
}

// BiasGrad: db[c] = Σ dy[o,c,i] (+ db), tolAcc relative to Σ|dy| (+|db|).
func testBiasGrad(e *env) {
	for _, s := range [][3]int{{1, 1, 1}, {7, 33, 1}, {3, 20, 257}, {64, 10, 1}, {2, 5, 1000}, {1, 1000, 7}, {64, 50, 64}} {
		outer, ch, inner := s[0], s[1], s[2]
		for _, acc := range []bool{false, true} {
			e.tcase("outer=%d channels=%d inner=%d accumulate=%v", outer, ch, inner, acc)(func() {
				dy, d0 := e.normal(outer*ch*inner, 1), e.normal(ch, 1)
				want, bound := make([]float64, ch), make([]float64, ch)
				for o := 0; o < outer; o++ {
					for c := 0; c < ch; c++ {
						for i := 0; i < inner; i++ {
							v := float64(dy[(o*ch+c)*inner+i])
							want[c] += v
							bound[c] += math.Abs(v)
						}
					}
				}
				var db *dbuf
				if acc {
					for c := range want {
						want[c] += float64(d0[c])
						bound[c] += math.Abs(float64(d0[c]))
					}
					db = e.f32("db", d0, false)
				} else {
					db = e.nanOut("db", ch)
				}
				tensor.Complete(e.b).BiasGrad(db.win, e.in("dy", dy), outer, ch, inner, acc)
				e.near("BiasGrad", dims(ch), e.getF(db), want, bound, tolAcc)
			})
		}
	}
}

// ReduceChannels: dst[c] = Σ or mean of x[o,c,i] (+ dst for sums), tolAcc
// relative to Σ|x| (+|dst|), or its mean. The shapes: one element, odd
// channel counts, rows no multiple of 4 (a device's one-float path) and
// multiples of 4 (its float4 path, on aligned and unaligned buffers), one
// outer row, rows too short for a device's one-pass kernel (1 and 3), a
// huge outer axis, channels whose 2e5 elements span many blocks (ResNet's
// 28×28 rows), and few channels of long rows.
func testReduceChannels(e *env) {
	shapes := [][3]int{{1, 1, 1}, {1, 7, 13}, {5, 3, 8}, {3, 33, 7}, {64, 10, 1}, {9, 4, 3}, {2, 5, 1000},
		{40000, 3, 9}, {256, 3, 784}, {3, 2, 70001}, {2, 1, 65536},
		// float4 rows of a channel: several a warp, and more channels
		// than the GPU's per-channel join splits
		{1000, 4, 132}, {3, 700, 256},
		// rows just past 128 float4 (the per-channel kernel's seven a
		// lane) and of 49 (ResNet-9's 14x14 images), an odd count of them
		{7, 3, 516}, {5, 3, 196}}
	for _, sh := range shapes {
		outer, ch, inner := sh[0], sh[1], sh[2]
		for _, v := range []struct {
			op      tensor.ReduceOp
			acc, al bool
			opName  string
		}{{tensor.ReduceSum, false, true, "sum"}, {tensor.ReduceSum, true, false, "sum"}, {tensor.ReduceMean, false, true, "mean"}, {tensor.ReduceMean, false, false, "mean"}} {
			e.tcase("outer=%d channels=%d inner=%d %s accumulate=%v aligned=%v", outer, ch, inner, v.opName, v.acc, v.al)(func() {
				e.aligned16 = v.al
				x, d0 := e.normal(outer*ch*inner, 1), e.normal(ch, 1)
				want, bound := make([]float64, ch), make([]float64, ch)
				for o := 0; o < outer; o++ {
					for c := 0; c < ch; c++ {
						for _, f := range x[(o*ch+c)*inner : (o*ch+c+1)*inner] {
							want[c] += float64(f)
							bound[c] += math.Abs(float64(f))
						}
					}
				}
				var dst *dbuf
				switch {
				case v.acc:
					for c := range want {
						want[c] += float64(d0[c])
						bound[c] += math.Abs(float64(d0[c]))
					}
					dst = e.f32("dst", d0, false)
				default:
					dst = e.nanOut("dst", ch)
				}
				if v.op == tensor.ReduceMean {
					for c := range want {
						want[c] /= float64(outer * inner)
						bound[c] /= float64(outer * inner)
					}
				}
				tensor.Complete(e.b).ReduceChannels(v.op, dst.win, e.in("x", x), outer, ch, inner, v.acc)
				e.near("ReduceChannels", dims(ch), e.getF(dst), want, bound, tolAcc)
			})
		}
	}
}

// convCases cover stride 1 and 2, padding 0, 1 and 2, non-square inputs
// and kernels, C > 1, K > 1, output sizes that are floors, 1×1 kernels,
// kernels as large as the padded input, LeNet's two layers, a batch larger
// than a GPU grid's image blocks, and padding wider than the kernel.
var convCases = []tensor.ConvGeom{
	{N: 1, C: 1, H: 5, W: 5, K: 1, R: 3, S: 3, StrideH: 1, StrideW: 1},
	{N: 2, C: 3, H: 7, W: 9, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	{N: 2, C: 3, H: 9, W: 7, K: 5, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	{N: 3, C: 2, H: 8, W: 11, K: 3, R: 5, S: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2},
	{N: 2, C: 1, H: 7, W: 7, K: 2, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 2, PadW: 2},
	{N: 2, C: 4, H: 10, W: 7, K: 6, R: 3, S: 2, StrideH: 2, StrideW: 1, PadH: 2, PadW: 0},
	{N: 2, C: 3, H: 6, W: 6, K: 2, R: 1, S: 1, StrideH: 2, StrideW: 2},
	{N: 1, C: 2, H: 4, W: 4, K: 3, R: 4, S: 4, StrideH: 1, StrideW: 1},
	{N: 1, C: 2, H: 3, W: 2, K: 3, R: 5, S: 4, StrideH: 2, StrideW: 1, PadH: 1, PadW: 1},
	{N: 5, C: 7, H: 33, W: 1, K: 3, R: 3, S: 1, StrideH: 2, StrideW: 1, PadH: 1},
	{N: 4, C: 1, H: 28, W: 28, K: 20, R: 5, S: 5, StrideH: 1, StrideW: 1},
	{N: 3, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1},
	{N: 260, C: 9, H: 7, W: 5, K: 6, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 2},
	{N: 2, C: 8, H: 6, W: 9, K: 3, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 3},
}

func geomStr(g tensor.ConvGeom) string {
	return fmt.Sprintf("x [%d,%d,%d,%d] w [%d,%d,%d,%d] stride %d,%d pad %d,%d", g.N, g.C, g.H, g.W, g.K, g.C, g.R, g.S, g.StrideH, g.StrideW, g.PadH, g.PadW)
}

// Conv2d: tolAcc relative to Σ|x·w| + |bias|; with and without bias.
func testConv2d(e *env) {
	for _, g := range convCases {
		if g.OutH() != (g.H+2*g.PadH-g.R)/g.StrideH+1 || g.OutW() != (g.W+2*g.PadW-g.S)/g.StrideW+1 {
			e.fail("ConvGeom %s: OutH/OutW %d,%d", geomStr(g), g.OutH(), g.OutW())
		}
		for variant := range 3 {
			withBias, relu := variant != 1, variant == 2
			e.tcase("%s bias=%v relu=%v", geomStr(g), withBias, relu)(func() {
				x, w := e.normal(g.N*g.C*g.H*g.W, 1), e.normal(g.K*g.C*g.R*g.S, 1)
				var bias []float32
				var bb tensor.Buffer
				if withBias {
					bias = e.normal(g.K, 1)
					bb = e.in("bias", bias)
				}
				want, bound := refConv(x, w, bias, g)
				if relu { // the fused ReLU; a value within the bound of 0 may land on either side
					for i, v := range want {
						want[i] = max(v, 0)
					}
				}
				gg := g
				gg.ReLU = relu
				y := e.nanOut("y", len(want))
				e.b.Conv2d(y.win, e.in("x", x), e.in("w", w), bb, gg)
				e.near("Conv2d y", dims(g.N, g.K, g.OutH(), g.OutW()), e.getF(y), want, bound, tolAcc)
			})
		}
	}
}

// Conv2dBackward: dx is overwritten (it holds NaN before), dw and db are
// added into (they hold random values before); each of them may be empty.
// tolAcc relative to the sums of the magnitudes of the terms.
func testConv2dBackward(e *env) {
	variants := []struct {
		what        string
		dx, dw, db  bool
		throughReLU bool
	}{
		{"dx dw db", true, true, true, false}, {"dx", true, false, false, false},
		{"dw db", false, true, true, false}, {"dw", false, true, false, false},
		{"dx dw db through ReLU", true, true, true, true}, {"dw through ReLU", false, true, false, true},
		{"db through ReLU", false, false, true, true}, {"dx dw through ReLU", true, true, false, true},
	}
	for _, g := range convCases {
		for _, v := range variants {
			e.tcase("%s computing %s", geomStr(g), v.what)(func() {
				x, w := e.normal(g.N*g.C*g.H*g.W, 1), e.normal(g.K*g.C*g.R*g.S, 1)
				dy := e.normal(g.N*g.K*g.OutH()*g.OutW(), 1)
				dw0, db0 := e.normal(len(w), 1), e.normal(g.K, 1)
				// Through the fused ReLU, dy counts only where the forward
				// output y is positive; y is random here, only its sign matters.
				dyRef, gg := dy, g
				var yb tensor.Buffer
				if v.throughReLU {
					y := e.normal(len(dy), 1)
					yb = e.in("y", y)
					dyRef = make([]float32, len(dy))
					for i := range dy {
						if y[i] > 0 {
							dyRef[i] = dy[i]
						}
					}
					gg.ReLU = true
				}
				r := refConvBackward(dyRef, x, w, g)
				checkConvBackward(e, v.dx, v.dw, v.db, dy, x, w, yb, gg, r, dw0, db0)
			})
		}
	}
}

// poolCases: k2 s2 (LeNet), odd sizes whose output is a floor, k3 s2
// (overlapping windows), k2 s1, rectangular windows and strides.
var poolCases = []tensor.PoolGeom{
	{N: 2, C: 3, H: 8, W: 8, KH: 2, KW: 2, StrideH: 2, StrideW: 2},
	{N: 2, C: 3, H: 7, W: 9, KH: 2, KW: 2, StrideH: 2, StrideW: 2},
	{N: 1, C: 4, H: 9, W: 7, KH: 3, KW: 3, StrideH: 2, StrideW: 2},
	{N: 2, C: 2, H: 6, W: 5, KH: 2, KW: 2, StrideH: 1, StrideW: 1},
	{N: 1, C: 1, H: 1, W: 1, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
	{N: 3, C: 5, H: 33, W: 17, KH: 3, KW: 2, StrideH: 2, StrideW: 1},
	{N: 4, C: 20, H: 24, W: 24, KH: 2, KW: 2, StrideH: 2, StrideW: 2},
	{N: 7, C: 50, H: 8, W: 8, KH: 2, KW: 2, StrideH: 2, StrideW: 2},
}

func poolStr(g tensor.PoolGeom) string {
	return fmt.Sprintf("x [%d,%d,%d,%d] window %dx%d stride %d,%d", g.N, g.C, g.H, g.W, g.KH, g.KW, g.StrideH, g.StrideW)
}

// MaxPool2d: maxima and argmax indices are exact. Inputs: distinct values,
// all-negative values (a maximum initialised to 0 would be wrong), and
// small integers with many ties (the first maximum in row-major order
// wins, as in PyTorch).
func testMaxPool2d(e *env) {
	for _, g := range poolCases {
		if g.OutH() != (g.H-g.KH)/g.StrideH+1 || g.OutW() != (g.W-g.KW)/g.StrideW+1 {
			e.fail("PoolGeom %s: OutH/OutW %d,%d", poolStr(g), g.OutH(), g.OutW())
		}
		for _, kind := range []string{"distinct", "negative", "ties"} {
			e.tcase("%s %s", poolStr(g), kind)(func() {
				n := g.N * g.C * g.H * g.W
				var x []float32
				switch kind {
				case "distinct":
					x = e.distinct(n)
				case "negative":
					x = e.uniform(n, -20, -10)
				case "ties":
					x = make([]float32, n)
					for i := range x {
						x[i] = float32(e.rng.IntN(3))
					}
				}
				wantY, wantI := refPool(x, g)
				y := e.nanOut("y", len(wantY))
				idx := e.i32("argmax", fillI(len(wantI), -1), false)
				tensor.Complete(e.b).MaxPool2d(y.win, idx.win, e.in("x", x), g)
				shape := dims(g.N, g.C, g.OutH(), g.OutW())
				e.exactF("MaxPool2d y", shape, e.getF(y), wantY)
				exactI(e, "MaxPool2d argmax", shape, e.getI(idx), wantI)
			})
		}
	}
}

func fillI(n int, v int32) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// MaxPool2dBackward: routes dy to the argmax positions (given, taken from
// the reference), summing where overlapping windows share a maximum;
// overwrite (dx holds NaN before) or accumulate; tolElem relative to the
// sum of the magnitudes routed to each element.
func testMaxPool2dBackward(e *env) {
	for _, g := range poolCases {
		for _, acc := range []bool{false, true} {
			for _, kind := range []string{"distinct", "ties"} {
				e.tcase("%s %s accumulate=%v", poolStr(g), kind, acc)(func() {
					n := g.N * g.C * g.H * g.W
					x := e.distinct(n)
					if kind == "ties" { // many windows share their maximum
						for i := range x {
							x[i] = float32(e.rng.IntN(2))
						}
					}
					_, idx := refPool(x, g)
					dy := e.normal(len(idx), 1)
					var dx *dbuf
					var dx0 []float32
					if acc {
						dx0 = e.normal(n, 1)
						dx = e.f32("dx", dx0, false)
					} else {
						dx = e.nanOut("dx", n)
					}
					want, bound := refPoolBackward(dy, idx, dx0, g)
					tensor.Complete(e.b).MaxPool2dBackward(dx.win, e.in("dy", dy), e.i32("argmax", idx, true).win, g, acc)
					e.near("MaxPool2dBackward dx", dims(g.N, g.C, g.H, g.W), e.getF(dx), want, bound, tolElem)
				})
			}
		}
	}
}

// CrossEntropy: loss and gradient, with and without the gradient, for
// ordinary logits and for large ones (±80, ±300) that overflow exp in
// float32 unless the row maximum is subtracted. Tolerances: see refCE.
func testCrossEntropy(e *env) {
	type ceCase struct {
		n, classes int
		kind       string
	}
	cases := []ceCase{
		{1, 1, "normal"}, {1, 10, "normal"}, {7, 10, "normal"}, {64, 10, "normal"}, {33, 257, "normal"},
		{3, 1000, "normal"}, {1025, 10, "normal"}, {2, 2, "normal"},
		{16, 10, "±80"}, {5, 1000, "±80"}, {16, 10, "±300"}, {8, 10, "far"}, {4, 7, "equal"},
	}
	for _, c := range cases {
		for _, withGrad := range []bool{true, false} {
			e.tcase("n=%d classes=%d logits %s gradient=%v", c.n, c.classes, c.kind, withGrad)(func() {
				z := e.normal(c.n*c.classes, 3)
				lab := e.labels(c.n, c.classes)
				switch c.kind {
				case "±80":
					z = e.uniform(c.n*c.classes, -80, 80)
				case "±300":
					z = e.uniform(c.n*c.classes, -300, 300)
				case "far": // every logit ±80, the label on a -80: loss ≈ 160
					for i := range z {
						z[i] = 80
						if e.rng.IntN(2) == 0 {
							z[i] = -80
						}
					}
					for r := range lab {
						z[r*c.classes+int(lab[r])] = -80
						z[r*c.classes+(int(lab[r])+1)%c.classes] = 80
					}
				case "equal": // all logits equal: loss = log(classes)
					z = fill(c.n*c.classes, 50)
				}
				loss, lossB, dz, dzB := refCE(z, lab, c.n, c.classes)
				lb := e.nanOut("loss", 1)
				var dl *dbuf
				var dlb tensor.Buffer
				if withGrad {
					dl = e.nanOut("dlogits", len(z))
					dlb = dl.win
				}
				tensor.Complete(e.b).CrossEntropy(lb.win, dlb, e.in("logits", z), e.i32("labels", lab, true).win, c.n, c.classes)
				e.near("CrossEntropy loss", dims(1), e.getF(lb), []float64{loss}, []float64{lossB}, tolAcc)
				if withGrad {
					e.near("CrossEntropy dlogits", dims(c.n, c.classes), e.getF(dl), dz, dzB, tolAcc)
				}
			})
		}
	}
}

// Argmax: exact. Rows have a unique maximum, except in the ties case where
// the first maximum must win (as torch.argmax documents).
func testArgmax(e *env) {
	for _, s := range [][2]int{{1, 1}, {7, 10}, {33, 257}, {5, 1000}, {64, 10}, {3, 1025}, {1000, 3}} {
		rows, cols := s[0], s[1]
		for _, ties := range []bool{false, true} {
			e.tcase("rows=%d cols=%d ties=%v", rows, cols, ties)(func() {
				x := e.normal(rows*cols, 1)
				want := make([]int32, rows)
				for r := range want {
					row := x[r*cols : (r+1)*cols]
					if ties {
						for i := range row {
							row[i] = float32(e.rng.IntN(3)) - 5
						}
						best := 0
						for i, v := range row {
							if v > row[best] {
								best = i
							}
						}
						want[r] = int32(best)
						continue
					}
					at := e.rng.IntN(cols)
					m := row[0]
					for _, v := range row {
						m = max(m, v)
					}
					row[at] = m + 1
					want[r] = int32(at)
				}
				dst := e.i32("dst", fillI(rows, -1), false)
				tensor.Complete(e.b).Argmax(dst.win, e.in("x", x), rows, cols)
				exactI(e, "Argmax", dims(rows), e.getI(dst), want)
			})
		}
	}
}

// SGD: torch.optim.SGD semantics (see refSGD). With momentum the buffer
// holds NaN before a first step, which must overwrite it without reading
// it; without momentum v is an empty buffer. tolElem relative to the same
// update computed on absolute values (a handful of roundings).
func testSGD(e *env) {
	hs := []tensor.SGDStep{
		{LR: 0.1},
		{LR: 0.1, FirstStep: true},
		{LR: 0.05, WeightDecay: 0.01},
		{LR: 0.01, Momentum: 0.9, FirstStep: true},
		{LR: 0.01, Momentum: 0.9},
		{LR: 0.01, Momentum: 0.9, Dampening: 0.1, FirstStep: true},
		{LR: 0.01, Momentum: 0.9, Dampening: 0.1},
		{LR: 0.01, Momentum: 0.9, Nesterov: true, FirstStep: true},
		{LR: 0.01, Momentum: 0.9, Nesterov: true},
		{LR: 0.01, Momentum: 0.9, WeightDecay: 1e-4},
		{LR: 0.01, Momentum: 0.9, WeightDecay: 0.01, FirstStep: true},
		{LR: 0.02, Momentum: 0.5, Dampening: 0.5, WeightDecay: 0.001},
		{LR: 0.01, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4},
		{LR: 0.1, ZeroGrad: true},
		{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4, ZeroGrad: true},
	}
	for _, n := range sizes[:6] {
		for _, h := range hs {
			e.tcase("%s %+v", sizeStr(n), h)(func() {
				p0, g := e.normal(n, 1), e.normal(n, 1)
				v0 := e.normal(n, 1)
				pn, vn, pB, vB := refSGD(p0, g, v0, h)
				p := e.f32("p", p0, false)
				var v *dbuf
				var vb tensor.Buffer
				if h.Momentum != 0 {
					if h.FirstStep {
						v = e.nanOut("v", n)
					} else {
						v = e.f32("v", v0, false)
					}
					vb = v.win
				}
				gb := e.f32("g", g, !h.ZeroGrad) // an input, unless the step zeroes it
				tensor.Complete(e.b).SGD(p.win, gb.win, vb, h)
				e.near("SGD p", dims(n), e.getF(p), pn, pB, tolElem)
				if h.ZeroGrad {
					e.near("SGD zeroed gradient", dims(n), e.getF(gb), make([]float64, n), make([]float64, n), 0)
				}
				if v != nil {
					e.near("SGD momentum", dims(n), e.getF(v), vn, vB, tolElem)
				}
			})
		}
	}
}

// GatherNormalize: row i of dst = src[idx[i]]·scale + shift. Exact for
// scale 1, shift 0; otherwise one multiply and one add (maybe fused):
// tolElem relative to |v·scale| + |shift|.
func testGatherNormalize(e *env) {
	type gcase struct{ rows, rowLen, batch int }
	for _, c := range []gcase{{10, 784, 64}, {1, 1, 1}, {50, 7, 33}, {300, 3, 1000}, {1000, 1, 257}} {
		for _, ss := range [][2]float32{{1, 0}, {1.0 / 255, 0}, {1.0 / (255 * 0.3081), -0.1307 / 0.3081}} {
			scale, shift := ss[0], ss[1]
			e.tcase("rows=%d rowLen=%d batch=%d scale=%g shift=%g", c.rows, c.rowLen, c.batch, scale, shift)(func() {
				src := make([]uint8, c.rows*c.rowLen)
				for i := range src {
					src[i] = uint8(e.rng.IntN(256))
				}
				src[len(src)-1] = 255
				idx := make([]int32, c.batch)
				for i := range idx {
					idx[i] = int32(e.rng.IntN(c.rows))
				}
				idx[len(idx)-1] = int32(c.rows - 1)
				want, bound := make([]float64, c.batch*c.rowLen), make([]float64, c.batch*c.rowLen)
				for i, r := range idx {
					for j := 0; j < c.rowLen; j++ {
						v := float64(src[int(r)*c.rowLen+j]) * float64(scale)
						want[i*c.rowLen+j] = v + float64(shift)
						bound[i*c.rowLen+j] = math.Abs(v) + math.Abs(float64(shift))
					}
				}
				dst := e.nanOut("dst", len(want))
				tensor.Complete(e.b).GatherNormalize(dst.win, e.u8("src", src, true).win, e.i32("idx", idx, true).win, c.rowLen, scale, shift)
				got := e.getF(dst)
				if scale == 1 && shift == 0 {
					wf := make([]float32, len(want))
					for i, v := range want {
						wf[i] = float32(v)
					}
					e.exactF("GatherNormalize", dims(c.batch, c.rowLen), got, wf)
				} else {
					e.near("GatherNormalize", dims(c.batch, c.rowLen), got, want, bound, tolElem)
				}
			})
		}
	}
}
