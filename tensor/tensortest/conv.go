package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Conformance of general convolutions: rectangular kernels, strides,
// paddings and dilations per axis, and channel groups (depthwise
// included), forward and backward, against plain float64 loops.

// convGeneralCases: each names what it covers. Weights are [K, C/Groups,
// R, S].
var convGeneralCases = []struct {
	what string
	g    tensor.ConvGeom
}{
	{"rectangular kernel, stride 2,1, padding 1,2", tensor.ConvGeom{N: 2, C: 3, H: 9, W: 11, K: 4, R: 3, S: 5, StrideH: 2, StrideW: 1, PadH: 1, PadW: 2}},
	{"padding on the width only", tensor.ConvGeom{N: 2, C: 2, H: 6, W: 10, K: 3, R: 3, S: 3, StrideH: 1, StrideW: 1, PadW: 1}},
	{"dilation 2", tensor.ConvGeom{N: 2, C: 3, H: 10, W: 9, K: 5, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2, DilationH: 2, DilationW: 2}},
	{"dilation 2,3, stride 2, rectangular", tensor.ConvGeom{N: 1, C: 2, H: 13, W: 12, K: 3, R: 3, S: 2, StrideH: 2, StrideW: 2, PadW: 1, DilationH: 2, DilationW: 3}},
	{"groups 2", tensor.ConvGeom{N: 2, C: 4, H: 7, W: 8, K: 6, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, Groups: 2}},
	{"depthwise, stride 2", tensor.ConvGeom{N: 3, C: 5, H: 8, W: 7, K: 5, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, Groups: 5}},
	{"depthwise x2, dilation 2", tensor.ConvGeom{N: 2, C: 3, H: 9, W: 9, K: 6, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2, DilationH: 2, DilationW: 2, Groups: 3}},
	{"groups 4, 1x3 kernel, stride 2,1", tensor.ConvGeom{N: 2, C: 8, H: 11, W: 6, K: 4, R: 1, S: 3, StrideH: 2, StrideW: 1, PadW: 1, Groups: 4}},
	{"explicit dilation 1 and one group", tensor.ConvGeom{N: 2, C: 3, H: 7, W: 6, K: 2, R: 3, S: 2, StrideH: 1, StrideW: 2, PadH: 1, DilationH: 1, DilationW: 1, Groups: 1}},
	{"130 images, groups 2, dilation 1,2", tensor.ConvGeom{N: 130, C: 4, H: 5, W: 6, K: 4, R: 2, S: 2, StrideH: 1, StrideW: 1, DilationW: 2, Groups: 2}},
	{"dilated kernel as wide as the padded input", tensor.ConvGeom{N: 1, C: 2, H: 5, W: 4, K: 2, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, DilationH: 2, DilationW: 2}},
}

func convGeneralStr(what string, g tensor.ConvGeom) string {
	return fmt.Sprintf("%s: x [%d,%d,%d,%d] w [%d,%d,%d,%d] stride %d,%d pad %d,%d dilation %d,%d groups %d",
		what, g.N, g.C, g.H, g.W, g.K, g.C/max(g.Groups, 1), g.R, g.S, g.StrideH, g.StrideW, g.PadH, g.PadW, g.DilationH, g.DilationW, g.Groups)
}

// convTaps calls f for every (input, weight) index pair that output o =
// (n, k, i, j) of convolution g multiplies, with the sizes written out from
// nn.Conv2d's definition: input channel c of group k/(K/G) at row
// i·SH - PH + r·DH and column j·SW - PW + s·DW, skipped outside the input.
func convTaps(g tensor.ConvGeom, f func(o, xi, wi int)) (oh, ow int) {
	dh, dw, groups := max(g.DilationH, 1), max(g.DilationW, 1), max(g.Groups, 1)
	oh = (g.H+2*g.PadH-dh*(g.R-1)-1)/g.StrideH + 1
	ow = (g.W+2*g.PadW-dw*(g.S-1)-1)/g.StrideW + 1
	cg, kg := g.C/groups, g.K/groups
	for n := 0; n < g.N; n++ {
		for k := 0; k < g.K; k++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					o := ((n*g.K+k)*oh+i)*ow + j
					for c := 0; c < cg; c++ {
						xc := k/kg*cg + c
						for r := 0; r < g.R; r++ {
							h := i*g.StrideH - g.PadH + r*dh
							if h < 0 || h >= g.H {
								continue
							}
							for s := 0; s < g.S; s++ {
								w := j*g.StrideW - g.PadW + s*dw
								if w < 0 || w >= g.W {
									continue
								}
								f(o, ((n*g.C+xc)*g.H+h)*g.W+w, ((k*cg+c)*g.R+r)*g.S+s)
							}
						}
					}
				}
			}
		}
	}
	return oh, ow
}

