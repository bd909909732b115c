package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Batch norm with its activation (tensor.BatchNormActBackend), against the
// float64 references of norm.go and elementwise.go: y = f(z) for the
// normalised z, and the backward pass of g = dy·f'(z). The backward
// reference takes z as the backends round it from the given statistics
// (normalized32), so that ReLU's mask is theirs; the derivative is then
// evaluated in float64.

// bnActs are the activations BatchNormAct takes, with their references.
var bnActs = []tensor.UnaryOp{tensor.OpIdentity, tensor.OpReLU, tensor.OpGELU, tensor.OpGELUTanh}

// unaryRef is unaryCases' entry of op.
func unaryRef(op tensor.UnaryOp) unaryCase {
	for _, u := range unaryCases {
		if u.op == op {
			return u
		}
	}
	panic("tensortest: no reference of unary op")
}

// bnActCases: the shapes of bnCases but the largest, and a channel of
// 70k elements: more than any one block holds on chip (a device that
// normalises small channels in one pass takes its other path).
var bnActCases = []bnCase{{2, 3, 35}, {2, 3, 1}, {4, 5, 9}, {64, 3, 49}, {1, 2, 3}, {35, 2, 2000}}

func batchNormActBackend(e *env) tensor.BatchNormActBackend {
	ab, ok := e.b.(tensor.BatchNormActBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.BatchNormActBackend (BatchNormAct runs BatchNorm and the activation)", e.b.Name())
	}
	return ab
}

// normalized32 is z = (x - mean)·inv·w + b as the backends round it.
func normalized32(x, mean, inv, w, b float32) float32 {
	xh := float32(x-mean) * inv
	return float32(xh*w) + b
}

func testBatchNormAct(e *env) {
	ab := batchNormActBackend(e)
	const eps = 1e-5
	for _, cs := range bnActCases {
		for _, act := range bnActs {
			for _, training := range []bool{true, false} {
				for _, affine := range []bool{true, false} {
					if cs.n*cs.inner > 10000 && !affine { // the long channels once per mode
						continue
					}
					ref := unaryRef(act)
					e.tcase("n=%d c=%d inner=%d act=%s training=%v affine=%v", cs.n, cs.c, cs.inner, ref.name, training, affine)(func() {
						e.aligned16 = bnAligned(cs)
						x, w, b := e.bnInputs(cs)
						rm0, rv0 := e.normal(cs.c, 1), e.uniform(cs.c, 0.5, 2)
						if !training { // running statistics near the batch's, so that z has both signs
							for g, idx := range bnGroups(cs.n, cs.c, cs.inner) {
								mu, v := refStats(x, idx)
								rm0[g], rv0[g] = float32(mu+0.3*e.rng.NormFloat64()), float32(v*(0.5+e.rng.Float64()))
							}
						}
						momentum := float32(0.1 + 0.8*e.rng.Float64())
						groups := bnGroups(cs.n, cs.c, cs.inner)
						mean, inv, unbiased := bnForwardStats(x, groups, rm0, rv0, training, eps)
						affW, affB := bnAffine(cs, w, b, affine)
						var wb, bb tensor.Buffer
						if affine {
							wb, bb = e.in("weight", w), e.in("bias", b)
						}
						rm, rv := e.f32("runMean", rm0, !training), e.f32("runVar", rv0, !training)
						y, sm, si := e.nanOut("y", len(x)), e.nanOut("saveMean", cs.c), e.nanOut("saveInvStd", cs.c)
						ab.BatchNormAct(y.win, sm.win, si.win, rm.win, rv.win, e.in("x", x), wb, bb, cs.n, cs.c, cs.inner, training, momentum, eps, act)
						z, boundZ := refNormForward(x, groups, mean, inv, affW, affB)
						// f is 1.13-Lipschitz (GELU's largest slope): z's error
						// passes on at most so, and f rounds a few times at
						// the magnitude of z.
						want, bound := make([]float64, len(z)), make([]float64, len(z))
						for i, v := range z {
							want[i] = ref.f(v, 0, 0)
							bound[i] = 1.2*boundZ[i] + math.Abs(v)
						}
						e.near("BatchNormAct y", dims(cs.n, cs.c, cs.inner), e.getF(y), want, bound, tolElem)
						e.near("BatchNormAct saveMean", dims(cs.c), e.getF(sm), mean, absPlus(mean, 1e-30), tolElem)
						e.near("BatchNormAct saveInvStd", dims(cs.c), e.getF(si), inv, nil, tolElem)
						if training {
							e.checkRunningStats("BatchNormAct", rm, rv, rm0, rv0, mean, unbiased, momentum)
						}
					})
				}
			}
		}
	}
}

