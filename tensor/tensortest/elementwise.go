package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// Conformance of the strided elementwise core (Unary, UnaryBackward,
// Binary, Where, CopyView) and of Reduce, against float64 references
// written here as plain loops over multi-indices.

// tolTrans is the tolerance of the transcendental unary operations (exp,
// log, tanh, sigmoid, the GELU forms, SiLU, pow, sin, cos), relative to
// |want| + |x|: each backend computes them in float32 with library
// functions that err by up to 2 ulp (CUDA's expf, tanhf, erff, powf) and
// rounds a few times more around them (1 + erf, x·Φ), and a sum like
// 1 + erf(x) loses its relative accuracy where it cancels, leaving an
// absolute error of a few u times |x|. 1e-6 is about 16 u.
const tolTrans = 1e-6

// unaryCase is one UnaryOp with its float64 reference and derivative.
type unaryCase struct {
	op    tensor.UnaryOp
	name  string
	a, b  float32
	trans bool   // transcendental: tolTrans, else tolElem relative to |want|
	dom   string // input domain: "" normal, "pos" positive (log, sqrt, pow)
	f     func(x, a, b float64) float64
	df    func(x, a, b float64) float64
}

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

var unaryCases = []unaryCase{
	{op: tensor.OpIdentity, name: "Identity", f: func(x, _, _ float64) float64 { return x }, df: func(x, _, _ float64) float64 { return 1 }},
	{op: tensor.OpNeg, name: "Neg", f: func(x, _, _ float64) float64 { return -x }, df: func(x, _, _ float64) float64 { return -1 }},
	{op: tensor.OpAbs, name: "Abs", f: func(x, _, _ float64) float64 { return math.Abs(x) }, df: func(x, _, _ float64) float64 {
		switch {
		case x > 0:
			return 1
		case x < 0:
			return -1
		}
		return 0
	}},
	{op: tensor.OpExp, name: "Exp", trans: true, f: func(x, _, _ float64) float64 { return math.Exp(x) }, df: func(x, _, _ float64) float64 { return math.Exp(x) }},
	{op: tensor.OpLog, name: "Log", trans: true, dom: "pos", f: func(x, _, _ float64) float64 { return math.Log(x) }, df: func(x, _, _ float64) float64 { return 1 / x }},
	{op: tensor.OpSqrt, name: "Sqrt", dom: "pos", f: func(x, _, _ float64) float64 { return math.Sqrt(x) }, df: func(x, _, _ float64) float64 { return 0.5 / math.Sqrt(x) }},
	{op: tensor.OpRsqrt, name: "Rsqrt", dom: "pos", f: func(x, _, _ float64) float64 { return 1 / math.Sqrt(x) }, df: func(x, _, _ float64) float64 { return -0.5 * math.Pow(x, -1.5) }},
	{op: tensor.OpRecip, name: "Recip", dom: "away", f: func(x, _, _ float64) float64 { return 1 / x }, df: func(x, _, _ float64) float64 { return -1 / (x * x) }},
	{op: tensor.OpSquare, name: "Square", f: func(x, _, _ float64) float64 { return x * x }, df: func(x, _, _ float64) float64 { return 2 * x }},
	{op: tensor.OpTanh, name: "Tanh", trans: true, f: func(x, _, _ float64) float64 { return math.Tanh(x) }, df: func(x, _, _ float64) float64 { t := math.Tanh(x); return 1 - t*t }},
	{op: tensor.OpSigmoid, name: "Sigmoid", trans: true, f: func(x, _, _ float64) float64 { return sigmoid64(x) }, df: func(x, _, _ float64) float64 { s := sigmoid64(x); return s * (1 - s) }},
	{op: tensor.OpReLU, name: "ReLU", f: func(x, _, _ float64) float64 { return math.Max(x, 0) }, df: func(x, _, _ float64) float64 {
		if x > 0 {
			return 1
		}
		return 0
	}},
	{op: tensor.OpLeakyReLU, name: "LeakyReLU", a: 0.01, f: func(x, a, _ float64) float64 {
		if x > 0 {
			return x
		}
		return a * x
	}, df: func(x, a, _ float64) float64 {
		if x > 0 {
			return 1
		}
		return a
	}},
	{op: tensor.OpGELU, name: "GELU", trans: true, f: func(x, _, _ float64) float64 { return x * 0.5 * (1 + math.Erf(x/math.Sqrt2)) },
		df: func(x, _, _ float64) float64 {
			return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*math.Exp(-x*x/2)/math.Sqrt(2*math.Pi)
		}},
	{op: tensor.OpGELUTanh, name: "GELUTanh", trans: true, f: func(x, _, _ float64) float64 {
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	}, df: func(x, _, _ float64) float64 {
		k := math.Sqrt(2 / math.Pi)
		t := math.Tanh(k * (x + 0.044715*x*x*x))
		return 0.5*(1+t) + 0.5*x*(1-t*t)*k*(1+3*0.044715*x*x)
	}},
	{op: tensor.OpSiLU, name: "SiLU", trans: true, f: func(x, _, _ float64) float64 { return x * sigmoid64(x) },
		df: func(x, _, _ float64) float64 { s := sigmoid64(x); return s * (1 + x*(1-s)) }},
	{op: tensor.OpClamp, name: "Clamp", a: -0.5, b: 0.75, f: func(x, a, b float64) float64 { return math.Min(math.Max(x, a), b) },
		df: func(x, a, b float64) float64 {
			if x >= a && x <= b {
				return 1
			}
			return 0
		}},
	{op: tensor.OpPowScalar, name: "PowScalar", a: 2.5, trans: true, dom: "pos", f: func(x, a, _ float64) float64 { return math.Pow(x, a) },
		df: func(x, a, _ float64) float64 { return a * math.Pow(x, a-1) }},
	{op: tensor.OpAddScalar, name: "AddScalar", a: 1.25, f: func(x, a, _ float64) float64 { return x + a }, df: func(x, _, _ float64) float64 { return 1 }},
	{op: tensor.OpMulScalar, name: "MulScalar", a: -3, f: func(x, a, _ float64) float64 { return x * a }, df: func(x, a, _ float64) float64 { return a }},
	{op: tensor.OpAffine, name: "Affine", a: 0.5, b: -2, f: func(x, a, b float64) float64 { return x*a + b }, df: func(x, a, _ float64) float64 { return a }},
	{op: tensor.OpSin, name: "Sin", trans: true, f: func(x, _, _ float64) float64 { return math.Sin(x) }, df: func(x, _, _ float64) float64 { return math.Cos(x) }},
	{op: tensor.OpCos, name: "Cos", trans: true, f: func(x, _, _ float64) float64 { return math.Cos(x) }, df: func(x, _, _ float64) float64 { return -math.Sin(x) }},
}