// refConvGeneral is the convolution g of x with w plus bias (may be nil),
// with the bound Σ|x·w| + |bias| of every output.
func refConvGeneral(x, w, bias []float32, g tensor.ConvGeom) (y, bound []float64) {
	p := ((g.H+2*g.PadH-max(g.DilationH, 1)*(g.R-1)-1)/g.StrideH + 1) * ((g.W+2*g.PadW-max(g.DilationW, 1)*(g.S-1)-1)/g.StrideW + 1)
	y, bound = make([]float64, g.N*g.K*p), make([]float64, g.N*g.K*p)
	if bias != nil {
		for o := range y {
			k := o / p % g.K
			y[o], bound[o] = float64(bias[k]), math.Abs(float64(bias[k]))
		}
	}
	convTaps(g, func(o, xi, wi int) {
		v := float64(x[xi]) * float64(w[wi])
		y[o] += v
		bound[o] += math.Abs(v)
	})
	return y, bound
}

// refConvGeneralBackward is the gradient of convolution g given dy.
func refConvGeneralBackward(dy, x, w []float32, g tensor.ConvGeom) convGrads {
	r := convGrads{
		dx: make([]float64, len(x)), dxB: make([]float64, len(x)),
		dw: make([]float64, len(w)), dwB: make([]float64, len(w)),
		db: make([]float64, g.K), dbB: make([]float64, g.K),
	}
	p := len(dy) / max(g.N*g.K, 1)
	for o, d := range dy {
		k := o / p % g.K
		r.db[k] += float64(d)
		r.dbB[k] += math.Abs(float64(d))
	}
	convTaps(g, func(o, xi, wi int) {
		d := float64(dy[o])
		r.dx[xi] += d * float64(w[wi])
		r.dxB[xi] += math.Abs(d * float64(w[wi]))
		r.dw[wi] += d * float64(x[xi])
		r.dwB[wi] += math.Abs(d * float64(x[xi]))
	})
	return r
}

