package tensortest

import (
	"math"
	"slices"

	"github.com/ember-ml/ember/tensor"
)

// softmaxShapes are [outer, n, inner] views: rows (inner 1) short and long
// (one warp, several, more than a block; rows of up to 512, or of up to
// 1024 a multiple of 4, are held in registers on the GPU, 256 and 300 fill
// such rows exactly and partly; rows of a multiple of 4 go in groups of
// four, 16-byte aligned when they are a multiple of 8 here, see alignRows),
// columns (inner > 1) and a single element.
// underflowBound, times tolAcc, is 2e-38, above the smallest normal float32.
const underflowBound = 2e-33

var softmaxShapes = [][3]int{{1, 1, 1}, {7, 10, 1}, {3, 1000, 1}, {64, 33, 1}, {2, 4099, 1}, {4, 256, 1}, {3, 300, 1}, {5, 7, 3}, {2, 33, 257}, {1, 2, 1000}, {9, 1, 5},
	{6, 96, 1}, {5, 100, 1}, {3, 384, 1}, {2, 772, 1}, {2, 1024, 1}, {2, 1028, 1}, {2, 2048, 1}}

// alignRows makes the current case's buffers 16-byte aligned when rows of
// n are a multiple of 8 long, so that a device's aligned path is tested;
// others lie anywhere.
func (e *env) alignRows(n int) { e.aligned16 = n%8 == 0 }

// refSoftmax is softmax (or log-softmax) of x [outer, n, inner] over the
// middle axis in float64, with each element's error bound: a float32
// device computes x - max with an absolute error of u·|x - max|, which the
// exponential turns into a relative one, so softmax is bounded by
// |y|·(1 + |x - max|) and log-softmax by |x - max| + |log Σ|.
func refSoftmax(x []float32, outer, n, inner int, log bool) (y, bound []float64) {
	y, bound = make([]float64, len(x)), make([]float64, len(x))
	for o := 0; o < outer; o++ {
		for r := 0; r < inner; r++ {
			at := func(i int) int { return (o*n+i)*inner + r }
			m := math.Inf(-1)
			for i := 0; i < n; i++ {
				m = math.Max(m, float64(x[at(i)]))
			}
			s := 0.0
			for i := 0; i < n; i++ {
				s += math.Exp(float64(x[at(i)]) - m)
			}
			for i := 0; i < n; i++ {
				d := float64(x[at(i)]) - m
				if log {
					y[at(i)] = d - math.Log(s)
					// log s carries the sum's relative rounding error as an
					// absolute one (δs/s), however small log s is: hence
					// the 1 (when the maximum dominates, log s is tiny).
					bound[at(i)] = math.Abs(d) + math.Abs(math.Log(s)) + 1
				} else {
					y[at(i)] = math.Exp(d) / s
					bound[at(i)] = y[at(i)]*(1+math.Abs(d)) + underflowBound
				}
			}
		}
	}
	return y, bound
}

// Softmax and log-softmax over every shape, on normal inputs and on inputs
// spread over ±80 (where an unshifted exponential would overflow); tolAcc of
// refSoftmax's bounds (a sum of n exponentials rounds as any sum).
func testSoftmax(e *env) {
	for _, s := range softmaxShapes {
		outer, n, inner := s[0], s[1], s[2]
		for _, log := range []bool{false, true} {
			for _, spread := range []float64{1, 80} {
				e.tcase("outer=%d n=%d inner=%d log=%v spread=%g", outer, n, inner, log, spread)(func() {
					x := e.uniform(outer*n*inner, -spread, spread)
					want, bound := refSoftmax(x, outer, n, inner, log)
					e.alignRows(n)
					y := e.nanOut("y", len(x))
					e.b.Softmax(y.win, e.in("x", x), outer, n, inner, log)
					e.near("Softmax", dims(outer, n, inner), e.getF(y), want, bound, tolAcc)
				})
			}
		}
	}
}

