package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Conformance of general pooling: max pooling with padding and ceil mode
// (Backend), average and adaptive pooling (tensor.PoolBackend), forward
// and backward, against plain float64 loops written from torch's
// definitions.

// refPoolOut counts the windows along one axis, from torch's rules
// rather than its formula: in floor mode the windows that fit in the
// padded input; in ceil mode those that start at or before the last start
// the rounded-up division allows and inside the input or its left padding.
func refPoolOut(in, k, stride, pad int, ceil bool) int {
	n := 0
	for i := 0; ; i++ {
		fits := i*stride+k <= in+2*pad
		if ceil {
			fits = i*stride < in+2*pad-k+stride && i*stride-pad < in
		}
		if !fits {
			return n
		}
		n++
	}
}

// refMaxPoolGeneral is max pooling g of x with implicit -inf padding: the
// maxima and their flat positions in the input plane (the first maximum in
// row-major order wins).
func refMaxPoolGeneral(x []float32, g tensor.PoolGeom) ([]float32, []int32) {
	oh, ow := refPoolOut(g.H, g.KH, g.StrideH, g.PadH, g.CeilMode), refPoolOut(g.W, g.KW, g.StrideW, g.PadW, g.CeilMode)
	y, idx := make([]float32, g.N*g.C*oh*ow), make([]int32, g.N*g.C*oh*ow)
	for p := 0; p < g.N*g.C; p++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				best, at := float32(math.Inf(-1)), int32(-1)
				for r := 0; r < g.KH; r++ {
					for s := 0; s < g.KW; s++ {
						h, w := i*g.StrideH-g.PadH+r, j*g.StrideW-g.PadW+s
						if h < 0 || h >= g.H || w < 0 || w >= g.W {
							continue
						}
						if v := x[(p*g.H+h)*g.W+w]; at < 0 || v > best {
							best, at = v, int32(h*g.W+w)
						}
					}
				}
				y[(p*oh+i)*ow+j], idx[(p*oh+i)*ow+j] = best, at
			}
		}
	}
	return y, idx
}

// refRoute adds dy to dx at the argmax positions (+ dx0 when not nil) and
// returns dx with the bound Σ|terms|.
func refRoute(dy []float32, idx []int32, dx0 []float32, planes, plane int) (dx, bound []float64) {
	dx, bound = make([]float64, planes*plane), make([]float64, planes*plane)
	for i, v := range dx0 {
		dx[i], bound[i] = float64(v), math.Abs(float64(v))
	}
	out := len(dy) / max(planes, 1)
	for o, d := range dy {
		at := o/out*plane + int(idx[o])
		dx[at] += float64(d)
		bound[at] += math.Abs(float64(d))
	}
	return dx, bound
}

// refAvgDivisor is torch's divisor of window (i, j): the override, or the
// number of window positions inside the padded input (counting padding) or
// inside the input (ExcludePad).
func refAvgDivisor(g tensor.AvgPoolGeom, i, j int) int {
	if g.Divisor > 0 {
		return g.Divisor
	}
	lo, hiH, hiW := -g.PadH, g.H+g.PadH, g.W+g.PadW
	loW := -g.PadW
	if g.ExcludePad {
		lo, loW, hiH, hiW = 0, 0, g.H, g.W
	}
	rows, cols := 0, 0
	for r := 0; r < g.KH; r++ {
		if h := i*g.StrideH - g.PadH + r; h >= lo && h < hiH {
			rows++
		}
	}
	for s := 0; s < g.KW; s++ {
		if w := j*g.StrideW - g.PadW + s; w >= loW && w < hiW {
			cols++
		}
	}
	return rows * cols
}

