package tensortest

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Naive float64 references. Each one is written from the Backend
// documentation with plain loops, independently of the CPU backend, and
// computes in float64 from the float32 inputs. Accumulating references also
// return a bound: the same sum over absolute values of the terms, which
// scales the tolerance (the rounding error of a float32 sum of k terms is at
// most about k·2⁻²⁴ times the sum of their magnitudes, whatever the order in
// which a backend adds them).

// refMatMul computes alpha·op(a)·op(b) + beta·c0 (c0 not read when beta is
// 0) and the bound |alpha|·Σ|a·b| + |beta·c0|.
func refMatMul(a, b, c0 []float32, m, n, k int, ta, tb bool, alpha, beta float64) (want, bound []float64) {
	A := func(i, p int) float64 {
		if ta {
			return float64(a[p*m+i])
		}
		return float64(a[i*k+p])
	}
	B := func(p, j int) float64 {
		if tb {
			return float64(b[j*k+p])
		}
		return float64(b[p*n+j])
	}
	want, bound = make([]float64, m*n), make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, sa float64
			for p := 0; p < k; p++ {
				v := A(i, p) * B(p, j)
				s += v
				sa += math.Abs(v)
			}
			want[i*n+j] = alpha * s
			bound[i*n+j] = math.Abs(alpha) * sa
			if beta != 0 {
				want[i*n+j] += beta * float64(c0[i*n+j])
				bound[i*n+j] += math.Abs(beta * float64(c0[i*n+j]))
			}
		}
	}
	return want, bound
}

// refConv computes the cross-correlation of x [N,C,H,W] with w [K,C,R,S],
// zero padding, plus bias (nil for none).
func refConv(x, w, bias []float32, g tensor.ConvGeom) (y, bound []float64) {
	oh, ow := (g.H+2*g.PadH-g.R)/g.StrideH+1, (g.W+2*g.PadW-g.S)/g.StrideW+1
	y, bound = make([]float64, g.N*g.K*oh*ow), make([]float64, g.N*g.K*oh*ow)
	for n := 0; n < g.N; n++ {
		for k := 0; k < g.K; k++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					var s, sa float64
					if bias != nil {
						s, sa = float64(bias[k]), math.Abs(float64(bias[k]))
					}
					for c := 0; c < g.C; c++ {
						for r := 0; r < g.R; r++ {
							h := i*g.StrideH - g.PadH + r
							if h < 0 || h >= g.H {
								continue
							}
							for q := 0; q < g.S; q++ {
								wc := j*g.StrideW - g.PadW + q
								if wc < 0 || wc >= g.W {
									continue
								}
								v := float64(x[((n*g.C+c)*g.H+h)*g.W+wc]) * float64(w[((k*g.C+c)*g.R+r)*g.S+q])
								s += v
								sa += math.Abs(v)
							}
						}
					}
					o := ((n*g.K+k)*oh+i)*ow + j
					y[o], bound[o] = s, sa
				}
			}
		}
	}
	return y, bound
}

// convGrads holds the reference gradients of a convolution and their bounds.
type convGrads struct {
	dx, dxB, dw, dwB, db, dbB []float64
}

// refConvBackward computes dx = Σ dy·w, dw = Σ dy·x, db = Σ dy by walking
// every term of the forward sum.
func refConvBackward(dy, x, w []float32, g tensor.ConvGeom) convGrads {
	oh, ow := (g.H+2*g.PadH-g.R)/g.StrideH+1, (g.W+2*g.PadW-g.S)/g.StrideW+1
	r := convGrads{
		dx: make([]float64, len(x)), dxB: make([]float64, len(x)),
		dw: make([]float64, len(w)), dwB: make([]float64, len(w)),
		db: make([]float64, g.K), dbB: make([]float64, g.K),
	}
	for n := 0; n < g.N; n++ {
		for k := 0; k < g.K; k++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					d := float64(dy[((n*g.K+k)*oh+i)*ow+j])
					r.db[k] += d
					r.dbB[k] += math.Abs(d)
					for c := 0; c < g.C; c++ {
						for rr := 0; rr < g.R; rr++ {
							h := i*g.StrideH - g.PadH + rr
							if h < 0 || h >= g.H {
								continue
							}
							for q := 0; q < g.S; q++ {
								wc := j*g.StrideW - g.PadW + q
								if wc < 0 || wc >= g.W {
									continue
								}
								xi := ((n*g.C+c)*g.H+h)*g.W + wc
								wi := ((k*g.C+c)*g.R+rr)*g.S + q
								r.dx[xi] += d * float64(w[wi])
								r.dxB[xi] += math.Abs(d * float64(w[wi]))
								r.dw[wi] += d * float64(x[xi])
								r.dwB[wi] += math.Abs(d * float64(x[xi]))
							}
						}
					}
				}
			}
		}
	}
	return r
}