func testBatchNormActBackward(e *env) {
	ab := batchNormActBackend(e)
	const eps = 1e-5
	for _, cs := range bnActCases {
		for _, act := range bnActs {
			for _, training := range []bool{true, false} {
				for _, affine := range []bool{true, false} {
					if cs.n*cs.inner > 10000 && !affine {
						continue
					}
					acc := e.rng.IntN(2) == 0
					ref := unaryRef(act)
					e.tcase("n=%d c=%d inner=%d act=%s training=%v affine=%v accumulate=%v", cs.n, cs.c, cs.inner, ref.name, training, affine, acc)(func() {
						e.aligned16 = bnAligned(cs)
						x, w, b := e.bnInputs(cs)
						dy := e.normal(len(x), 1)
						groups := bnGroups(cs.n, cs.c, cs.inner)
						mean, inv := make([]float64, cs.c), make([]float64, cs.c)
						m32, i32 := make([]float32, cs.c), make([]float32, cs.c)
						for g, idx := range groups {
							mu, v := refStats(x, idx)
							if !training {
								mu, v = mu+0.3*e.rng.NormFloat64(), v*(0.5+e.rng.Float64())
							}
							m32[g], i32[g] = float32(mu), float32(1/math.Sqrt(v+eps))
							mean[g], inv[g] = float64(m32[g]), float64(i32[g])
						}
						ch := func(i int) int { return (i / cs.inner) % cs.c }
						affW := func(int) float64 { return 1 }
						w32, b32 := func(int) float32 { return 1 }, func(int) float32 { return 0 }
						var wb, bb tensor.Buffer
						if affine {
							affW = func(i int) float64 { return float64(w[ch(i)]) }
							w32, b32 = func(i int) float32 { return w[ch(i)] }, func(i int) float32 { return b[ch(i)] }
							wb, bb = e.in("weight", w), e.in("bias", b)
						}
						// g = dy·f'(z) at the backends' z, and its bound: |g|,
						// and for the transcendental forms a few roundings at
						// the magnitude of dy·(1 + |z|).
						g, gb := make([]float32, len(x)), make([]float32, len(x))
						for i := range x {
							z := float64(normalized32(x[i], m32[ch(i)], i32[ch(i)], w32(i), b32(i)))
							gv := float64(dy[i]) * ref.df(z, 0, 0)
							g[i] = float32(gv)
							gb[i] = float32(math.Abs(gv))
							if ref.trans {
								gb[i] += float32(math.Abs(float64(dy[i])) * (1 + math.Abs(z)))
							}
						}
						dx0, dw0, db0 := e.normal(len(x), 1), e.normal(cs.c, 1), e.normal(cs.c, 1)
						dx, dw, db := e.gradOut("dx", dx0, acc), e.gradOut("dweight", dw0, acc), e.gradOut("dbias", db0, acc)
						ab.BatchNormActBackward(dx.win, dw.win, db.win, e.in("dy", dy), e.in("x", x), wb, bb, e.in("saveMean", m32), e.in("saveInvStd", i32),
							cs.n, cs.c, cs.inner, training, act, acc, acc, acc)
						wantDx, _ := refNormBackward(x, g, groups, mean, inv, affW, training)
						_, bDx := refNormBackward(x, gb, groups, mean, inv, affW, training)
						wantDx, bDx = accumulated(wantDx, bDx, dx0, acc)
						e.near("BatchNormActBackward dx", dims(cs.n, cs.c, cs.inner), e.getF(dx), wantDx, bDx, tolAcc)
						wantW, wantB, _, _ := refAffineGrads(x, g, groups, mean, inv, cs.c, ch)
						_, _, bW, bB := refAffineGrads(x, gb, groups, mean, inv, cs.c, ch)
						wantW, bW = accumulated(wantW, bW, dw0, acc)
						wantB, bB = accumulated(wantB, bB, db0, acc)
						e.near("BatchNormActBackward dweight", dims(cs.c), e.getF(dw), wantW, bW, tolAcc)
						e.near("BatchNormActBackward dbias", dims(cs.c), e.getF(db), wantB, bB, tolAcc)
						// Only dx wanted (the parameters frozen).
						dx2 := e.nanOut("dx only", len(x))
						ab.BatchNormActBackward(dx2.win, tensor.Buffer{}, tensor.Buffer{}, e.in("dy", dy), e.in("x", x), wb, bb, e.in("saveMean", m32), e.in("saveInvStd", i32),
							cs.n, cs.c, cs.inner, training, act, false, false, false)
						want2, _ := refNormBackward(x, g, groups, mean, inv, affW, training)
						_, b2 := refNormBackward(x, gb, groups, mean, inv, affW, training)
						e.near("BatchNormActBackward dx alone", dims(cs.n, cs.c, cs.inner), e.getF(dx2), want2, b2, tolAcc)
					})
				}
			}
		}
	}
}
