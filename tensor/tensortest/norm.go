package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// References of batch and layer normalisation: plain float64 loops over
// the definitions (statistics from scratch, no shared code with the
// backends). Batch norm's "groups" are channels (elements (o, c, i) of
// [n, c, inner]); layer norm's are rows. Both are written once here over a
// list of element indices per group.

// bnGroups lists, per channel, the flat indices of its elements.
func bnGroups(n, c, inner int) [][]int {
	g := make([][]int, c)
	for ch := range g {
		for o := 0; o < n; o++ {
			for i := 0; i < inner; i++ {
				g[ch] = append(g[ch], (o*c+ch)*inner+i)
			}
		}
	}
	return g
}

func lnGroups(rows, cols int) [][]int {
	g := make([][]int, rows)
	for r := range g {
		for j := 0; j < cols; j++ {
			g[r] = append(g[r], r*cols+j)
		}
	}
	return g
}

// refStats returns the mean and the biased variance of x over idx.
func refStats(x []float32, idx []int) (mean, variance float64) {
	for _, i := range idx {
		mean += float64(x[i])
	}
	mean /= float64(len(idx))
	for _, i := range idx {
		d := float64(x[i]) - mean
		variance += d * d
	}
	return mean, variance / float64(len(idx))
}

// refNormForward returns y = (x - mean)/√(var + eps)·w + b with the
// statistics given per group (w, b per element through aff, nil for none)
// and a bound for each y: the magnitudes of the float32 operations, |x| +
// |mean| scaled, plus |b|.
func refNormForward(x []float32, groups [][]int, mean, inv []float64, affW, affB func(i int) float64) (y, bound []float64) {
	y, bound = make([]float64, len(x)), make([]float64, len(x))
	for g, idx := range groups {
		for _, i := range idx {
			w, b := affW(i), affB(i)
			y[i] = (float64(x[i])-mean[g])*inv[g]*w + b
			bound[i] = (math.Abs(float64(x[i]))+math.Abs(mean[g]))*inv[g]*math.Abs(w) + math.Abs(b)
		}
	}
	return y, bound
}

// refNormBackward returns dx for normalisation over groups given dy, the
// statistics, and w per element: with statistics of the batch (stats),
// dx = w·inv·(dy - mean(dy) - x̂·mean(dy·x̂)) over the group; else
// dx = w·inv·dy. bound is w·inv·(|dy| + mean|dy| + |x̂|·mean|dy·x̂|).
func refNormBackward(x, dy []float32, groups [][]int, mean, inv []float64, affW func(i int) float64, stats bool) (dx, bound []float64) {
	dx, bound = make([]float64, len(x)), make([]float64, len(x))
	for g, idx := range groups {
		var sg, sgx, ag, agx float64
		m := float64(len(idx))
		for _, i := range idx {
			d := float64(dy[i]) * affW(i)
			xh := (float64(x[i]) - mean[g]) * inv[g]
			sg += d
			sgx += d * xh
			ag += math.Abs(d)
			agx += math.Abs(d * xh)
		}
		for _, i := range idx {
			d := float64(dy[i]) * affW(i)
			xh := (float64(x[i]) - mean[g]) * inv[g]
			if stats {
				dx[i] = inv[g] * (d - sg/m - xh*sgx/m)
				bound[i] = inv[g] * (math.Abs(d) + ag/m + math.Abs(xh)*agx/m)
			} else {
				dx[i] = inv[g] * d
				bound[i] = math.Abs(dx[i])
			}
		}
	}
	return dx, bound
}

// refAffineGrads returns dw[p] = Σ dy·x̂ and db[p] = Σ dy over the elements
// whose parameter index is param(i), with bounds Σ|·|.
func refAffineGrads(x, dy []float32, groups [][]int, mean, inv []float64, nParam int, param func(i int) int) (dw, db, bw, bb []float64) {
	dw, db, bw, bb = make([]float64, nParam), make([]float64, nParam), make([]float64, nParam), make([]float64, nParam)
	for g, idx := range groups {
		for _, i := range idx {
			p := param(i)
			xh := (float64(x[i]) - mean[g]) * inv[g]
			dw[p] += float64(dy[i]) * xh
			db[p] += float64(dy[i])
			bw[p] += math.Abs(float64(dy[i]) * xh)
			bb[p] += math.Abs(float64(dy[i]))
		}
	}
	return dw, db, bw, bb
}

