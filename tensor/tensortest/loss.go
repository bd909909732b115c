package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// classLossShapes are [outer, classes, inner] views: torch's [N, C] (inner
// 1: the warp-per-row kernel) with one warp's worth of classes, more than a
// warp, and enough rows for many blocks; and [N, C, d...] (inner > 1: the
// thread-per-target kernel), [3, 11, 4, 2] among them, with enough targets
// for more than one counting block (4096 targets each).
var classLossShapes = [][3]int{{7, 5, 1}, {3, 11, 8}, {1, 1, 1}, {64, 33, 1}, {1025, 10, 1}, {2, 70, 1}, {5, 7, 300}, {3, 4, 2000}}

// refClassLoss is torch's cross entropy in float64, plain loops: per counted
// target t of the (o, r) position, with p = softmax over the classes, the
// loss (1-ε)·(-log p_t) + ε·mean_c(-log p_c) and the gradient p_c - (1-ε)·[c
// = t] - ε/C, both scaled by 1/count for a mean; ignored targets cost
// nothing and get a zero gradient. Bounds: the loss's is the sum of the
// magnitudes of its terms (1 + |m| + |lse| + |x_t| + ε·mean|x| per target);
// a gradient element's is p·(1 + |x - m|) + w (the exponent x - m is
// rounded in float32, which an exponential turns into a relative error of
// u·|x - m|) plus underflowBound for values below float32's normal range.
func refClassLoss(x []float32, lab []int32, s tensor.ClassLossSpec) (loss, lossB float64, dx, dxB []float64) {
	dx, dxB = make([]float64, len(x)), make([]float64, len(x))
	eps, cf := float64(s.Smoothing), float64(s.Classes)
	counted := 0
	for _, t := range lab {
		if !s.Ignore || t != s.IgnoreIndex {
			counted++
		}
	}
	scale := 1.0
	if !s.Sum {
		scale = 1 / float64(counted)
	}
	for o := 0; o < s.Outer; o++ {
		for r := 0; r < s.Inner; r++ {
			t := lab[o*s.Inner+r]
			if s.Ignore && t == s.IgnoreIndex {
				continue
			}
			at := func(c int) int { return (o*s.Classes+c)*s.Inner + r }
			m := math.Inf(-1)
			for c := 0; c < s.Classes; c++ {
				m = math.Max(m, float64(x[at(c)]))
			}
			se, sAbs := 0.0, 0.0
			for c := 0; c < s.Classes; c++ {
				se += math.Exp(float64(x[at(c)]) - m)
				sAbs += math.Abs(float64(x[at(c)]))
			}
			lse := m + math.Log(se)
			for c := 0; c < s.Classes; c++ {
				v := float64(x[at(c)])
				w := eps / cf
				if c == int(t) {
					w += 1 - eps
				}
				loss += w * (lse - v)
				p := math.Exp(v - lse)
				dx[at(c)] = scale * (p - w)
				dxB[at(c)] = scale*(p*(1+math.Abs(v-m))+w) + underflowBound
			}
			lossB += 1 + math.Abs(m) + math.Abs(lse) + math.Abs(float64(x[at(int(t))])) + eps*sAbs/cf
		}
	}
	if s.Sum {
		return loss, lossB, dx, dxB
	}
	return loss / float64(counted), lossB / float64(counted), dx, dxB
}

