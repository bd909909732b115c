package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// matmulAutogradCases: BatchMatMul with equal, broadcast (whole and
// partial) and 1-D operands, transposed views read in place and a view
// whose batch is not dense; Linear over [..., in]; scaled dot-product
// attention, causal or not. Sums of at most a few dozen terms: tolAG.
func matmulAutogradCases() []agCase {
	return []agCase{
		bmmCase("BatchMatMul/equal batches", []int{2, 3, 4, 5}, []int{2, 3, 5, 6}, nil, nil),
		bmmCase("BatchMatMul/a broadcast", []int{4, 5}, []int{3, 5, 6}, nil, nil),
		bmmCase("BatchMatMul/b broadcast", []int{3, 4, 5}, []int{5, 6}, nil, nil),
		bmmCase("BatchMatMul/partial broadcast", []int{2, 1, 4, 5}, []int{3, 5, 6}, nil, nil),
		bmmCase("BatchMatMul/both partial", []int{2, 1, 3, 4}, []int{1, 5, 4, 2}, nil, nil),
		bmmCase("BatchMatMul/transposed views", []int{3, 5, 4}, []int{3, 6, 5}, []int{1, 2}, []int{1, 2}),
		bmmCase("BatchMatMul/transposed broadcast b", []int{3, 4, 5}, []int{6, 5}, nil, []int{0, 1}),
		bmmCase("BatchMatMul/batch not dense", []int{5, 3, 4}, []int{3, 4, 2}, []int{0, 1}, nil),
		bmmCase("BatchMatMul/2-D", []int{7, 9}, []int{9, 4}, nil, nil),
		bmmCase("BatchMatMul/vector times batch", []int{5}, []int{3, 5, 6}, nil, nil),
		bmmCase("BatchMatMul/batch times vector", []int{2, 4, 5}, []int{5}, nil, nil),
		bmmCase("BatchMatMul/dot", []int{9}, []int{9}, nil, nil),
		linearNDCase("Linear/[2, 3, in]", []int{2, 3, 4}),
		linearNDCase("Linear/[in]", []int{4}),
		sdpaCase(false, 0),
		sdpaCase(true, 0),
		sdpaCase(true, 0.7),
	}
}

// attentionCases: ScaledDotProductAttention[Dropout] at head dimensions
// that a fused attention kernel takes (16, 32, 64), with query and key
// counts that are not multiples of any tile, causal or not, dropout on and
// off from a Generator and a DeviceGenerator; on a GPU they compare the
// fused kernels with the CPU's composed operators (the same dropout bits).
// The small ones also check the float64 reference against central
// differences; the larger ones rest on it. Sums of at most ~130 terms:
// tolAG.
func attentionCases() []agCase {
	return []agCase{
		sdpaFullCase([]int{1, 1}, 19, 21, 16, 16, true, 0, 0, false, true),
		sdpaFullCase([]int{1, 1}, 19, 21, 16, 16, false, 0.3, 0, false, true),
		sdpaFullCase([]int{2}, 70, 45, 16, 16, true, 0, 0, false, false),
		sdpaFullCase([]int{2}, 45, 70, 16, 16, true, 0, 0, false, false),
		sdpaFullCase([]int{3}, 33, 40, 32, 32, false, 0, 0, false, false),
		sdpaFullCase([]int{1, 2}, 65, 65, 64, 64, true, 0, 0, false, false),
		sdpaFullCase([]int{1, 1}, 19, 21, 16, 16, true, 0, 0.3, false, true),
		sdpaFullCase([]int{2, 2}, 37, 29, 16, 16, false, 0, 0.5, false, false),
		sdpaFullCase([]int{2, 2}, 37, 29, 16, 16, true, 0, 0.2, true, false),
		sdpaFullCase([]int{1, 2}, 130, 130, 64, 64, true, 0, 0.2, false, false),
		sdpaFullCase([]int{1, 2}, 130, 130, 64, 64, true, 0, 0.2, true, false),
		sdpaFullCase([]int{2, 2}, 5, 6, 4, 3, true, 0, 0.3, false, true),
	}
}