// accumulated adds d0 to want and |d0| to bound when acc.
func accumulated(want, bound []float64, d0 []float32, acc bool) ([]float64, []float64) {
	if !acc {
		return want, bound
	}
	w, b := append([]float64(nil), want...), append([]float64(nil), bound...)
	for i, v := range d0 {
		w[i] += float64(v)
		b[i] += math.Abs(float64(v))
	}
	return w, b
}

// gradOut is an output buffer for a gradient: NaN when overwritten, d0
// when accumulated.
func (e *env) gradOut(name string, d0 []float32, acc bool) *dbuf {
	if acc {
		return e.f32(name, d0, false)
	}
	return e.nanOut(name, len(d0))
}

func normBackend(e *env) tensor.NormBackend {
	nb, ok := e.b.(tensor.NormBackend)
	if !ok {
		e.t.Skipf("SKIP: backend %s does not implement tensor.NormBackend (BatchNorm and LayerNorm run the host fallback)", e.b.Name())
	}
	return nb
}

// Tolerances of normalisation: the forward pass rounds a few float32
// operations per element (x - mean, ·invStd, ·w, + b) after float32
// statistics, each off by u relative to the magnitudes in the bound:
// tolElem. The saved statistics are float64 sums rounded once: tolElem
// too. Gradients are float64 sums of float32 inputs (the saved
// statistics' rounding enters relative to the bound): tolAcc.

type bnCase struct{ n, c, inner int }

// bnCases: [N, C, H·W] with HW = 7x5 (BatchNorm2d), [N, C] (BatchNorm1d,
// inner 1), [N, C, L], one image (N = 1), a channel of over 8k elements
// (several passes of a block, and on CUDA several blocks whose parts begin
// inside a row), and 64 images of 7x7 (a channel split over two blocks,
// rows shorter than a block), and six elements (fewer than two groups of
// four).
var bnCases = []bnCase{{2, 3, 35}, {2, 3, 1}, {4, 5, 9}, {1, 3, 7}, {8, 2, 1031}, {64, 3, 49}, {1, 2, 3}}

// bnForwardStats is the reference's statistics per channel group: the
// mean and 1/√(var+eps) a forward pass normalises with (the batch's in
// training, the running ones given otherwise) and, in training, the
// unbiased batch variance the running update takes.
func bnForwardStats(x []float32, groups [][]int, rm0, rv0 []float32, training bool, eps float64) (mean, inv, unbiased []float64) {
	mean, inv, unbiased = make([]float64, len(groups)), make([]float64, len(groups)), make([]float64, len(groups))
	for g, idx := range groups {
		mu, v := refStats(x, idx)
		if training {
			mean[g], inv[g] = mu, 1/math.Sqrt(v+eps)
			unbiased[g] = v * float64(len(idx)) / float64(len(idx)-1)
		} else {
			mean[g], inv[g] = float64(rm0[g]), 1/math.Sqrt(float64(rv0[g])+eps)
		}
	}
	return mean, inv, unbiased
}

// bnAffine is the per-element weight and bias of the reference (element i
// of [n, c, inner] takes its channel's), 1 and 0 without affine.
func bnAffine(cs bnCase, w, b []float32, affine bool) (affW, affB func(int) float64) {
	if !affine {
		return func(int) float64 { return 1 }, func(int) float64 { return 0 }
	}
	ch := func(i int) int { return (i / cs.inner) % cs.c }
	return func(i int) float64 { return float64(w[ch(i)]) }, func(i int) float64 { return float64(b[ch(i)]) }
}

// bnAligned says whether a case's buffers are 16-byte aligned (a device may
// take them four at a time): all but rows of 35, which lie anywhere.
func bnAligned(cs bnCase) bool { return cs.inner != 35 }

// bnInputs draws x with a large per-channel offset (so that a one-pass
// variance would lose digits), weight and bias.
func (e *env) bnInputs(cs bnCase) (x, w, b []float32) {
	x = e.normal(cs.n*cs.c*cs.inner, 2)
	for i := range x {
		x[i] += float32(10 * ((i / cs.inner) % cs.c))
	}
	return x, e.normal(cs.c, 1), e.normal(cs.c, 1)
}