// viewCase is a view of a source of srcLen elements (strides may be 0).
type viewCase struct {
	name           string
	srcLen         int
	shape, strides []int
}

func denseStrides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for k := len(shape) - 1; k >= 0; k-- {
		st[k] = s
		s *= shape[k]
	}
	return st
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func dense(shape ...int) viewCase {
	return viewCase{name: fmt.Sprintf("dense %v", shape), srcLen: prod(shape), shape: shape, strides: denseStrides(shape)}
}

// unaryViews: odd dense sizes, a transpose, a slice (every other column of
// a wider matrix), a broadcast row and a size-1 axis with a large stride.
var unaryViews = []viewCase{
	dense(1), dense(7), dense(33), dense(1025), dense(65537), dense(3, 5, 7),
	{"transpose of [7,5]", 35, []int{5, 7}, []int{1, 5}},
	{"slice [4,9] of [4,20] step 2", 4 * 20, []int{4, 9}, []int{20, 2}},
	{"broadcast rows [6,33]", 33, []int{6, 33}, []int{0, 1}},
	{"size-1 axis", 40, []int{1, 33, 1}, []int{999, 1, 5}},
}

// viewOffsets lists the element offsets of a view in row-major order
// (an independent multi-index walk).
func viewOffsets(shape, strides []int) []int {
	n := prod(shape)
	out := make([]int, n)
	idx := make([]int, len(shape))
	for i := range out {
		off := 0
		for k := range idx {
			off += idx[k] * strides[k]
		}
		out[i] = off
		for k := len(shape) - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < shape[k] {
				break
			}
			idx[k] = 0
		}
	}
	return out
}