// testClassLoss checks ClassLossBackend against refClassLoss on every shape
// with smoothing 0 and 0.1, mean and sum, and four ignore settings: none,
// torch's -100 on about a third of the targets, a real class (1) ignored,
// and every target ignored (a mean of NaN, a sum of 0, a zero gradient).
// tolAcc of the bounds: sums of up to a few thousand terms in double. Then
// a second run of a many-block case must give the same bits
// (determinism). Backends without the interface skip.
func testClassLoss(e *env) {
	cl, ok := e.b.(tensor.ClassLossBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.ClassLossBackend", e.b.Name())
	}
	for _, sh := range classLossShapes {
		for _, eps := range []float32{0, 0.1} {
			for _, sum := range []bool{false, true} {
				for _, ignore := range []string{"none", "-100", "class 1", "all"} {
					for _, withGrad := range []bool{true, false} {
						e.tcase("[%d, %d, %d] smoothing=%g sum=%v ignore=%s gradient=%v", sh[0], sh[1], sh[2], eps, sum, ignore, withGrad)(func() {
							s := tensor.ClassLossSpec{Outer: sh[0], Classes: sh[1], Inner: sh[2], Smoothing: eps, Sum: sum}
							n := s.Outer * s.Classes * s.Inner
							x := e.normal(n, 3)
							if sh[1] == 10 { // logits spread over ±80, where an unshifted exponential overflows
								x = e.uniform(n, -80, 80)
							}
							lab := e.labels(s.Outer*s.Inner, s.Classes)
							switch ignore {
							case "-100":
								s.Ignore, s.IgnoreIndex = true, -100
								for i := range lab {
									if e.rng.IntN(3) == 0 {
										lab[i] = -100
									}
								}
							case "class 1":
								s.Ignore, s.IgnoreIndex = true, 1
							case "all":
								s.Ignore, s.IgnoreIndex = true, 3
								for i := range lab {
									lab[i] = 3
								}
							}
							runClassLoss(e, cl, x, lab, s, withGrad)
						})
					}
				}
			}
		}
	}
	e.tcase("determinism [1025, 10, 1] and [3, 4, 2000]")(func() {
		for _, sh := range [][3]int{{1025, 10, 1}, {3, 4, 2000}} {
			s := tensor.ClassLossSpec{Outer: sh[0], Classes: sh[1], Inner: sh[2], Smoothing: 0.1}
			x, lab := e.normal(sh[0]*sh[1]*sh[2], 3), e.labels(sh[0]*sh[2], sh[1])
			xb, lb := e.in("logits", x), e.i32("labels", lab, true).win
			l1, l2 := e.nanOut("loss", 1), e.nanOut("loss", 1)
			d1, d2 := e.nanOut("dlogits", len(x)), e.nanOut("dlogits", len(x))
			cl.ClassLoss(l1.win, d1.win, xb, lb, s)
			cl.ClassLoss(l2.win, d2.win, xb, lb, s)
			e.exactF("ClassLoss loss, second run", dims(1), e.getF(l2), e.getF(l1))
			e.exactF("ClassLoss dlogits, second run", dims(sh[0], sh[1], sh[2]), e.getF(d2), e.getF(d1))
		}
	})
}

// runClassLoss runs one case and compares it with refClassLoss; a wanted
// NaN (the mean over no target) must come out NaN.
func runClassLoss(e *env, cl tensor.ClassLossBackend, x []float32, lab []int32, s tensor.ClassLossSpec, withGrad bool) {
	loss, lossB, dx, dxB := refClassLoss(x, lab, s)
	lb := e.nanOut("loss", 1)
	var dl *dbuf
	var dlb tensor.Buffer
	if withGrad {
		dl = e.nanOut("dlogits", len(x))
		dlb = dl.win
	}
	cl.ClassLoss(lb.win, dlb, e.in("logits", x), e.i32("labels", lab, true).win, s)
	shape := dims(s.Outer, s.Classes, s.Inner)
	if got := e.getF(lb); math.IsNaN(loss) {
		if !math.IsNaN(float64(got[0])) {
			e.fail("ClassLoss loss: got %g, want NaN (a mean over no counted target)", got[0])
		}
	} else {
		e.near("ClassLoss loss", dims(1), got, []float64{loss}, []float64{lossB}, tolAcc)
	}
	if withGrad {
		e.near("ClassLoss dlogits", shape, e.getF(dl), dx, dxB, tolAcc)
	}
}