func testBatchNorm(e *env) {
	nb := normBackend(e)
	const eps = 1e-5
	for _, cs := range bnCases {
		for _, training := range []bool{true, false} {
			for _, affine := range []bool{true, false} {
				for _, running := range []bool{true, false} {
					if !training && !running {
						continue
					}
					e.tcase("n=%d c=%d inner=%d training=%v affine=%v running=%v", cs.n, cs.c, cs.inner, training, affine, running)(func() {
						e.aligned16 = bnAligned(cs)
						x, w, b := e.bnInputs(cs)
						rm0, rv0 := e.normal(cs.c, 1), e.uniform(cs.c, 0.5, 2)
						momentum := float32(0.1 + 0.8*e.rng.Float64())
						groups := bnGroups(cs.n, cs.c, cs.inner)
						mean, inv, unbiased := bnForwardStats(x, groups, rm0, rv0, training, eps)
						affW, affB := bnAffine(cs, w, b, affine)
						var wb, bb tensor.Buffer
						if affine {
							wb, bb = e.in("weight", w), e.in("bias", b)
						}
						var rmb, rvb *dbuf
						var rmBuf, rvBuf tensor.Buffer
						if running {
							rmb, rvb = e.f32("runMean", rm0, !training), e.f32("runVar", rv0, !training)
							rmBuf, rvBuf = rmb.win, rvb.win
						}
						y, sm, si := e.nanOut("y", len(x)), e.nanOut("saveMean", cs.c), e.nanOut("saveInvStd", cs.c)
						nb.BatchNorm(y.win, sm.win, si.win, rmBuf, rvBuf, e.in("x", x), wb, bb, cs.n, cs.c, cs.inner, training, momentum, eps)
						wantY, boundY := refNormForward(x, groups, mean, inv, affW, affB)
						e.near("BatchNorm y", dims(cs.n, cs.c, cs.inner), e.getF(y), wantY, boundY, tolElem)
						e.near("BatchNorm saveMean", dims(cs.c), e.getF(sm), mean, absPlus(mean, 1e-30), tolElem)
						e.near("BatchNorm saveInvStd", dims(cs.c), e.getF(si), inv, nil, tolElem)
						if training && running {
							e.checkRunningStats("BatchNorm", rmb, rvb, rm0, rv0, mean, unbiased, momentum)
						}
					})
				}
			}
		}
	}
	e.tcase("torch numbers")(func() { batchNormTorchNumbers(e, nb) })
}

// absPlus is |v| + floor per element.
func absPlus(v []float64, floor float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Abs(x) + floor
	}
	return out
}