func (e *env) domain(dom string, n int) []float32 {
	switch dom {
	case "pos":
		return e.uniform(n, 0.05, 4)
	case "away":
		x := e.normal(n, 1)
		for i, v := range x {
			if math.Abs(float64(v)) < 0.1 {
				x[i] = float32(math.Copysign(0.1, float64(v))) + v
			}
		}
		return x
	}
	x := e.normal(n, 1.5)
	for i := 0; i < n; i += 9 { // exact zeros: the kinks of Abs and ReLU
		x[i] = 0
	}
	return x
}

// nearNaN is near for results that may be NaN: where want is NaN, got must
// be NaN (any payload); the other elements are checked by near.
func (e *env) nearNaN(what string, shape []int, got []float32, want, bound []float64, tol float64) {
	e.t.Helper()
	g, w := append([]float32(nil), got...), append([]float64(nil), want...)
	for i := range w {
		if math.IsNaN(w[i]) {
			if !math.IsNaN(float64(g[i])) {
				e.fail("%s %v: element %s is %g, want NaN", what, shape, unravel(i, shape), g[i])
				return
			}
			g[i], w[i] = 0, 0
		}
	}
	e.near(what, shape, g, w, bound, tol)
}

// testUnary: every UnaryOp over every view of unaryViews.
func testUnary(e *env) {
	for _, c := range unaryCases {
		for _, v := range unaryViews {
			e.tcase("%s %s", c.name, v.name)(func() {
				src := e.domain(c.dom, v.srcLen)
				if c.op == tensor.OpReLU || c.op == tensor.OpClamp || c.op == tensor.OpAbs {
					src[len(src)/2] = float32(math.NaN()) // NaN propagates
				}
				offs := viewOffsets(v.shape, v.strides)
				want, bound := make([]float64, len(offs)), make([]float64, len(offs))
				for i, o := range offs {
					x := float64(src[o])
					want[i] = c.f(x, float64(c.a), float64(c.b))
					bound[i] = math.Abs(want[i])
					if c.trans {
						bound[i] += math.Abs(x)
					}
				}
				tol := tolElem
				if c.trans {
					tol = tolTrans
				}
				dst := e.nanOut("dst", len(offs))
				e.b.Unary(c.op, dst.win, tensor.View{Buf: e.in("x", src), Strides: v.strides}, v.shape, c.a, c.b)
				e.nearNaN(c.name, v.shape, e.getF(dst), want, bound, tol)
			})
		}
	}
}