// refPool computes window maxima and the flat in-plane index (h*W+w) of
// each, the first in row-major order among equal maxima.
func refPool(x []float32, g tensor.PoolGeom) ([]float32, []int32) {
	oh, ow := (g.H-g.KH)/g.StrideH+1, (g.W-g.KW)/g.StrideW+1
	y, idx := make([]float32, g.N*g.C*oh*ow), make([]int32, g.N*g.C*oh*ow)
	for p := 0; p < g.N*g.C; p++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				at := (i*g.StrideH)*g.W + j*g.StrideW
				best := x[p*g.H*g.W+at]
				for r := 0; r < g.KH; r++ {
					for s := 0; s < g.KW; s++ {
						pos := (i*g.StrideH+r)*g.W + j*g.StrideW + s
						if v := x[p*g.H*g.W+pos]; v > best {
							best, at = v, pos
						}
					}
				}
				o := (p*oh+i)*ow + j
				y[o], idx[o] = best, int32(at)
			}
		}
	}
	return y, idx
}

// refPoolBackward routes dy to the argmax positions (summing where windows
// overlap) and returns dx (+ dx0 when accumulating) and its bound.
func refPoolBackward(dy []float32, idx []int32, dx0 []float32, g tensor.PoolGeom) (dx, bound []float64) {
	plane, out := g.H*g.W, ((g.H-g.KH)/g.StrideH+1)*((g.W-g.KW)/g.StrideW+1)
	dx, bound = make([]float64, g.N*g.C*plane), make([]float64, g.N*g.C*plane)
	for i, v := range dx0 {
		dx[i], bound[i] = float64(v), math.Abs(float64(v))
	}
	for p := 0; p < g.N*g.C; p++ {
		for o := 0; o < out; o++ {
			at := p*plane + int(idx[p*out+o])
			dx[at] += float64(dy[p*out+o])
			bound[at] += math.Abs(float64(dy[p*out+o]))
		}
	}
	return dx, bound
}

// refCE computes the mean cross-entropy of the rows of z against labels and
// its gradient (softmax − onehot)/n, with their tolerance bounds.
//
// Loss bound: the loss of a row is m + log Σexp(z−m) − z_y; float32
// rounding errors are relative to the magnitudes involved, so the bound is
// the mean of 1 + |m| + |z_y| + log(classes).
//
// Gradient bound: softmax p_c = exp(z_c − lse) carries the rounding error of
// its argument, about 2⁻²⁴(|z_c| + |m|), as a relative error, so the bound
// of p_c grows with the logits' magnitude: (1 + (|z_c|+|m|)/50)·p_c; the
// one-hot term adds its own magnitude; 1e-7 absolute covers values that
// underflow in float32 (p < 1e-38 at logits ±80).
func refCE(z []float32, lab []int32, n, classes int) (loss, lossB float64, dz, dzB []float64) {
	dz, dzB = make([]float64, n*classes), make([]float64, n*classes)
	for r := 0; r < n; r++ {
		row := z[r*classes : (r+1)*classes]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, float64(v))
		}
		var se float64
		for _, v := range row {
			se += math.Exp(float64(v) - m)
		}
		lse := m + math.Log(se)
		y := int(lab[r])
		loss += lse - float64(row[y])
		lossB += 1 + math.Abs(m) + math.Abs(float64(row[y])) + math.Log(float64(classes))
		for c, v := range row {
			p := math.Exp(float64(v) - lse)
			oh := 0.0
			if c == y {
				oh = 1
			}
			dz[r*classes+c] = (p - oh) / float64(n)
			dzB[r*classes+c] = ((1+(math.Abs(float64(v))+math.Abs(m))/50)*p+oh)/float64(n) + 1e-7
		}
	}
	return loss / float64(n), lossB / float64(n), dz, dzB
}

// refSGD applies torch.optim.SGD's update rule in float64:
//
//	d = g + wd·p
//	v = d (first step) | momentum·v + (1−dampening)·d
//	d = d + momentum·v (nesterov) | v
//	p = p − lr·d
//
// and returns the new p and v with bounds (the same computation on absolute
// values).
func refSGD(p, g, v []float32, h tensor.SGDStep) (pn, vn, pB, vB []float64) {
	lr, mom, damp, wd := float64(h.LR), float64(h.Momentum), float64(h.Dampening), float64(h.WeightDecay)
	pn, pB = make([]float64, len(p)), make([]float64, len(p))
	if mom != 0 {
		vn, vB = make([]float64, len(p)), make([]float64, len(p))
	}
	for i := range p {
		P, G := float64(p[i]), float64(g[i])
		d := G + wd*P
		dB := math.Abs(G) + math.Abs(wd*P)
		if mom != 0 {
			var V, VB float64
			if h.FirstStep {
				V, VB = d, dB
			} else {
				V = mom*float64(v[i]) + (1-damp)*d
				VB = mom*math.Abs(float64(v[i])) + math.Abs(1-damp)*dB
			}
			vn[i], vB[i] = V, VB
			if h.Nesterov {
				d, dB = d+mom*V, dB+mom*VB
			} else {
				d, dB = V, VB
			}
		}
		pn[i] = P - lr*d
		pB[i] = math.Abs(P) + lr*dB
	}
	return pn, vn, pB, vB
}