// batchNormTorchNumbers runs two training steps and one evaluation of
// BatchNorm1d(2) (momentum 0.1, eps 0, no affine) on the batch
// x = [[1, 2], [3, 6]] (N = 2, C = 2), with running statistics starting at
// torch's mean 0, var 1, and checks the values derived by hand:
//
//	channel 0 holds {1, 3}: mean 2, biased var 1, unbiased var 2;
//	channel 1 holds {2, 6}: mean 4, biased var 4, unbiased var 8.
//	y = (x - mean)/√var_biased = [[-1, -1], [1, 1]].
//	step 1: running mean = 0.9·0 + 0.1·[2, 4] = [0.2, 0.4],
//	        running var  = 0.9·1 + 0.1·[2, 8] = [1.1, 1.7];
//	step 2: running mean = 0.9·[0.2, 0.4] + 0.1·[2, 4] = [0.38, 0.76],
//	        running var  = 0.9·[1.1, 1.7] + 0.1·[2, 8] = [1.19, 2.33].
//	evaluation: y = (x - running mean)/√running var, e.g. channel 0 of
//	row 0: (1 - 0.38)/√1.19 = 0.568354...
func batchNormTorchNumbers(e *env, nb tensor.NormBackend) {
	x := []float32{1, 2, 3, 6}
	rm, rv := e.f32("runMean", []float32{0, 0}, false), e.f32("runVar", []float32{1, 1}, false)
	y, sm, si := e.nanOut("y", 4), e.nanOut("saveMean", 2), e.nanOut("saveInvStd", 2)
	xb := e.in("x", x)
	nb.BatchNorm(y.win, sm.win, si.win, rm.win, rv.win, xb, tensor.Buffer{}, tensor.Buffer{}, 2, 2, 1, true, 0.1, 0)
	e.near("step 1 y", dims(2, 2), e.getF(y), []float64{-1, -1, 1, 1}, nil, tolElem)
	e.near("step 1 running mean", dims(2), e.getF(rm), []float64{0.2, 0.4}, nil, tolElem)
	e.near("step 1 running var", dims(2), e.getF(rv), []float64{1.1, 1.7}, nil, tolElem)
	nb.BatchNorm(y.win, sm.win, si.win, rm.win, rv.win, xb, tensor.Buffer{}, tensor.Buffer{}, 2, 2, 1, true, 0.1, 0)
	e.near("step 2 running mean", dims(2), e.getF(rm), []float64{0.38, 0.76}, nil, tolElem)
	e.near("step 2 running var", dims(2), e.getF(rv), []float64{1.19, 2.33}, nil, tolElem)
	nb.BatchNorm(y.win, sm.win, si.win, rm.win, rv.win, xb, tensor.Buffer{}, tensor.Buffer{}, 2, 2, 1, false, 0.1, 0)
	want := []float64{(1 - 0.38) / math.Sqrt(1.19), (2 - 0.76) / math.Sqrt(2.33), (3 - 0.38) / math.Sqrt(1.19), (6 - 0.76) / math.Sqrt(2.33)}
	e.near("evaluation y", dims(2, 2), e.getF(y), want, nil, 4*tolElem) // the running statistics carry float32 rounding of three steps
	e.near("evaluation running mean unchanged", dims(2), e.getF(rm), []float64{0.38, 0.76}, nil, tolElem)

	// torch's momentum=None, the cumulative average: momentum 1/k on the
	// k-th batch (num_batches_tracked = k). Batch 1 is x (means [2, 4],
	// unbiased vars [2, 8]), batch 2 is x + 2 (means [4, 6], the same
	// vars): after both, running mean = ([2, 4] + [4, 6])/2 = [3, 5] and
	// running var = [2, 8], whatever the initial values.
	x2 := e.in("x + 2", []float32{3, 4, 5, 8})
	nb.BatchNorm(y.win, sm.win, si.win, rm.win, rv.win, xb, tensor.Buffer{}, tensor.Buffer{}, 2, 2, 1, true, 1, 0)
	nb.BatchNorm(y.win, sm.win, si.win, rm.win, rv.win, x2, tensor.Buffer{}, tensor.Buffer{}, 2, 2, 1, true, 0.5, 0)
	e.near("cumulative running mean", dims(2), e.getF(rm), []float64{3, 5}, nil, tolElem)
	e.near("cumulative running var", dims(2), e.getF(rv), []float64{2, 8}, nil, tolElem)
}