// bmmShapes pads the operand shapes as torch.matmul does: a 1-D a is a row
// and a 1-D b a column; it returns the batch of the product.
func bmmShapes(as, bs []int) (ap, bp, batch []int) {
	ap, bp = append([]int(nil), as...), append([]int(nil), bs...)
	if len(ap) == 1 {
		ap = []int{1, ap[0]}
	}
	if len(bp) == 1 {
		bp = []int{bp[0], 1}
	}
	ba, bb := ap[:len(ap)-2], bp[:len(bp)-2]
	batch = make([]int, max(len(ba), len(bb)))
	for i := range batch {
		da, db := 1, 1
		if j := i - (len(batch) - len(ba)); j >= 0 {
			da = ba[j]
		}
		if j := i - (len(batch) - len(bb)); j >= 0 {
			db = bb[j]
		}
		batch[i] = max(da, db)
	}
	return ap, bp, batch
}

// batchIndex is the flat batch index, in an operand of batch ob, of the
// product's batch multi-index idx (dimensions of size 1 broadcast).
func batchIndex(idx, ob []int) int {
	f := 0
	for i, d := range ob {
		j := idx[len(idx)-len(ob)+i]
		if d == 1 {
			j = 0
		}
		f = f*d + j
	}
	return f
}

// refBatchMatMul is the broadcast batched product in float64 and its
// gradients for the output gradient g.
func refBatchMatMul(a, b []float64, as, bs []int, g []float32) (out, da, db []float64) {
	ap, bp, batch := bmmShapes(as, bs)
	m, k, n := ap[len(ap)-2], ap[len(ap)-1], bp[len(bp)-1]
	nb := 1
	for _, d := range batch {
		nb *= d
	}
	out, da, db = make([]float64, nb*m*n), make([]float64, len(a)), make([]float64, len(b))
	idx := make([]int, len(batch))
	for q := 0; q < nb; q++ {
		r := q
		for i := len(batch) - 1; i >= 0; i-- {
			idx[i], r = r%batch[i], r/batch[i]
		}
		ia, ib := batchIndex(idx, ap[:len(ap)-2])*m*k, batchIndex(idx, bp[:len(bp)-2])*k*n
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				gv := float64(g[(q*m+i)*n+j])
				for p := 0; p < k; p++ {
					out[(q*m+i)*n+j] += a[ia+i*k+p] * b[ib+p*n+j]
					da[ia+i*k+p] += gv * b[ib+p*n+j]
					db[ib+p*n+j] += gv * a[ia+i*k+p]
				}
			}
		}
	}
	return out, da, db
}

// bmmCase multiplies inputs of shapes as and bs, each first transposed on
// the axes ta or tb when given (a strided view), so that the operands are
// the transposed inputs.
func bmmCase(name string, as, bs, ta, tb []int) agCase {
	view := func(t *tensor.Tensor, ax []int) *tensor.Tensor {
		if ax == nil {
			return t
		}
		return t.Transpose(ax[0], ax[1])
	}
	logical := func(v []float32, shape, ax []int) ([]float64, []int) {
		if ax == nil {
			return f64(v), shape
		}
		s := append([]int(nil), shape...)
		s[ax[0]], s[ax[1]] = s[ax[1]], s[ax[0]]
		return swapAxes(f64(v), shape, ax[0], ax[1]), s
	}
	return agCase{
		name: name, inputs: []agInput{in(true, as...), in(true, bs...)}, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.BatchMatMul(view(t[0], ta), view(t[1], tb))
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			a, la := logical(v[0], as, ta)
			b, lb := logical(v[1], bs, tb)
			out, da, db := refBatchMatMul(a, b, la, lb, g)
			if ta != nil {
				da = swapAxes(da, la, ta[0], ta[1])
			}
			if tb != nil {
				db = swapAxes(db, lb, tb[0], tb[1])
			}
			return out, [][]float64{da, db}
		},
	}
}