// refAvgPool visits, for every output o of average pooling g, each input
// element (flat index) of its window and the window's divisor.
func refAvgPool(g tensor.AvgPoolGeom, f func(o, xi, div int)) (oh, ow int) {
	oh, ow = refPoolOut(g.H, g.KH, g.StrideH, g.PadH, g.CeilMode), refPoolOut(g.W, g.KW, g.StrideW, g.PadW, g.CeilMode)
	for p := 0; p < g.N*g.C; p++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				div := refAvgDivisor(g, i, j)
				for r := 0; r < g.KH; r++ {
					for s := 0; s < g.KW; s++ {
						h, w := i*g.StrideH-g.PadH+r, j*g.StrideW-g.PadW+s
						if h >= 0 && h < g.H && w >= 0 && w < g.W {
							f((p*oh+i)*ow+j, (p*g.H+h)*g.W+w, div)
						}
					}
				}
			}
		}
	}
	return oh, ow
}

// refAdaptiveWindow is torch's adaptive window [lo, hi) of output i of
// out along an axis of in: floor(i·in/out) to ceil((i+1)·in/out), here
// from float64 quotients (exact for these small sizes: a quotient of
// integers below 2^26 is never within rounding of an integer it is not).
func refAdaptiveWindow(i, in, out int) (lo, hi int) {
	return int(math.Floor(float64(i*in) / float64(out))), int(math.Ceil(float64((i+1)*in) / float64(out)))
}

// refAdaptive visits, for every output o of adaptive pooling g, each input
// element of its window and the window's size.
func refAdaptive(g tensor.AdaptivePoolGeom, f func(o, xi, size int)) {
	for p := 0; p < g.N*g.C; p++ {
		for i := 0; i < g.OutH; i++ {
			h0, h1 := refAdaptiveWindow(i, g.H, g.OutH)
			for j := 0; j < g.OutW; j++ {
				w0, w1 := refAdaptiveWindow(j, g.W, g.OutW)
				for h := h0; h < h1; h++ {
					for w := w0; w < w1; w++ {
						f((p*g.OutH+i)*g.OutW+j, (p*g.H+h)*g.W+w, (h1-h0)*(w1-w0))
					}
				}
			}
		}
	}
}

// refAdaptiveMax is adaptive max pooling g of x: maxima and positions.
func refAdaptiveMax(x []float32, g tensor.AdaptivePoolGeom) ([]float32, []int32) {
	n := g.N * g.C * g.OutH * g.OutW
	y, idx := make([]float32, n), make([]int32, n)
	for i := range idx {
		idx[i] = -1
	}
	refAdaptive(g, func(o, xi, _ int) {
		if v := x[xi]; idx[o] < 0 || v > y[o] {
			y[o], idx[o] = v, int32(xi%(g.H*g.W))
		}
	})
	return y, idx
}