// SoftmaxBackward from a float32 forward output y (rounded from the float64
// reference, as a device stores it): dx = y·(dy - Σ dy·y), or dy - e^y·Σ dy
// for log-softmax, overwritten or accumulated. The bound is the sum of the
// magnitudes of the terms (e^y with a relative error of u·|y| for the log
// case), tolAcc.
func testSoftmaxBackward(e *env) {
	for _, s := range softmaxShapes {
		outer, n, inner := s[0], s[1], s[2]
		for _, log := range []bool{false, true} {
			for _, acc := range []bool{false, true} {
				e.tcase("outer=%d n=%d inner=%d log=%v accumulate=%v", outer, n, inner, log, acc)(func() {
					total := outer * n * inner
					y64, _ := refSoftmax(e.normal(total, 2), outer, n, inner, log)
					y := make([]float32, total)
					for i, v := range y64 {
						y[i] = float32(v)
					}
					dy := e.normal(total, 1)
					want, bound := make([]float64, total), make([]float64, total)
					for o := 0; o < outer; o++ {
						for r := 0; r < inner; r++ {
							at := func(i int) int { return (o*n+i)*inner + r }
							s, sAbs := 0.0, 0.0
							for i := 0; i < n; i++ {
								g, v := float64(dy[at(i)]), float64(y[at(i)])
								if log {
									s, sAbs = s+g, sAbs+math.Abs(g)
								} else {
									s, sAbs = s+g*v, sAbs+math.Abs(g*v)
								}
							}
							for i := 0; i < n; i++ {
								g, v := float64(dy[at(i)]), float64(y[at(i)])
								if log {
									want[at(i)] = g - math.Exp(v)*s
									bound[at(i)] = math.Abs(g) + math.Exp(v)*sAbs*(1+math.Abs(v))
								} else {
									want[at(i)] = v * (g - s)
									bound[at(i)] = math.Abs(v) * (math.Abs(g) + sAbs)
								}
							}
						}
					}
					var dx *dbuf
					if acc {
						d0 := e.normal(total, 1)
						for i, v := range d0 {
							want[i] += float64(v)
							bound[i] += math.Abs(float64(v))
						}
						dx = e.f32("dx", d0, false)
					} else {
						dx = e.nanOut("dx", total)
					}
					e.b.SoftmaxBackward(dx.win, e.in("dy", dy), e.in("y", y), outer, n, inner, log, acc)
					e.near("SoftmaxBackward", dims(outer, n, inner), e.getF(dx), want, bound, tolAcc)
				})
			}
		}
	}
}

// causalSoftmaxShapes are [batch, t, n] causal score matrices: more keys
// than queries, fewer (the last queries keep every key), rows held in
// registers on the GPU (n ≤ 512) and longer ones.
var causalSoftmaxShapes = [][3]int{{3, 5, 6}, {2, 7, 4}, {1, 1, 1}, {2, 64, 256}, {1, 40, 600}, {2, 9, 12}, {1, 30, 1100}}

// CausalSoftmax against refSoftmax of each row's kept scores (tolAcc of
// its bounds) with exact zeros after them, and bit for bit against the
// backend's own Softmax of the scores plus a mask of -Inf above the
// diagonal, which it claims to equal.
func testCausalSoftmax(e *env) {
	cs, ok := e.b.(tensor.CausalSoftmaxBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.CausalSoftmaxBackend", e.b.Name())
	}
	for _, sh := range causalSoftmaxShapes {
		batch, t, n := sh[0], sh[1], sh[2]
		for _, spread := range []float64{1, 80} {
			e.tcase("batch=%d t=%d n=%d spread=%g", batch, t, n, spread)(func() {
				rows := batch * t
				x := e.uniform(rows*n, -spread, spread)
				want, bound := make([]float64, len(x)), make([]float64, len(x))
				masked := slices.Clone(x)
				for r := range rows {
					kept := min(r%t+1, n)
					w, b := refSoftmax(x[r*n:r*n+kept], 1, kept, 1, false)
					copy(want[r*n:], w)
					copy(bound[r*n:], b)
					for j := kept; j < n; j++ {
						masked[r*n+j] = float32(math.Inf(-1))
					}
				}
				e.alignRows(n)
				y := e.nanOut("y", len(x))
				cs.CausalSoftmax(y.win, e.in("x", x), rows, t, n)
				got := e.getF(y)
				e.near("CausalSoftmax", dims(rows, n), got, want, bound, tolAcc)
				ym := e.nanOut("y masked", len(x))
				e.b.Softmax(ym.win, e.in("x masked", masked), rows, n, 1, false)
				e.exactF("CausalSoftmax against Softmax of the masked scores", dims(rows, n), got, e.getF(ym))
			})
		}
	}
}