// linearNDCase is Linear of x [..., 4] with w [5, 4] and a bias: the rows
// of x flattened, linear64.
func linearNDCase(name string, xs []int) agCase {
	const inF, outF = 4, 5
	rows := 1
	for _, d := range xs[:len(xs)-1] {
		rows *= d
	}
	return agCase{
		name: name, inputs: []agInput{in(true, xs...), in(true, outF, inF), in(true, outF)}, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Linear(t[0], t[1], t[2]) },
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			x, w := f64(v[0]), f64(v[1])
			dx, dw, db := linearGrads64(f64(g), x, w, rows, inF, outF)
			return linear64(x, w, f64(v[2]), rows, inF, outF), [][]float64{dx, dw, db}
		},
	}
}

// sdpa64 is attention in float64 on [bh, t, d] queries, [bh, s, d] keys
// and [bh, s, dv] values: softmax(scale·q·kᵀ, causal keys after the query
// excluded)·v, and, given the output gradient g, the gradients of q, k, v.
// mask, when not nil, multiplies the weights [bh, t, s] (dropout).
func sdpa64(q, k, v, g, mask []float64, bh, t, s, d, dv int, causal bool, scale float64) (out, dq, dk, dv64 []float64) {
	out, dq, dk, dv64 = make([]float64, bh*t*dv), make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	p, dp := make([]float64, s), make([]float64, s)
	for h := 0; h < bh; h++ {
		Q, K, V := q[h*t*d:], k[h*s*d:], v[h*s*dv:]
		for i := 0; i < t; i++ {
			keys := s
			if causal {
				keys = min(i+1, s)
			}
			m := math.Inf(-1)
			for j := 0; j < keys; j++ {
				p[j] = 0
				for c := 0; c < d; c++ {
					p[j] += Q[i*d+c] * K[j*d+c]
				}
				p[j] *= scale
				m = math.Max(m, p[j])
			}
			z := 0.0
			for j := 0; j < keys; j++ {
				p[j] = math.Exp(p[j] - m)
				z += p[j]
			}
			G := g[(h*t+i)*dv:]
			sum := 0.0 // Σ_j p_j·dp_j
			for j := 0; j < keys; j++ {
				p[j] /= z
				mj := 1.0
				if mask != nil {
					mj = mask[(h*t+i)*s+j]
				}
				dp[j] = 0
				for e := 0; e < dv; e++ {
					out[(h*t+i)*dv+e] += p[j] * mj * V[j*dv+e]
					dv64[(h*s+j)*dv+e] += p[j] * mj * G[e]
					dp[j] += G[e] * V[j*dv+e]
				}
				dp[j] *= mj
				sum += p[j] * dp[j]
			}
			for j := 0; j < keys; j++ {
				ds := p[j] * (dp[j] - sum) * scale
				for c := 0; c < d; c++ {
					dq[(h*t+i)*d+c] += ds * K[j*d+c]
					dk[(h*s+j)*d+c] += ds * Q[i*d+c]
				}
			}
		}
	}
	return out, dq, dk, dv64
}