func testBatchNormBackward(e *env) {
	nb := normBackend(e)
	const eps = 1e-5
	for _, cs := range bnCases {
		for _, training := range []bool{true, false} {
			for _, affine := range []bool{true, false} {
				for _, acc := range []bool{false, true} {
					e.tcase("n=%d c=%d inner=%d training=%v affine=%v accumulate=%v", cs.n, cs.c, cs.inner, training, affine, acc)(func() {
						e.aligned16 = bnAligned(cs)
						x, w, _ := e.bnInputs(cs)
						dy := e.normal(len(x), 1)
						groups := bnGroups(cs.n, cs.c, cs.inner)
						mean, inv := make([]float64, cs.c), make([]float64, cs.c)
						m32, i32 := make([]float32, cs.c), make([]float32, cs.c)
						for g, idx := range groups {
							mu, v := refStats(x, idx)
							if !training { // running statistics: any values
								mu, v = mu+e.rng.NormFloat64(), v*(0.5+e.rng.Float64())
							}
							m32[g], i32[g] = float32(mu), float32(1/math.Sqrt(v+eps))
							// The reference takes the statistics the backend is given.
							mean[g], inv[g] = float64(m32[g]), float64(i32[g])
						}
						ch := func(i int) int { return (i / cs.inner) % cs.c }
						affW := func(int) float64 { return 1 }
						var wb tensor.Buffer
						if affine {
							affW = func(i int) float64 { return float64(w[ch(i)]) }
							wb = e.in("weight", w)
						}
						dx0, dw0, db0 := e.normal(len(x), 1), e.normal(cs.c, 1), e.normal(cs.c, 1)
						dx, dw, db := e.gradOut("dx", dx0, acc), e.gradOut("dweight", dw0, acc), e.gradOut("dbias", db0, acc)
						nb.BatchNormBackward(dx.win, dw.win, db.win, e.in("dy", dy), e.in("x", x), wb, e.in("saveMean", m32), e.in("saveInvStd", i32),
							cs.n, cs.c, cs.inner, training, acc, acc, acc)
						wantDx, bDx := refNormBackward(x, dy, groups, mean, inv, affW, training)
						wantDx, bDx = accumulated(wantDx, bDx, dx0, acc)
						e.near("BatchNormBackward dx", dims(cs.n, cs.c, cs.inner), e.getF(dx), wantDx, bDx, tolAcc)
						wantW, wantB, bW, bB := refAffineGrads(x, dy, groups, mean, inv, cs.c, ch)
						wantW, bW = accumulated(wantW, bW, dw0, acc)
						wantB, bB = accumulated(wantB, bB, db0, acc)
						e.near("BatchNormBackward dweight", dims(cs.c), e.getF(dw), wantW, bW, tolAcc)
						e.near("BatchNormBackward dbias", dims(cs.c), e.getF(db), wantB, bB, tolAcc)
						// Only dx wanted.
						dx2 := e.nanOut("dx only", len(x))
						nb.BatchNormBackward(dx2.win, tensor.Buffer{}, tensor.Buffer{}, e.in("dy", dy), e.in("x", x), wb, e.in("saveMean", m32), e.in("saveInvStd", i32),
							cs.n, cs.c, cs.inner, training, false, false, false)
						want2, b2 := refNormBackward(x, dy, groups, mean, inv, affW, training)
						e.near("BatchNormBackward dx alone", dims(cs.n, cs.c, cs.inner), e.getF(dx2), want2, b2, tolAcc)
					})
				}
			}
		}
	}
}

// lnCases are [rows, cols]: one row (N = 1), 7x5 = 35 columns, a row of
// 4099 (several passes of a block), many short rows, and 1100 rows of 40
// (on CUDA: two tiles of columns, the second partly filled, and the rows'
// gradient sums over many chunks).
var lnCases = [][2]int{{1, 35}, {6, 7}, {3, 4099}, {257, 3}, {1100, 40}}

func testLayerNorm(e *env) {
	nb := normBackend(e)
	for _, cs := range lnCases {
		rows, cols := cs[0], cs[1]
		for _, affine := range []bool{true, false} {
			e.tcase("rows=%d cols=%d affine=%v", rows, cols, affine)(func() {
				const eps = 1e-5
				x := e.normal(rows*cols, 3)
				for i := range x {
					x[i] += 7
				}
				w, b := e.normal(cols, 1), e.normal(cols, 1)
				groups := lnGroups(rows, cols)
				mean, inv := make([]float64, rows), make([]float64, rows)
				for g, idx := range groups {
					mu, v := refStats(x, idx)
					mean[g], inv[g] = mu, 1/math.Sqrt(v+eps)
				}
				affW, affB := func(int) float64 { return 1 }, func(int) float64 { return 0 }
				var wb, bb tensor.Buffer
				if affine {
					affW, affB = func(i int) float64 { return float64(w[i%cols]) }, func(i int) float64 { return float64(b[i%cols]) }
					wb, bb = e.in("weight", w), e.in("bias", b)
				}
				y, sm, si := e.nanOut("y", len(x)), e.nanOut("saveMean", rows), e.nanOut("saveInvStd", rows)
				nb.LayerNorm(y.win, sm.win, si.win, e.in("x", x), wb, bb, rows, cols, eps)
				wantY, boundY := refNormForward(x, groups, mean, inv, affW, affB)
				e.near("LayerNorm y", dims(rows, cols), e.getF(y), wantY, boundY, tolElem)
				e.near("LayerNorm saveMean", dims(rows), e.getF(sm), mean, nil, tolElem)
				e.near("LayerNorm saveInvStd", dims(rows), e.getF(si), inv, nil, tolElem)
			})
		}
	}
}