// maxPoolGeneralCases: padding, ceil mode with windows hanging off the far
// edge, a ceil-mode window that would start in the right padding (H 5,
// window 2, stride 2, padding 1: torch keeps 3 rows, not 4), overlapping
// padded windows, rectangular windows and strides.
var maxPoolGeneralCases = []tensor.PoolGeom{
	{N: 2, C: 3, H: 7, W: 9, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	{N: 2, C: 2, H: 7, W: 8, KH: 2, KW: 2, StrideH: 2, StrideW: 2, CeilMode: true},
	{N: 1, C: 3, H: 10, W: 11, KH: 3, KW: 2, StrideH: 3, StrideW: 2, PadH: 1, CeilMode: true},
	{N: 2, C: 2, H: 5, W: 6, KH: 2, KW: 2, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, CeilMode: true},
	{N: 3, C: 2, H: 6, W: 5, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	{N: 1, C: 4, H: 9, W: 4, KH: 4, KW: 1, StrideH: 3, StrideW: 1, PadH: 2, CeilMode: true},
}

func poolGeneralStr(g tensor.PoolGeom) string {
	return fmt.Sprintf("x [%d,%d,%d,%d] window %dx%d stride %d,%d pad %d,%d ceil=%v",
		g.N, g.C, g.H, g.W, g.KH, g.KW, g.StrideH, g.StrideW, g.PadH, g.PadW, g.CeilMode)
}

// avgPoolCases: each pooling geometry is run counting the padding,
// excluding it, and with a divisor override.
var avgPoolCases = []tensor.PoolGeom{
	{N: 2, C: 3, H: 7, W: 9, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
	{N: 2, C: 2, H: 7, W: 8, KH: 2, KW: 2, StrideH: 2, StrideW: 2, CeilMode: true},
	{N: 1, C: 3, H: 10, W: 11, KH: 3, KW: 2, StrideH: 3, StrideW: 2, PadH: 1, PadW: 1, CeilMode: true},
	{N: 2, C: 2, H: 5, W: 6, KH: 2, KW: 2, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, CeilMode: true},
	{N: 3, C: 2, H: 6, W: 5, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1},
	{N: 4, C: 20, H: 24, W: 24, KH: 2, KW: 2, StrideH: 2, StrideW: 2},
}

// adaptiveCases: sizes that divide, that do not (overlapping windows of
// two sizes), global pooling, an output larger than its input, identity.
var adaptiveCases = []tensor.AdaptivePoolGeom{
	{N: 2, C: 3, H: 8, W: 6, OutH: 4, OutW: 3},
	{N: 2, C: 3, H: 7, W: 9, OutH: 3, OutW: 4},
	{N: 3, C: 4, H: 10, W: 7, OutH: 1, OutW: 1},
	{N: 1, C: 2, H: 3, W: 5, OutH: 5, OutW: 7},
	{N: 2, C: 2, H: 5, W: 5, OutH: 5, OutW: 5},
	{N: 2, C: 5, H: 13, W: 11, OutH: 6, OutW: 5},
}

func adaptiveStr(g tensor.AdaptivePoolGeom) string {
	return fmt.Sprintf("x [%d,%d,%d,%d] to %dx%d", g.N, g.C, g.H, g.W, g.OutH, g.OutW)
}

// poolInput draws the pooling inputs of kind: distinct values, all
// negative ones (a maximum initialised to 0 would be wrong), or small
// integers with many ties (the first maximum wins).
func (e *env) poolInput(kind string, n int) []float32 {
	switch kind {
	case "negative":
		return e.uniform(n, -20, -10)
	case "ties":
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(e.rng.IntN(3))
		}
		return x
	}
	return e.distinct(n)
}

// testMaxPoolGeneral checks max pooling with padding and ceil mode (exact
// maxima and positions; the backward pass tolElem, a few additions per
// element). Backward passes overwrite (dx NaN before) or accumulate
// (random dx before).
func testMaxPoolGeneral(e *env) {
	for _, g := range maxPoolGeneralCases {
		if g.OutH() != refPoolOut(g.H, g.KH, g.StrideH, g.PadH, g.CeilMode) || g.OutW() != refPoolOut(g.W, g.KW, g.StrideW, g.PadW, g.CeilMode) {
			e.fail("PoolGeom %s: OutH/OutW %d,%d, reference %d,%d", poolGeneralStr(g), g.OutH(), g.OutW(),
				refPoolOut(g.H, g.KH, g.StrideH, g.PadH, g.CeilMode), refPoolOut(g.W, g.KW, g.StrideW, g.PadW, g.CeilMode))
			continue
		}
		n := g.N * g.C * g.H * g.W
		for _, kind := range []string{"distinct", "negative", "ties"} {
			e.tcase("MaxPool2d %s %s", poolGeneralStr(g), kind)(func() {
				x := e.poolInput(kind, n)
				wantY, wantI := refMaxPoolGeneral(x, g)
				y := e.nanOut("y", len(wantY))
				idx := e.i32("argmax", fillI(len(wantI), -1), false)
				tensor.Complete(e.b).MaxPool2d(y.win, idx.win, e.in("x", x), g)
				shape := dims(g.N, g.C, g.OutH(), g.OutW())
				e.exactF("MaxPool2d y", shape, e.getF(y), wantY)
				exactI(e, "MaxPool2d argmax", shape, e.getI(idx), wantI)
			})
		}
		for _, acc := range []bool{false, true} {
			e.tcase("MaxPool2dBackward %s accumulate=%v", poolGeneralStr(g), acc)(func() {
				_, idx := refMaxPoolGeneral(e.poolInput("ties", n), g)
				dy := e.normal(len(idx), 1)
				var dx0 []float32
				dx := e.nanOut("dx", n)
				if acc {
					dx0 = e.normal(n, 1)
					dx = e.f32("dx0", dx0, false)
				}
				want, bound := refRoute(dy, idx, dx0, g.N*g.C, g.H*g.W)
				tensor.Complete(e.b).MaxPool2dBackward(dx.win, e.in("dy", dy), e.i32("argmax", idx, true).win, g, acc)
				e.near("MaxPool2dBackward dx", dims(g.N, g.C, g.H, g.W), e.getF(dx), want, bound, tolElem)
			})
		}
	}
}

// testPooling checks, on a PoolBackend, average pooling (tolAcc relative
// to Σ|x|/divisor: a sum of at most KH·KW terms and one division) and
// adaptive pooling (likewise; maxima exact), as testMaxPoolGeneral does max
// pooling.
func testPooling(e *env) {
	pb, ok := e.b.(tensor.PoolBackend)
	if !ok {
		e.t.Skipf("backend %s does not implement tensor.PoolBackend: average and adaptive pooling not checked", e.b.Name())
	}
	for _, pg := range avgPoolCases {
		for _, mode := range []struct {
			exclude bool
			divisor int
		}{{false, 0}, {true, 0}, {false, 5}} {
			g := tensor.AvgPoolGeom{PoolGeom: pg, ExcludePad: mode.exclude, Divisor: mode.divisor}
			what := fmt.Sprintf("%s exclude_pad=%v divisor=%d", poolGeneralStr(pg), mode.exclude, mode.divisor)
			n := g.N * g.C * g.H * g.W
			e.tcase("AvgPool2d %s", what)(func() {
				x := e.normal(n, 1)
				oh, ow := g.OutH(), g.OutW()
				want, bound := make([]float64, g.N*g.C*oh*ow), make([]float64, g.N*g.C*oh*ow)
				rh, rw := refAvgPool(g, func(o, xi, div int) {
					want[o] += float64(x[xi]) / float64(div)
					bound[o] += math.Abs(float64(x[xi])) / float64(div)
				})
				if rh != oh || rw != ow {
					e.fail("OutH/OutW %d,%d, reference %d,%d", oh, ow, rh, rw)
					return
				}
				y := e.nanOut("y", len(want))
				pb.AvgPool2d(y.win, e.in("x", x), g)
				e.near("AvgPool2d y", dims(g.N, g.C, oh, ow), e.getF(y), want, bound, tolAcc)
			})
			for _, acc := range []bool{false, true} {
				e.tcase("AvgPool2dBackward %s accumulate=%v", what, acc)(func() {
					dy := e.normal(g.N*g.C*g.OutH()*g.OutW(), 1)
					want, bound := make([]float64, n), make([]float64, n)
					dx := e.nanOut("dx", n)
					if acc {
						dx0 := e.normal(n, 1)
						dx = e.f32("dx0", dx0, false)
						for i, v := range dx0 {
							want[i], bound[i] = float64(v), math.Abs(float64(v))
						}
					}
					refAvgPool(g, func(o, xi, div int) {
						want[xi] += float64(dy[o]) / float64(div)
						bound[xi] += math.Abs(float64(dy[o])) / float64(div)
					})
					pb.AvgPool2dBackward(dx.win, e.in("dy", dy), g, acc)
					e.near("AvgPool2dBackward dx", dims(g.N, g.C, g.H, g.W), e.getF(dx), want, bound, tolAcc)
				})
			}
		}
	}
	for _, g := range adaptiveCases {
		n, out := g.N*g.C*g.H*g.W, g.N*g.C*g.OutH*g.OutW
		shape := dims(g.N, g.C, g.OutH, g.OutW)
		e.tcase("AdaptiveAvgPool2d %s", adaptiveStr(g))(func() {
			x := e.normal(n, 1)
			want, bound := make([]float64, out), make([]float64, out)
			refAdaptive(g, func(o, xi, size int) {
				want[o] += float64(x[xi]) / float64(size)
				bound[o] += math.Abs(float64(x[xi])) / float64(size)
			})
			y := e.nanOut("y", out)
			pb.AdaptiveAvgPool2d(y.win, e.in("x", x), g)
			e.near("AdaptiveAvgPool2d y", shape, e.getF(y), want, bound, tolAcc)
		})
		for _, kind := range []string{"distinct", "negative", "ties"} {
			e.tcase("AdaptiveMaxPool2d %s %s", adaptiveStr(g), kind)(func() {
				x := e.poolInput(kind, n)
				wantY, wantI := refAdaptiveMax(x, g)
				y := e.nanOut("y", out)
				idx := e.i32("argmax", fillI(out, -1), false)
				pb.AdaptiveMaxPool2d(y.win, idx.win, e.in("x", x), g)
				e.exactF("AdaptiveMaxPool2d y", shape, e.getF(y), wantY)
				exactI(e, "AdaptiveMaxPool2d argmax", shape, e.getI(idx), wantI)
			})
		}
		for _, acc := range []bool{false, true} {
			e.tcase("Adaptive pooling backward %s accumulate=%v", adaptiveStr(g), acc)(func() {
				dy := e.normal(out, 1)
				var dx0 []float32
				if acc {
					dx0 = e.normal(n, 1)
				}
				newDX := func(name string) *dbuf {
					if acc {
						return e.f32(name, dx0, false)
					}
					return e.nanOut(name, n)
				}
				want, bound := make([]float64, n), make([]float64, n)
				for i, v := range dx0 {
					want[i], bound[i] = float64(v), math.Abs(float64(v))
				}
				refAdaptive(g, func(o, xi, size int) {
					want[xi] += float64(dy[o]) / float64(size)
					bound[xi] += math.Abs(float64(dy[o])) / float64(size)
				})
				dxAvg := newDX("dx avg")
				pb.AdaptiveAvgPool2dBackward(dxAvg.win, e.in("dy", dy), g, acc)
				e.near("AdaptiveAvgPool2dBackward dx", dims(g.N, g.C, g.H, g.W), e.getF(dxAvg), want, bound, tolAcc)

				_, idx := refAdaptiveMax(e.poolInput("ties", n), g)
				wantM, boundM := refRoute(dy, idx, dx0, g.N*g.C, g.H*g.W)
				dxMax := newDX("dx max")
				pb.AdaptiveMaxPool2dBackward(dxMax.win, e.in("dy max", dy), e.i32("argmax", idx, true).win, g, acc)
				e.near("AdaptiveMaxPool2dBackward dx", dims(g.N, g.C, g.H, g.W), e.getF(dxMax), wantM, boundM, tolElem)
			})
		}
	}
}

// poolAutogradCases run the pooling operations of the tensor layer forward
// and backward against the float64 references: maxima exact (distinct
// inputs, so every backend picks the same element), averages tolAG.
func poolAutogradCases() []agCase {
	var cases []agCase
	for _, tc := range []struct {
		what string
		x    []int
		o    tensor.PoolOptions
	}{
		{"k3 s2 pad 1", []int{2, 3, 9, 8}, tensor.PoolOptions{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}}},
		{"k2 ceil mode odd sizes", []int{2, 2, 7, 9}, tensor.PoolOptions{Kernel: [2]int{2, 2}, CeilMode: true}},
		{"k3x2 s2,1 pad 1,0 ceil", []int{1, 3, 8, 7}, tensor.PoolOptions{Kernel: [2]int{3, 2}, Stride: [2]int{2, 1}, Padding: [2]int{1, 0}, CeilMode: true}},
	} {
		x := tc.x
		o := tc.o
		stride := o.Stride
		if stride == [2]int{} {
			stride = o.Kernel
		}
		pg := tensor.PoolGeom{N: x[0], C: x[1], H: x[2], W: x[3], KH: o.Kernel[0], KW: o.Kernel[1], StrideH: stride[0], StrideW: stride[1],
			PadH: o.Padding[0], PadW: o.Padding[1], CeilMode: o.CeilMode}
		cases = append(cases, agCase{
			name: "MaxPool2dWith/" + tc.what, inputs: []agInput{inK("distinct", x...)}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.MaxPool2dWith(t[0], o) },
			ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
				y, idx := refMaxPoolGeneral(v[0], pg)
				dx, _ := refRoute(gout, idx, nil, pg.N*pg.C, pg.H*pg.W)
				return f64(y), [][]float64{dx}
			},
		})
		for _, mode := range []tensor.AvgPoolOptions{{PoolOptions: o}, {PoolOptions: o, ExcludePad: true}, {PoolOptions: o, Divisor: 3}} {
			g := tensor.AvgPoolGeom{PoolGeom: pg, ExcludePad: mode.ExcludePad, Divisor: mode.Divisor}
			cases = append(cases, agCase{
				name:   fmt.Sprintf("AvgPool2d/%s exclude_pad=%v divisor=%d", tc.what, mode.ExcludePad, mode.Divisor),
				inputs: []agInput{in(true, x...)}, tol: tolAG, skip: needsPoolBackend,
				fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.AvgPool2d(t[0], mode) },
				ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
					y := make([]float64, len(gout))
					dx := make([]float64, len(v[0]))
					refAvgPool(g, func(o, xi, div int) {
						y[o] += float64(v[0][xi]) / float64(div)
						dx[xi] += float64(gout[o]) / float64(div)
					})
					return y, [][]float64{dx}
				},
			})
		}
	}
	for _, g := range []tensor.AdaptivePoolGeom{{N: 2, C: 3, H: 7, W: 9, OutH: 3, OutW: 4}, {N: 2, C: 4, H: 6, W: 5, OutH: 1, OutW: 1}, {N: 1, C: 2, H: 3, W: 5, OutH: 5, OutW: 7}} {
		x := []int{g.N, g.C, g.H, g.W}
		cases = append(cases,
			agCase{
				name: "AdaptiveAvgPool2d/" + adaptiveStr(g), inputs: []agInput{in(true, x...)}, tol: tolAG, skip: needsPoolBackend,
				fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
					return tensor.AdaptiveAvgPool2d(t[0], g.OutH, g.OutW)
				},
				ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
					y, dx := make([]float64, len(gout)), make([]float64, len(v[0]))
					refAdaptive(g, func(o, xi, size int) {
						y[o] += float64(v[0][xi]) / float64(size)
						dx[xi] += float64(gout[o]) / float64(size)
					})
					return y, [][]float64{dx}
				},
			},
			agCase{
				name: "AdaptiveMaxPool2d/" + adaptiveStr(g), inputs: []agInput{inK("distinct", x...)}, tol: tolElem, skip: needsPoolBackend,
				fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
					return tensor.AdaptiveMaxPool2d(t[0], g.OutH, g.OutW)
				},
				ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
					y, idx := refAdaptiveMax(v[0], g)
					dx, _ := refRoute(gout, idx, nil, g.N*g.C, g.H*g.W)
					return f64(y), [][]float64{dx}
				},
			})
	}
	return cases
}

// needsPoolBackend skips the cases of average and adaptive pooling on a
// backend without tensor.PoolBackend.
func needsPoolBackend(b tensor.Backend) string {
	if _, ok := b.(tensor.PoolBackend); !ok {
		return fmt.Sprintf("backend %s does not implement tensor.PoolBackend", b.Name())
	}
	return ""
}