// sdpaBound64 is, for sdpa64's output and gradients, the magnitude that
// each element's rounding error is bounded by a small multiple of, when
// the products round their operands to a unit roundoff u (bfloat16's
// 2⁻⁹; float32's 2⁻²⁴ stays far inside it). Per query row, with P the
// exact weights, A_j = scale·Σ|q||k_j| the magnitude of score j (its error
// is u·A_j) and E_j = A_j + Σ P·A (what that error does to weight j,
// relative to it after the softmax):
//
//	out:  Σ_j m_j·P_j·(1+E_j)·|v_j|
//	dv_j: m_j·P_j·(1+E_j)·|g|
//	dS_j: P_j·((1+E_j)(|dp_j|+|δ|) + B_j + Σ P·B + Σ P·E·|dp|)
//	dq:   scale·Σ_j dS_j·|k_j|,  dk_j: scale·dS_j·|q|
//
// where dp_j = m_j·g·v_j, δ = Σ P·dp, B_j = m_j·Σ|g||v_j| the magnitude of
// dp_j (whose error comes from rounding g and v), and m the dropout mask
// (1 without). The softmax gradient P·(dp − δ) cancels: a bound by the
// largest gradient, normwise, misses errors this bound allows.
func sdpaBound64(q, k, v, g, mask []float64, bh, t, s, d, dv int, causal bool, scale float64) (out, dq, dk, dv64 []float64) {
	out, dq, dk, dv64 = make([]float64, bh*t*dv), make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	p, a, dp, b, ds := make([]float64, s), make([]float64, s), make([]float64, s), make([]float64, s), make([]float64, s)
	for h := 0; h < bh; h++ {
		Q, K, V := q[h*t*d:], k[h*s*d:], v[h*s*dv:]
		for i := 0; i < t; i++ {
			keys := s
			if causal {
				keys = min(i+1, s)
			}
			m := math.Inf(-1)
			for j := 0; j < keys; j++ {
				p[j], a[j] = 0, 0
				for c := 0; c < d; c++ {
					p[j] += Q[i*d+c] * K[j*d+c]
					a[j] += math.Abs(Q[i*d+c] * K[j*d+c])
				}
				p[j] *= scale
				a[j] *= scale
				m = math.Max(m, p[j])
			}
			z := 0.0
			for j := 0; j < keys; j++ {
				p[j] = math.Exp(p[j] - m)
				z += p[j]
			}
			G := g[(h*t+i)*dv:]
			var meanA, delta, meanB float64
			for j := 0; j < keys; j++ {
				p[j] /= z
				mj := 1.0
				if mask != nil {
					mj = mask[(h*t+i)*s+j]
				}
				dp[j], b[j] = 0, 0
				for e := 0; e < dv; e++ {
					dp[j] += G[e] * V[j*dv+e]
					b[j] += math.Abs(G[e] * V[j*dv+e])
				}
				dp[j] *= mj
				b[j] *= mj
				meanA += p[j] * a[j]
				delta += p[j] * dp[j]
				meanB += p[j] * b[j]
			}
			meanEdp := 0.0
			for j := 0; j < keys; j++ {
				meanEdp += p[j] * (a[j] + meanA) * math.Abs(dp[j])
			}
			for j := 0; j < keys; j++ {
				mj := 1.0
				if mask != nil {
					mj = mask[(h*t+i)*s+j]
				}
				w := mj * p[j] * (1 + a[j] + meanA)
				for e := 0; e < dv; e++ {
					out[(h*t+i)*dv+e] += w * math.Abs(V[j*dv+e])
					dv64[(h*s+j)*dv+e] += w * math.Abs(G[e])
				}
				ds[j] = scale * p[j] * ((1+a[j]+meanA)*(math.Abs(dp[j])+math.Abs(delta)) + b[j] + meanB + meanEdp)
				for c := 0; c < d; c++ {
					dq[(h*t+i)*d+c] += ds[j] * math.Abs(K[j*d+c])
					dk[(h*s+j)*d+c] += ds[j] * math.Abs(Q[i*d+c])
				}
			}
		}
	}
	return out, dq, dk, dv64
}

// sdpaCase is ScaledDotProductAttention on q [2, 2, 5, 4], k [2, 2, 6, 4],
// v [2, 2, 6, 3] (scale 0: 1/√4), its reference checked against central
// differences.
func sdpaCase(causal bool, scale float32) agCase {
	return sdpaFullCase([]int{2, 2}, 5, 6, 4, 3, causal, scale, 0, false, true)
}