func testLayerNormBackward(e *env) {
	nb := normBackend(e)
	for _, cs := range lnCases {
		rows, cols := cs[0], cs[1]
		for _, affine := range []bool{true, false} {
			for _, acc := range []bool{false, true} {
				e.tcase("rows=%d cols=%d affine=%v accumulate=%v", rows, cols, affine, acc)(func() {
					x := e.normal(rows*cols, 3)
					dy := e.normal(rows*cols, 1)
					w := e.normal(cols, 1)
					groups := lnGroups(rows, cols)
					mean, inv := make([]float64, rows), make([]float64, rows)
					m32, i32 := make([]float32, rows), make([]float32, rows)
					for g, idx := range groups {
						mu, v := refStats(x, idx)
						m32[g], i32[g] = float32(mu), float32(1/math.Sqrt(v+1e-5))
						mean[g], inv[g] = float64(m32[g]), float64(i32[g])
					}
					affW := func(int) float64 { return 1 }
					var wb tensor.Buffer
					if affine {
						affW = func(i int) float64 { return float64(w[i%cols]) }
						wb = e.in("weight", w)
					}
					dx0, dw0, db0 := e.normal(len(x), 1), e.normal(cols, 1), e.normal(cols, 1)
					dx, dw, db := e.gradOut("dx", dx0, acc), e.gradOut("dweight", dw0, acc), e.gradOut("dbias", db0, acc)
					nb.LayerNormBackward(dx.win, dw.win, db.win, e.in("dy", dy), e.in("x", x), wb, e.in("saveMean", m32), e.in("saveInvStd", i32),
						rows, cols, acc, acc, acc)
					wantDx, bDx := refNormBackward(x, dy, groups, mean, inv, affW, true)
					wantDx, bDx = accumulated(wantDx, bDx, dx0, acc)
					e.near("LayerNormBackward dx", dims(rows, cols), e.getF(dx), wantDx, bDx, tolAcc)
					wantW, wantB, bW, bB := refAffineGrads(x, dy, groups, mean, inv, cols, func(i int) int { return i % cols })
					wantW, bW = accumulated(wantW, bW, dw0, acc)
					wantB, bB = accumulated(wantB, bB, db0, acc)
					e.near("LayerNormBackward dweight", dims(cols), e.getF(dw), wantW, bW, tolAcc)
					e.near("LayerNormBackward dbias", dims(cols), e.getF(db), wantB, bB, tolAcc)
					// Only the parameters' gradients wanted.
					dw2 := e.nanOut("dweight only", cols)
					nb.LayerNormBackward(tensor.Buffer{}, dw2.win, tensor.Buffer{}, e.in("dy", dy), e.in("x", x), wb, e.in("saveMean", m32), e.in("saveInvStd", i32),
						rows, cols, false, false, false)
					alone, _, bAlone, _ := refAffineGrads(x, dy, groups, mean, inv, cols, func(i int) int { return i % cols })
					e.near("LayerNormBackward dweight alone", dims(cols), e.getF(dw2), alone, bAlone, tolAcc)
				})
			}
		}
	}
}

// checkRunningStats checks a training batch norm's running statistics rm
// and rv, which started at rm0 and rv0, against torch's update with the
// batch's mean and unbiased variance: (1-momentum)·old + momentum·new,
// within the float32 tolerance of the two terms' magnitudes.
func (e *env) checkRunningStats(op string, rm, rv *dbuf, rm0, rv0 []float32, mean, unbiased []float64, momentum float32) {
	c := len(rm0)
	wm, wv := make([]float64, c), make([]float64, c)
	bm, bv := make([]float64, c), make([]float64, c)
	mom := float64(momentum)
	for g := range wm {
		wm[g] = (1-mom)*float64(rm0[g]) + mom*mean[g]
		wv[g] = (1-mom)*float64(rv0[g]) + mom*unbiased[g]
		bm[g] = math.Abs((1-mom)*float64(rm0[g])) + math.Abs(mom*mean[g])
		bv[g] = math.Abs((1-mom)*float64(rv0[g])) + math.Abs(mom*unbiased[g])
	}
	e.near(op+" running mean", dims(c), e.getF(rm), wm, bm, tolElem)
	e.near(op+" running var", dims(c), e.getF(rv), wv, bv, tolElem)
}