// testUnaryBackward: dx = dy·f'(x) (+ dx), tolerances as testUnary's with
// |dy·f'| (+ |dx|) as the bound.
func testUnaryBackward(e *env) {
	for _, c := range unaryCases {
		for _, n := range []int{1, 33, 1025, 4099} {
			for _, acc := range []bool{false, true} {
				e.tcase("%s n=%d accumulate=%v", c.name, n, acc)(func() {
					e.alignedOdd(n)
					x, dy, d0 := e.domain(c.dom, n), e.normal(n, 1), e.normal(n, 1)
					want, bound := make([]float64, n), make([]float64, n)
					for i := range x {
						want[i] = float64(dy[i]) * c.df(float64(x[i]), float64(c.a), float64(c.b))
						bound[i] = math.Abs(want[i])
						if c.trans {
							bound[i] += math.Abs(float64(dy[i])) * (1 + math.Abs(float64(x[i])))
						}
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
					e.b.UnaryBackward(c.op, dx.win, e.in("dy", dy), e.in("x", x), n, c.a, c.b, acc)
					tol := 2 * tolElem // f' rounds a few more times than f
					if c.trans {
						tol = 2 * tolTrans
					}
					e.near(c.name+" backward", dims(n), e.getF(dx), want, bound, tol)
				})
			}
		}
	}
}

type binaryCase struct {
	op   tensor.BinaryOp
	name string
	f    func(x, y float64) float64
	// sumBound: the bound is |x| + |y| (a sum may cancel), else |want|.
	sumBound, exact, pos bool
}

func b64(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

func nanOr(x, y float64, f func(x, y float64) float64) float64 {
	if math.IsNaN(x) || math.IsNaN(y) {
		return math.NaN()
	}
	return f(x, y)
}

var binaryCases = []binaryCase{
	{op: tensor.OpAdd, name: "Add", sumBound: true, f: func(x, y float64) float64 { return x + y }},
	{op: tensor.OpSub, name: "Sub", sumBound: true, f: func(x, y float64) float64 { return x - y }},
	{op: tensor.OpMul, name: "Mul", f: func(x, y float64) float64 { return x * y }},
	{op: tensor.OpDiv, name: "Div", f: func(x, y float64) float64 { return x / y }},
	{op: tensor.OpPow, name: "Pow", pos: true, f: math.Pow},
	{op: tensor.OpMaximum, name: "Maximum", exact: true, f: func(x, y float64) float64 { return nanOr(x, y, math.Max) }},
	{op: tensor.OpMinimum, name: "Minimum", exact: true, f: func(x, y float64) float64 { return nanOr(x, y, math.Min) }},
	{op: tensor.OpEq, name: "Eq", exact: true, f: func(x, y float64) float64 { return b64(x == y) }},
	{op: tensor.OpNe, name: "Ne", exact: true, f: func(x, y float64) float64 { return b64(x != y) }},
	{op: tensor.OpLt, name: "Lt", exact: true, f: func(x, y float64) float64 { return b64(x < y) }},
	{op: tensor.OpLe, name: "Le", exact: true, f: func(x, y float64) float64 { return b64(x <= y) }},
	{op: tensor.OpGt, name: "Gt", exact: true, f: func(x, y float64) float64 { return b64(x > y) }},
	{op: tensor.OpGe, name: "Ge", exact: true, f: func(x, y float64) float64 { return b64(x >= y) }},
}

// pairCase is an output shape with the views of two operands; aligned
// puts dst and both operands 16-byte aligned (as tensors are), not at the
// random odd places of the other cases, for the GPU's vector paths.
type pairCase struct {
	name    string
	shape   []int
	x, y    viewCase
	aligned bool
}

var binaryPairs = []pairCase{
	{"same [1]", []int{1}, dense(1), dense(1), false},
	{"same [7]", []int{7}, dense(7), dense(7), false},
	{"same [33]", []int{33}, dense(33), dense(33), false},
	{"same [1025]", []int{1025}, dense(1025), dense(1025), false},
	{"same [3,5,7]", []int{3, 5, 7}, dense(3, 5, 7), dense(3, 5, 7), false},
	{"same [65537]", []int{65537}, dense(65537), dense(65537), false},
	{"[3,1,5] with [4,1]", []int{3, 4, 5}, viewCase{"x", 15, []int{3, 4, 5}, []int{5, 0, 1}}, viewCase{"y", 4, []int{3, 4, 5}, []int{0, 1, 0}}, false},
	{"scalar y", []int{7, 33}, dense(7, 33), viewCase{"y", 1, []int{7, 33}, []int{0, 0}}, false},
	{"scalar x", []int{1000}, viewCase{"x", 1, []int{1000}, []int{0}}, dense(1000), false},
	{"transposed x, sliced y", []int{5, 7}, viewCase{"x", 35, []int{5, 7}, []int{1, 5}}, viewCase{"y", 5 * 16, []int{5, 7}, []int{16, 2}}, false},
	// One operand per channel, the other dense (a bias over NCHW): inner
	// sizes that are a multiple of 4 or not, the channel operand either
	// side, the channel last ([N, C] + [C]).
	{"[3,6,2,4] with a channel y [1,6,1,1]", []int{3, 6, 2, 4}, dense(3, 6, 2, 4), viewCase{"y", 6, []int{3, 6, 2, 4}, []int{0, 1, 0, 0}}, false},
	{"[3,6,2,4] with a channel y, aligned", []int{3, 6, 2, 4}, dense(3, 6, 2, 4), viewCase{"y", 6, []int{3, 6, 2, 4}, []int{0, 1, 0, 0}}, true},
	{"channel x [5,1,1] with [2,5,3,3]", []int{2, 5, 3, 3}, viewCase{"x", 5, []int{2, 5, 3, 3}, []int{0, 1, 0, 0}}, dense(2, 5, 3, 3), true},
	{"[9,7] with a channel y [7]", []int{9, 7}, dense(9, 7), viewCase{"y", 7, []int{9, 7}, []int{0, 1}}, false},
}

// testBinary: every BinaryOp over the pairs (broadcast, scalar, strided);
// single roundings: tolElem; comparisons, maximum and minimum exactly. The
// inputs share values on a grid in places, so that ties and equality occur,
// and hold NaNs.
func testBinary(e *env) {
	for _, c := range binaryCases {
		for _, p := range binaryPairs {
			e.tcase("%s %s", c.name, p.name)(func() {
				var xs, ys []float32
				if c.pos {
					xs, ys = e.uniform(p.x.srcLen, 0.1, 3), e.normal(p.y.srcLen, 1.5)
				} else {
					xs, ys = e.normal(p.x.srcLen, 1), e.normal(p.y.srcLen, 2)
					for i := 0; i < len(xs); i += 3 {
						xs[i] = float32(i%5) / 2
					}
					for i := 0; i < len(ys); i += 2 {
						ys[i] = float32(i%5) / 2
					}
					if c.exact && len(xs) > 4 {
						xs[len(xs)/3] = float32(math.NaN())
					}
					if c.exact && len(ys) > 4 {
						ys[len(ys)/2] = float32(math.NaN())
					}
				}
				xo, yo := viewOffsets(p.shape, p.x.strides), viewOffsets(p.shape, p.y.strides)
				want, bound := make([]float64, len(xo)), make([]float64, len(xo))
				for i := range xo {
					x, y := float64(xs[xo[i]]), float64(ys[yo[i]])
					want[i] = c.f(x, y)
					bound[i] = math.Abs(want[i])
					if c.sumBound {
						bound[i] = math.Abs(x) + math.Abs(y)
					}
				}
				tol := tolElem
				if c.exact {
					tol = 0
				} else if c.op == tensor.OpPow {
					tol = tolTrans
				}
				var dst *dbuf
				var xb, yb tensor.Buffer
				if p.aligned {
					dst = e.f32Pre("dst", fill(len(xo), float32(math.NaN())), false, 4)
					xb, yb = e.f32Pre("x", xs, true, 4).win, e.f32Pre("y", ys, true, 4).win
				} else {
					dst = e.nanOut("dst", len(xo))
					xb, yb = e.in("x", xs), e.in("y", ys)
				}
				e.b.Binary(c.op, dst.win, tensor.View{Buf: xb, Strides: p.x.strides}, tensor.View{Buf: yb, Strides: p.y.strides}, p.shape)
				e.nearNaN(c.name, p.shape, e.getF(dst), want, bound, tol)
			})
		}
	}
}

// testWhere: a broadcast condition, strided and broadcast operands; exact.
func testWhere(e *env) {
	type whereCase struct {
		name    string
		shape   []int
		c, x, y viewCase
	}
	cases := []whereCase{
		{"dense [1025]", []int{1025}, dense(1025), dense(1025), dense(1025)},
		{"cond [4,1] x [3,1,5] y scalar", []int{3, 4, 5}, viewCase{"c", 4, []int{3, 4, 5}, []int{0, 1, 0}},
			viewCase{"x", 15, []int{3, 4, 5}, []int{5, 0, 1}}, viewCase{"y", 1, []int{3, 4, 5}, []int{0, 0, 0}}},
		{"transposed x", []int{5, 7}, dense(5, 7), viewCase{"x", 35, []int{5, 7}, []int{1, 5}}, dense(5, 7)},
	}
	for _, c := range cases {
		e.tcase("%s", c.name)(func() {
			cs := make([]float32, c.c.srcLen)
			for i := range cs {
				cs[i] = float32(e.rng.IntN(2)) * float32(1+e.rng.IntN(3)) // 0, or a non-zero value
			}
			xs, ys := e.normal(c.x.srcLen, 1), e.normal(c.y.srcLen, 1)
			co, xo, yo := viewOffsets(c.shape, c.c.strides), viewOffsets(c.shape, c.x.strides), viewOffsets(c.shape, c.y.strides)
			want := make([]float32, len(co))
			for i := range co {
				if cs[co[i]] != 0 {
					want[i] = xs[xo[i]]
				} else {
					want[i] = ys[yo[i]]
				}
			}
			dst := e.nanOut("dst", len(co))
			e.b.Where(dst.win, tensor.View{Buf: e.in("cond", cs), Strides: c.c.strides},
				tensor.View{Buf: e.in("x", xs), Strides: c.x.strides}, tensor.View{Buf: e.in("y", ys), Strides: c.y.strides}, c.shape)
			e.exactF("Where", c.shape, e.getF(dst), want)
		})
	}
}

// testCopyView: strided destinations (a slice of a larger buffer, a
// transpose) from strided or broadcast sources; exact when copying, tolElem
// when accumulating. Elements of dst outside the view must keep their
// values.
func testCopyView(e *env) {
	type copyCase struct {
		name     string
		shape    []int
		dst, src viewCase
		aligned  bool // dst 16-byte aligned, as a tensor (the GPU's vector path)
	}
	cases := []copyCase{
		{"dense [1025]", []int{1025}, dense(1025), dense(1025), false},
		{"into columns 3..10 of [4,20]", []int{4, 7}, viewCase{"dst", 4*20 - 3, []int{4, 7}, []int{20, 1}}, dense(4, 7), false},
		{"transposed dst, sliced src", []int{5, 7}, viewCase{"dst", 35, []int{5, 7}, []int{1, 5}}, viewCase{"src", 5 * 16, []int{5, 7}, []int{16, 2}}, false},
		{"broadcast src into [3,4,5]", []int{3, 4, 5}, dense(3, 4, 5), viewCase{"src", 4, []int{3, 4, 5}, []int{0, 1, 0}}, false},
		{"pad interior of [9,35]", []int{7, 33}, viewCase{"dst", 9*35 - 36, []int{7, 33}, []int{35, 1}}, dense(7, 33), false},
		// One value per channel into a dense tensor (the gradient of a sum
		// over the other axes): inner 8 (four at a time when aligned), 5,
		// and the channel last.
		{"channel src into [3,6,2,4]", []int{3, 6, 2, 4}, dense(3, 6, 2, 4), viewCase{"src", 6, []int{3, 6, 2, 4}, []int{0, 1, 0, 0}}, false},
		{"channel src into [3,6,2,4], aligned", []int{3, 6, 2, 4}, dense(3, 6, 2, 4), viewCase{"src", 6, []int{3, 6, 2, 4}, []int{0, 1, 0, 0}}, true},
		{"channel src into [4,3,5], aligned", []int{4, 3, 5}, dense(4, 3, 5), viewCase{"src", 3, []int{4, 3, 5}, []int{0, 1, 0}}, true},
		{"channel src into [9,7]", []int{9, 7}, dense(9, 7), viewCase{"src", 7, []int{9, 7}, []int{0, 1}}, false},
	}
	for _, c := range cases {
		for _, acc := range []bool{false, true} {
			e.tcase("%s accumulate=%v", c.name, acc)(func() {
				d0, src := e.normal(c.dst.srcLen, 1), e.normal(c.src.srcLen, 1)
				want, bound := f64(d0), make([]float64, len(d0))
				for i, v := range d0 {
					bound[i] = math.Abs(float64(v))
				}
				do, so := viewOffsets(c.shape, c.dst.strides), viewOffsets(c.shape, c.src.strides)
				for i := range do {
					s := float64(src[so[i]])
					if acc {
						want[do[i]] += s
						bound[do[i]] += math.Abs(s)
					} else {
						want[do[i]], bound[do[i]] = s, math.Abs(s)
					}
				}
				var dst *dbuf
				if c.aligned {
					dst = e.f32Pre("dst", d0, false, 4)
				} else {
					dst = e.f32("dst", d0, false)
				}
				e.b.CopyView(tensor.View{Buf: dst.win, Strides: c.dst.strides}, tensor.View{Buf: e.in("src", src), Strides: c.src.strides}, c.shape, acc)
				tol := 0.0
				if acc {
					tol = tolElem
				}
				e.near("CopyView", dims(len(d0)), e.getF(dst), want, bound, tol)
			})
		}
	}
}

// testReduce: every ReduceOp over [outer, n, inner] shapes with rows
// (inner 1) and columns (inner > 1), long axes, NaNs in some columns and
// ties (grid values). Sums: tolAcc relative to Σ|x|; extremes and indices
// exactly.
func testReduce(e *env) {
	shapes := [][3]int{{1, 1, 1}, {3, 7, 1}, {2, 1025, 1}, {1000, 5, 1}, {3, 4099, 1}, {5, 33, 7}, {1, 4099, 3}, {7, 1, 33},
		{1, 65537, 1}, {5, 20001, 1}, {3, 1000, 17}, {2, 3, 1025}, {4, 0, 3}, {37, 784, 1}, {5, 36, 1}, {9, 8, 1},
		// few columns, a multiple of 4, along a short axis (aligned when n is
		// a multiple of 8), and one unaligned
		{1, 512, 64}, {3, 40, 8}, {2, 1024, 4}, {1, 8, 4096}, {2, 1000, 12}, {3, 37, 8}}
	ops := []struct {
		op   tensor.ReduceOp
		name string
	}{{tensor.ReduceSum, "Sum"}, {tensor.ReduceMax, "Max"}, {tensor.ReduceMin, "Min"}, {tensor.ReduceArgmax, "Argmax"}, {tensor.ReduceArgmin, "Argmin"}, {tensor.ReduceMean, "Mean"}}
	for _, o := range ops {
		for _, s := range shapes {
			outer, n, inner := s[0], s[1], s[2]
			if n == 0 && o.op != tensor.ReduceSum {
				continue
			}
			for _, acc := range []bool{false, true} {
				if acc && o.op != tensor.ReduceSum {
					continue
				}
				e.tcase("%s [%d,%d,%d] accumulate=%v", o.name, outer, n, inner, acc)(func() {
					x := e.grid(outer * n * inner) // ties
					if o.op == tensor.ReduceSum || o.op == tensor.ReduceMean {
						x = e.normal(len(x), 1)
						for i := range x {
							x[i] += 0.25
						}
					} else if len(x) > 8 {
						x[len(x)/2] = float32(math.NaN())
						x[len(x)/3] = float32(math.NaN())
					}
					m := outer * inner
					d0 := e.normal(m, 1)
					wantF, bound := make([]float64, m), make([]float64, m)
					wantI := make([]int32, m)
					for oi := range outer {
						for ii := range inner {
							r := oi*inner + ii
							var sum, abs float64
							best, at := math.NaN(), -1
							for k := range n {
								v := float64(x[(oi*n+k)*inner+ii])
								sum += v
								abs += math.Abs(v)
								if at >= 0 && math.IsNaN(best) {
									continue // the first NaN wins
								}
								better := at < 0 || math.IsNaN(v)
								if o.op == tensor.ReduceMax || o.op == tensor.ReduceArgmax {
									better = better || v > best
								} else {
									better = better || v < best
								}
								if better {
									best, at = v, k
								}
							}
							switch o.op {
							case tensor.ReduceSum:
								wantF[r], bound[r] = sum, abs
								if acc {
									wantF[r] += float64(d0[r])
									bound[r] += math.Abs(float64(d0[r]))
								}
							case tensor.ReduceMean:
								wantF[r], bound[r] = sum/float64(n), abs/float64(n)
							case tensor.ReduceMax, tensor.ReduceMin:
								wantF[r] = best
							default:
								wantI[r] = int32(at)
							}
						}
					}
					e.alignRows(n)
					xb := e.in("x", x)
					if o.op == tensor.ReduceArgmax || o.op == tensor.ReduceArgmin {
						dst := e.i32("dst", fillI(m, -5), false)
						e.b.Reduce(o.op, dst.win, xb, outer, n, inner, false)
						exactI(e, o.name, dims(outer, inner), e.getI(dst), wantI)
						return
					}
					var dst *dbuf
					if acc {
						dst = e.f32("dst", d0, false)
					} else {
						dst = e.nanOut("dst", m)
					}
					e.b.Reduce(o.op, dst.win, xb, outer, n, inner, acc)
					tol := tolAcc
					if o.op != tensor.ReduceSum && o.op != tensor.ReduceMean {
						tol = 0
					}
					e.nearNaN(o.name, dims(outer, inner), e.getF(dst), wantF, bound, tol)
				})
			}
		}
	}
}

// alignedAt returns the n elements of d's window from the first element
// whose offset is ≡ shift (mod 4): 16-byte aligned for shift 0 when the
// allocation is (a device may take a four-at-a-time path there, and
// another for shift 1). d's window must hold n+3 elements.
func alignedAt(d *dbuf, n, shift int) (tensor.Buffer, int) {
	s := ((shift-d.win.Off)%4 + 4) % 4
	return d.win.Slice(s, n), s
}

// testDenseAlignment: dense Unary and Binary (also with a scalar operand)
// on windows that start 16-byte aligned and on ones that do not, with
// lengths that leave a tail of 1 to 3; elements of dst's window outside
// the result must stay NaN. Tolerances as testUnary and testBinary.
func testDenseAlignment(e *env) {
	for _, n := range []int{4, 1025, 4099} {
		for _, shift := range []int{0, 1} {
			for _, c := range unaryCases {
				e.tcase("%s n=%d shift %d", c.name, n, shift)(func() {
					src := e.domain(c.dom, n+3)
					xb, xs := alignedAt(e.f32("x", src, true), n, shift)
					d := e.nanOut("dst", n+3)
					db, ds := alignedAt(d, n, shift)
					want, bound := fill64(n+3, math.NaN()), make([]float64, n+3)
					for i := range n {
						x := float64(src[xs+i])
						want[ds+i] = c.f(x, float64(c.a), float64(c.b))
						bound[ds+i] = math.Abs(want[ds+i]) + math.Abs(x)
					}
					e.b.Unary(c.op, db, tensor.Dense(xb, []int{n}), []int{n}, c.a, c.b)
					e.nearNaN(c.name, dims(n+3), e.getF(d), want, bound, tolTrans)
				})
			}
			for _, c := range binaryCases {
				for _, scalar := range []bool{false, true} {
					e.tcase("%s n=%d shift %d scalar y %v", c.name, n, shift, scalar)(func() {
						xsrc, ysrc := e.uniform(n+3, 0.5, 2), e.normal(n+3, 1)
						xb, xo := alignedAt(e.f32("x", xsrc, true), n, shift)
						yb, yo := alignedAt(e.f32("y", ysrc, true), n, shift)
						yv := tensor.Dense(yb, []int{n})
						if scalar {
							yv.Strides = []int{0}
						}
						d := e.nanOut("dst", n+3)
						db, ds := alignedAt(d, n, shift)
						want, bound := fill64(n+3, math.NaN()), make([]float64, n+3)
						for i := range n {
							j := yo + i
							if scalar {
								j = yo
							}
							x, y := float64(xsrc[xo+i]), float64(ysrc[j])
							want[ds+i] = c.f(x, y)
							bound[ds+i] = math.Abs(x) + math.Abs(y) + math.Abs(want[ds+i])
						}
						e.b.Binary(c.op, db, tensor.Dense(xb, []int{n}), yv, []int{n})
						e.nearNaN(c.name, dims(n+3), e.getF(d), want, bound, tolTrans)
					})
				}
			}
		}
	}
}

func fill64(n int, v float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// elementwiseTests are the RunBackend subtests of this file.
var elementwiseTests = []namedTest{
	{"Unary", testUnary},
	{"UnaryBackward", testUnaryBackward},
	{"Binary", testBinary},
	{"DenseAlignment", testDenseAlignment},
	{"Where", testWhere},
	{"CopyView", testCopyView},
	{"Reduce", testReduce},
}