// sdpaFullCase is ScaledDotProductAttention on q [batch..., t, d], k
// [batch..., s, d], v [batch..., s, dv], with dropout of probability p on
// the weights (from a Generator of dropoutSeed, or a DeviceGenerator when
// device) when p > 0. The draw must advance the generator by the blocks of
// the [batch..., t, s] weights, as Dropout over them does. With fd the
// reference gradients are themselves checked against central differences
// of sdpa64's loss Σ out·g (float64, step 1e-6: truncation and rounding
// errors near 1e-10, far below the 1e-6 allowed); a mismatch panics,
// failing the case.
func sdpaFullCase(batch []int, t, s, d, dv int, causal bool, scale, p float32, device, fd bool) agCase {
	bh := 1
	for _, n := range batch {
		bh *= n
	}
	shape := func(rows, cols int) []int { return append(append([]int(nil), batch...), rows, cols) }
	name := fmt.Sprintf("ScaledDotProductAttention/%v T %d S %d D %d Dv %d causal %v scale %g", batch, t, s, d, dv, causal, scale)
	if p > 0 {
		gen := "Generator"
		if device {
			gen = "DeviceGenerator"
		}
		name += fmt.Sprintf(" dropout %g %s", p, gen)
	}
	blocks := uint64(bh*t*s+3) / 4
	// scaleMask is the reference's scale and dropout mask (nil for none).
	scaleMask := func() (float64, []float64) {
		sc := float64(scale)
		if sc == 0 {
			sc = 1 / math.Sqrt(float64(d))
		}
		if p > 0 {
			return sc, refDropoutMask(dropoutSeed, bh*t*s, p)
		}
		return sc, nil
	}
	return agCase{
		name:   name,
		inputs: []agInput{in(true, shape(t, d)...), in(true, shape(s, d)...), in(true, shape(s, dv)...)}, tol: tolAG,
		fwd: func(x []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			if p == 0 {
				return tensor.ScaledDotProductAttention(x[0], x[1], x[2], causal, scale)
			}
			if device {
				dg := tensor.NewDeviceGenerator(x[0].Backend(), dropoutSeed)
				defer dg.Release()
				y := tensor.ScaledDotProductAttentionDropout(x[0], x[1], x[2], causal, scale, p, dg)
				if _, off := dg.SeedOffset(); off != blocks {
					panic(fmt.Sprintf("device generator offset %d after attention dropout; want %d", off, blocks))
				}
				return y
			}
			gen := tensor.NewGenerator(dropoutSeed)
			y := tensor.ScaledDotProductAttentionDropout(x[0], x[1], x[2], causal, scale, p, gen)
			if off := gen.Offset(); off != blocks {
				panic(fmt.Sprintf("generator offset %d after attention dropout; want %d", off, blocks))
			}
			return y
		},
		bound: func(x [][]float32, g []float32) ([]float64, [][]float64) {
			sc, mask := scaleMask()
			out, dq, dk, dv := sdpaBound64(f64(x[0]), f64(x[1]), f64(x[2]), f64(g), mask, bh, t, s, d, dv, causal, sc)
			return out, [][]float64{dq, dk, dv}
		},
		ref: func(x [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			sc, mask := scaleMask()
			ins, g64 := [][]float64{f64(x[0]), f64(x[1]), f64(x[2])}, f64(g)
			out, dq, dk, dvv := sdpa64(ins[0], ins[1], ins[2], g64, mask, bh, t, s, d, dv, causal, sc)
			grads := [][]float64{dq, dk, dvv}
			if !fd {
				return out, grads
			}
			loss := func() float64 {
				o, _, _, _ := sdpa64(ins[0], ins[1], ins[2], g64, mask, bh, t, s, d, dv, causal, sc)
				l := 0.0
				for i, v := range o {
					l += v * g64[i]
				}
				return l
			}
			const h = 1e-6
			for w, in := range ins {
				for i := range in {
					x0 := in[i]
					in[i] = x0 + h
					up := loss()
					in[i] = x0 - h
					down := loss()
					in[i] = x0
					if fd := (up - down) / (2 * h); math.Abs(fd-grads[w][i]) > 1e-6*(1+math.Abs(fd)) {
						panic(fmt.Sprintf("attention reference: gradient %d of input %d is %g, finite differences %g", i, w, grads[w][i], fd))
					}
				}
			}
			return out, grads
		},
	}
}