// testConvGeneral checks Conv2d and Conv2dBackward on every general
// geometry: the forward pass with and without bias and with the fused ReLU,
// the backward pass for every subset of dx, dw, db and through the ReLU.
// dx must be overwritten (NaN before), dw and db added into (random
// before). tolAcc relative to the sums of the magnitudes of the terms, as
// for the plain convolutions: the sums are at most C/G·R·S = 45 terms
// forward, N·OutH·OutW (up to ~4000) for dw.
func testConvGeneral(e *env) {
	for _, tc := range convGeneralCases {
		g := tc.g
		wLen := g.K * g.C / max(g.Groups, 1) * g.R * g.S
		if g.WeightLen() != wLen {
			e.fail("%s: WeightLen %d, want %d", convGeneralStr(tc.what, g), g.WeightLen(), wLen)
		}
		for variant := range 3 {
			withBias, relu := variant != 1, variant == 2
			e.tcase("%s bias=%v relu=%v", convGeneralStr(tc.what, g), withBias, relu)(func() {
				x, w := e.normal(g.N*g.C*g.H*g.W, 1), e.normal(wLen, 1)
				var bias []float32
				var bb tensor.Buffer
				if withBias {
					bias = e.normal(g.K, 1)
					bb = e.in("bias", bias)
				}
				want, bound := refConvGeneral(x, w, bias, g)
				if len(want) != g.N*g.K*g.OutH()*g.OutW() {
					e.fail("OutH/OutW %d,%d disagree with the reference's %d outputs", g.OutH(), g.OutW(), len(want))
					return
				}
				if relu {
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
		for _, v := range []struct {
			what       string
			dx, dw, db bool
			relu       bool
		}{{"dx dw db", true, true, true, false}, {"dx", true, false, false, false}, {"dw", false, true, false, false},
			{"db", false, false, true, false}, {"dx dw db through ReLU", true, true, true, true}} {
			e.tcase("%s backward computing %s", convGeneralStr(tc.what, g), v.what)(func() {
				x, w := e.normal(g.N*g.C*g.H*g.W, 1), e.normal(wLen, 1)
				dy := e.normal(g.N*g.K*g.OutH()*g.OutW(), 1)
				dyRef, gg := dy, g
				var yb tensor.Buffer
				if v.relu { // only the sign of the forward output matters
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
				r := refConvGeneralBackward(dyRef, x, w, g)
				dw0, db0 := e.normal(wLen, 1), e.normal(g.K, 1)
				checkConvBackward(e, v.dx, v.dw, v.db, dy, x, w, yb, gg, r, dw0, db0)
			})
		}
	}
}

// convGeneralAutogradCases run Conv2dWith forward and backward (x, w and b)
// against the float64 references; tolAG as the plain convolutions.
func convGeneralAutogradCases() []agCase {
	var cases []agCase
	for _, tc := range []struct {
		what string
		x, w []int
		bias bool
		o    tensor.ConvOptions
	}{
		{"rectangular, stride 2,1, padding 0,2", []int{2, 3, 8, 9}, []int{4, 3, 3, 5}, true, tensor.ConvOptions{Stride: [2]int{2, 1}, Padding: [2]int{0, 2}}},
		{"dilation 2", []int{2, 2, 9, 8}, []int{3, 2, 3, 3}, true, tensor.ConvOptions{Padding: [2]int{2, 1}, Dilation: [2]int{2, 2}}},
		{"groups 2 no bias", []int{2, 4, 7, 6}, []int{6, 2, 3, 3}, false, tensor.ConvOptions{Padding: [2]int{1, 1}, Groups: 2}},
		{"depthwise stride 2", []int{3, 5, 9, 8}, []int{5, 1, 3, 3}, true, tensor.ConvOptions{Stride: [2]int{2, 2}, Padding: [2]int{1, 1}, Groups: 5}},
		{"depthwise x2 dilation 1,3", []int{2, 3, 7, 11}, []int{6, 1, 2, 3}, true, tensor.ConvOptions{Dilation: [2]int{1, 3}, Groups: 3}},
	} {
		ins := []agInput{in(true, tc.x...), in(true, tc.w...)}
		if tc.bias {
			ins = append(ins, in(true, tc.w[0]))
		}
		o := tc.o
		g := tensor.ConvGeom{N: tc.x[0], C: tc.x[1], H: tc.x[2], W: tc.x[3], K: tc.w[0], R: tc.w[2], S: tc.w[3],
			StrideH: max(o.Stride[0], 1), StrideW: max(o.Stride[1], 1), PadH: o.Padding[0], PadW: o.Padding[1],
			DilationH: o.Dilation[0], DilationW: o.Dilation[1], Groups: o.Groups}
		bias := tc.bias
		cases = append(cases, agCase{
			name: "Conv2dWith/" + tc.what, inputs: ins, tol: tolAG,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				var b *tensor.Tensor
				if bias {
					b = t[2]
				}
				return tensor.Conv2dWith(t[0], t[1], b, o)
			},
			ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
				var b []float32
				if bias {
					b = v[2]
				}
				y, _ := refConvGeneral(v[0], v[1], b, g)
				r := refConvGeneralBackward(gout, v[0], v[1], g)
				grads := [][]float64{r.dx, r.dw}
				if bias {
					grads = append(grads, r.db)
				}
				return y, grads
			},
		})
	}
	return cases
}

// checkConvBackward runs Conv2dBackward of geometry g (dy masked by yb
// under g.ReLU) for the gradients asked for, dw and db accumulating onto
// dw0 and db0, and compares them with the reference r.
func checkConvBackward(e *env, wantDx, wantDw, wantDb bool, dy, x, w []float32, yb tensor.Buffer, g tensor.ConvGeom, r convGrads, dw0, db0 []float32) {
	var dx, dw, db *dbuf
	var dxb, dwb, dbb tensor.Buffer
	if wantDx {
		dx = e.nanOut("dx", len(x))
		dxb = dx.win
	}
	if wantDw {
		dw = e.f32("dw", dw0, false)
		dwb = dw.win
	}
	if wantDb {
		db = e.f32("db", db0, false)
		dbb = db.win
	}
	e.b.Conv2dBackward(dxb, dwb, dbb, e.in("dy", dy), e.in("x", x), e.in("w", w), yb, g)
	if dx != nil {
		e.near("Conv2dBackward dx", dims(g.N, g.C, g.H, g.W), e.getF(dx), r.dx, r.dxB, tolAcc)
	}
	if dw != nil {
		for i, v := range dw0 {
			r.dw[i] += float64(v)
			r.dwB[i] += math.Abs(float64(v))
		}
		e.near("Conv2dBackward dw (accumulated)", dims(g.K, g.C/g.GroupCount(), g.R, g.S), e.getF(dw), r.dw, r.dwB, tolAcc)
	}
	if db != nil {
		for i, v := range db0 {
			r.db[i] += float64(v)
			r.dbB[i] += math.Abs(float64(v))
		}
		e.near("Conv2dBackward db (accumulated)", dims(g.K), e.getF(db), r.db, r.dbB, tolAcc)
	}
}
