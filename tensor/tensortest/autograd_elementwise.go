package tensortest

import (
	"fmt"
	"math"
	"slices"

	"github.com/ember-ml/ember/tensor"
)

// Tensor-level cases of the elementwise family: broadcasting binary
// operations, activations (also of transposed views), reductions over axes
// and shape operations, forward and backward. Every reference gradient is
// itself checked against central finite differences of the float64
// reference forward (fdChecked), so that a wrong hand-derived gradient
// cannot pass by agreeing with a wrong implementation.

// bstrides are the strides, into dense data of shape in, of in broadcast
// to out (zero on new and stretched axes).
func bstrides(in, out []int) []int {
	st := make([]int, len(out))
	ds := denseStrides(in)
	lead := len(out) - len(in)
	for k := range in {
		if in[k] != 1 {
			st[lead+k] = ds[k]
		}
	}
	return st
}

// refBinary is the reference of a broadcasting binary op with partial
// derivatives dfx, dfy.
func refBinary(xs, ys, out []int, f, dfx, dfy func(x, y float64) float64) func([][]float32, []int32, []float32) ([]float64, [][]float64) {
	return func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
		xo, yo := viewOffsets(out, bstrides(xs, out)), viewOffsets(out, bstrides(ys, out))
		res, gx, gy := make([]float64, len(xo)), zeros64(len(v[0])), zeros64(len(v[1]))
		for i := range xo {
			x, y := float64(v[0][xo[i]]), float64(v[1][yo[i]])
			res[i] = f(x, y)
			gx[xo[i]] += float64(g[i]) * dfx(x, y)
			gy[yo[i]] += float64(g[i]) * dfy(x, y)
		}
		return res, [][]float64{gx, gy}
	}
}

// binaryAG is a broadcasting binary case; kind "pos" feeds e^x as the
// first operand (the suite draws no positive inputs), with the chain rule
// in the reference.
func binaryAG(name string, xs, ys []int, kind string, fwd func(a, b *tensor.Tensor) *tensor.Tensor, f, dfx, dfy func(x, y float64) float64) agCase {
	out := mustBroadcast(xs, ys)
	if kind == "pos" {
		kind = "normal"
		f0, d0 := f, dfx
		f = func(x, y float64) float64 { return f0(math.Exp(x), y) }
		dfx = func(x, y float64) float64 { return d0(math.Exp(x), y) * math.Exp(x) }
		dfy0 := dfy
		dfy = func(x, y float64) float64 { return dfy0(math.Exp(x), y) }
		fw := fwd
		fwd = func(a, b *tensor.Tensor) *tensor.Tensor { return fw(tensor.Exp(a), b) }
	}
	return agCase{
		name: name, inputs: []agInput{inK(kind, xs...), inK(kind, ys...)}, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return fwd(t[0], t[1]) },
		ref: refBinary(xs, ys, out, f, dfx, dfy),
	}
}

func mustBroadcast(a, b []int) []int {
	s, err := tensor.BroadcastShape(a, b)
	if err != nil {
		panic(err)
	}
	return s
}

// unaryAG applies a unaryCase's op to the input, transposed first when
// transposed (a strided view reaches the op).
func unaryAG(c unaryCase, shape []int, transposed bool, fwd func(x *tensor.Tensor) *tensor.Tensor) agCase {
	kind := "normal"
	if c.dom == "away" {
		kind = "away"
	}
	f, df := c.f, c.df
	if c.dom == "pos" { // the op applied to e^x, as binaryAG's "pos"
		f = func(x, a, b float64) float64 { return c.f(math.Exp(x), a, b) }
		df = func(x, a, b float64) float64 { return c.df(math.Exp(x), a, b) * math.Exp(x) }
		fw := fwd
		fwd = func(x *tensor.Tensor) *tensor.Tensor { return fw(tensor.Exp(x)) }
	}
	if c.op == tensor.OpReLU || c.op == tensor.OpAbs || c.op == tensor.OpLeakyReLU {
		kind = "away" // no input at the kink, for the finite differences
	}
	name := c.name
	outShape, strides := shape, denseStrides(shape)
	if transposed {
		name += "/transposed"
		outShape = []int{shape[1], shape[0]}
		strides = []int{1, shape[1]}
	}
	tol := tolElem
	if c.trans || c.dom == "pos" {
		tol = tolTrans
	}
	return agCase{
		name: "Unary/" + name, inputs: []agInput{inK(kind, shape...)}, tol: tol,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			x := t[0]
			if transposed {
				x = x.Transpose(0, 1)
			}
			return fwd(x)
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			io := viewOffsets(outShape, strides)
			res, gx := make([]float64, len(io)), zeros64(len(v[0]))
			a, b := float64(c.a), float64(c.b)
			for i, o := range io {
				x := float64(v[0][o])
				res[i] = f(x, a, b)
				gx[o] += float64(g[i]) * df(x, a, b)
			}
			return res, [][]float64{gx}
		},
	}
}

// reduceGroups maps every element of shape to its output of a reduction
// over axes (row-major over the kept axes).
func reduceGroups(shape, axes []int) (group []int, outs int) {
	var kept []int
	for k := range shape {
		if !slices.Contains(axes, k) {
			kept = append(kept, k)
		}
	}
	outs = 1
	for _, k := range kept {
		outs *= shape[k]
	}
	n := prod(shape)
	group = make([]int, n)
	idx := make([]int, len(shape))
	for i := range group {
		o := 0
		for _, k := range kept {
			o = o*shape[k] + idx[k]
		}
		group[i] = o
		for k := len(shape) - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < shape[k] {
				break
			}
			idx[k] = 0
		}
	}
	return group, outs
}

// reduceAG checks a reduction over axes; red gives each output from its
// group's values and the derivative of that output by each value.
func reduceAG(name string, shape, axes []int, kind string, fwd func(x *tensor.Tensor) *tensor.Tensor,
	red func(vals []float64) (float64, []float64)) agCase {
	return agCase{
		name: "Reduce/" + name, inputs: []agInput{inK(kind, shape...)}, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return fwd(t[0]) },
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			group, outs := reduceGroups(shape, axes)
			members := make([][]int, outs)
			for i, o := range group {
				members[o] = append(members[o], i)
			}
			res, gx := make([]float64, outs), zeros64(len(v[0]))
			for o, m := range members {
				vals := make([]float64, len(m))
				for j, i := range m {
					vals[j] = float64(v[0][i])
				}
				r, d := red(vals)
				res[o] = r
				for j, i := range m {
					gx[i] += float64(g[o]) * d[j]
				}
			}
			return res, [][]float64{gx}
		},
	}
}

func sum64(v []float64) (float64, []float64) {
	s, d := 0.0, make([]float64, len(v))
	for i, x := range v {
		s += x
		d[i] = 1
	}
	return s, d
}

func max64(v []float64) (float64, []float64) {
	best, at := math.Inf(-1), 0
	for i, x := range v {
		if x > best {
			best, at = x, i
		}
	}
	d := make([]float64, len(v))
	d[at] = 1 // distinct inputs: one maximum
	return best, d
}

func negated(f func([]float64) (float64, []float64)) func([]float64) (float64, []float64) {
	return func(v []float64) (float64, []float64) {
		n := make([]float64, len(v))
		for i, x := range v {
			n[i] = -x
		}
		r, d := f(n)
		return -r, d
	}
}

func var64(correction int) func([]float64) (float64, []float64) {
	return func(v []float64) (float64, []float64) {
		n := float64(len(v))
		m := 0.0
		for _, x := range v {
			m += x
		}
		m /= n
		s, d := 0.0, make([]float64, len(v))
		for i, x := range v {
			s += (x - m) * (x - m)
			d[i] = 2 * (x - m) / (n - float64(correction))
		}
		return s / (n - float64(correction)), d
	}
}

// viewAG checks a pure data movement: out[i] = x[src[i]] (src -1: the
// constant pad), the gradient scattered back.
func viewAG(name string, shapes [][]int, fwd func(t []*tensor.Tensor) *tensor.Tensor, src func() (idx [][2]int, pad float64)) agCase {
	var ins []agInput
	for _, s := range shapes {
		ins = append(ins, inK("normal", s...))
	}
	return agCase{
		name: "Shape/" + name, inputs: ins, tol: 0,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return fwd(t) },
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			idx, pad := src()
			res := make([]float64, len(idx))
			grads := make([][]float64, len(v))
			for i := range v {
				grads[i] = zeros64(len(v[i]))
			}
			for i, p := range idx {
				if p[0] < 0 {
					res[i] = pad
					continue
				}
				res[i] = float64(v[p[0]][p[1]])
				grads[p[0]][p[1]] += float64(g[i])
			}
			return res, grads
		},
	}
}

// one is input 0 at the given offsets.
func one(offs []int) [][2]int {
	out := make([][2]int, len(offs))
	for i, o := range offs {
		out[i] = [2]int{0, o}
	}
	return out
}

// fdChecked wraps c.ref so that every call also checks the reference's
// gradients against central differences of its own forward in float64
// (steps of 1e-3, float32 inputs perturbed by exactly representable
// amounts; the O(h²) truncation and float32 input spacing stay below
// 1e-4 of the largest gradient for these smooth cases).
func fdChecked(c agCase) agCase {
	ref := c.ref
	c.ref = func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
		out, grads := ref(v, lab, g)
		loss := func() float64 {
			o, _ := ref(v, lab, g)
			s := 0.0
			for i := range o {
				s += o[i] * float64(g[i])
			}
			return s
		}
		gi := 0
		for k, in := range c.inputs {
			if !in.grad {
				continue
			}
			want := grads[gi]
			gi++
			scale := 0.0
			for _, w := range want {
				scale = math.Max(scale, math.Abs(w))
			}
			for j := range v[k] {
				x0 := v[k][j]
				h := float32(1e-3 * math.Max(1, math.Abs(float64(x0))))
				v[k][j] = x0 + h
				up, xu := loss(), float64(v[k][j])
				v[k][j] = x0 - h
				down, xd := loss(), float64(v[k][j])
				v[k][j] = x0
				fd := (up - down) / (xu - xd)
				if math.Abs(fd-want[j]) > 1e-3*math.Max(scale, 1e-3) {
					panic(fmt.Sprintf("reference gradient of input %d element %d is %.9g, finite difference %.9g", k, j, want[j], fd))
				}
			}
		}
		return out, grads
	}
	return c
}

// elementwiseAutogradCases are the RunAutograd cases of this family.
func elementwiseAutogradCases() []agCase {
	add := func(x, y float64) float64 { return x + y }
	one1 := func(x, y float64) float64 { return 1 }
	cases := []agCase{
		binaryAG("Add/broadcast [3,1,5]+[4,1]", []int{3, 1, 5}, []int{4, 1}, "normal", tensor.Add, add, one1, one1),
		binaryAG("Add/scalar", []int{7, 33}, []int{1}, "normal", tensor.Add, add, one1, one1),
		binaryAG("Sub/broadcast", []int{4, 1}, []int{3, 1, 5}, "normal", tensor.Sub,
			func(x, y float64) float64 { return x - y }, one1, func(x, y float64) float64 { return -1 }),
		binaryAG("Mul/broadcast", []int{3, 1, 5}, []int{4, 1}, "normal", tensor.Mul,
			func(x, y float64) float64 { return x * y }, func(x, y float64) float64 { return y }, func(x, y float64) float64 { return x }),
		binaryAG("Div/broadcast", []int{3, 4, 5}, []int{5}, "away", tensor.Div,
			func(x, y float64) float64 { return x / y }, func(x, y float64) float64 { return 1 / y }, func(x, y float64) float64 { return -x / (y * y) }),
		binaryAG("Pow/broadcast", []int{3, 4}, []int{4}, "pos", tensor.Pow, math.Pow,
			func(x, y float64) float64 { return y * math.Pow(x, y-1) }, func(x, y float64) float64 { return math.Pow(x, y) * math.Log(x) }),
		binaryAG("Maximum/broadcast", []int{3, 1, 5}, []int{4, 1}, "distinct", tensor.Maximum, math.Max,
			func(x, y float64) float64 { return b64(x > y) }, func(x, y float64) float64 { return b64(y > x) }),
		binaryAG("Minimum/broadcast", []int{3, 1, 5}, []int{4, 1}, "distinct", tensor.Minimum, math.Min,
			func(x, y float64) float64 { return b64(x < y) }, func(x, y float64) float64 { return b64(y < x) }),
		binaryAG("Where/x>y", []int{3, 1, 5}, []int{4, 1}, "distinct", func(a, b *tensor.Tensor) *tensor.Tensor {
			return tensor.Where(tensor.Gt(a, b), a, b)
		}, math.Max, func(x, y float64) float64 { return b64(x > y) }, func(x, y float64) float64 { return b64(y >= x) }),
		binaryAG("Mul/transposed operand", []int{5, 7}, []int{5, 7}, "normal", func(a, b *tensor.Tensor) *tensor.Tensor {
			return tensor.Mul(a.Transpose(0, 1), b.Transpose(0, 1)).Transpose(0, 1)
		}, func(x, y float64) float64 { return x * y }, func(x, y float64) float64 { return y }, func(x, y float64) float64 { return x }),
	}
	byOp := map[tensor.UnaryOp]func(x *tensor.Tensor) *tensor.Tensor{
		tensor.OpNeg: tensor.Neg, tensor.OpAbs: tensor.Abs, tensor.OpExp: tensor.Exp, tensor.OpLog: tensor.Log,
		tensor.OpSqrt: tensor.Sqrt, tensor.OpRsqrt: tensor.Rsqrt, tensor.OpRecip: tensor.Reciprocal, tensor.OpSquare: tensor.Square,
		tensor.OpTanh: tensor.Tanh, tensor.OpSigmoid: tensor.Sigmoid, tensor.OpReLU: tensor.ReLU,
		tensor.OpLeakyReLU: func(x *tensor.Tensor) *tensor.Tensor { return tensor.LeakyReLU(x, 0.01) },
		tensor.OpGELU:      func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, false) },
		tensor.OpGELUTanh:  func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, true) },
		tensor.OpSiLU:      tensor.SiLU,
		tensor.OpPowScalar: func(x *tensor.Tensor) *tensor.Tensor { return tensor.PowScalar(x, 2.5) },
		tensor.OpAddScalar: func(x *tensor.Tensor) *tensor.Tensor { return tensor.AddScalar(x, 1.25) },
		tensor.OpMulScalar: func(x *tensor.Tensor) *tensor.Tensor { return tensor.Scale(x, -3) },
		tensor.OpAffine:    func(x *tensor.Tensor) *tensor.Tensor { return tensor.Affine(x, 0.5, -2) },
		tensor.OpSin:       tensor.Sin, tensor.OpCos: tensor.Cos,
	}
	for _, c := range unaryCases {
		if f := byOp[c.op]; f != nil {
			cases = append(cases, unaryAG(c, []int{3, 5, 7}, false, f), unaryAG(c, []int{5, 7}, true, f))
		}
	}
	// Clamp has kinks inside the input range: no finite differences.
	ci := slices.IndexFunc(unaryCases, func(c unaryCase) bool { return c.op == tensor.OpClamp })
	clamp := unaryAG(unaryCases[ci], []int{33}, false, func(x *tensor.Tensor) *tensor.Tensor { return tensor.Clamp(x, -0.5, 0.75) })

	s := []int{3, 4, 5}
	cases = append(cases,
		reduceAG("SumAxes 0,2", s, []int{0, 2}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.SumAxes(x, []int{0, 2}, false) }, sum64),
		reduceAG("SumAxes 1 keepdim", s, []int{1}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.SumAxes(x, []int{-2}, true) }, sum64),
		reduceAG("SumAxes all", s, []int{0, 1, 2}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.SumAxes(x, nil, false) }, sum64),
		reduceAG("SumAxes of a transpose", []int{5, 4}, []int{0}, "normal", func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.SumAxes(x.Transpose(0, 1), []int{1}, false)
		}, sum64),
		// Runs of adjacent axes are reduced one after another: two runs, and
		// a strided view whose reduced axes are apart.
		reduceAG("SumAxes 0,1,3", []int{2, 3, 4, 5}, []int{0, 1, 3}, "normal", func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.SumAxes(x, []int{0, 1, 3}, false)
		}, sum64),
		reduceAG("SumAxes 0,2 of a permutation", []int{5, 3, 4}, []int{0, 1}, "normal", func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.SumAxes(x.Permute(1, 2, 0), []int{0, 2}, true)
		}, sum64),
		reduceAG("MinAxes 0,1,3", []int{2, 3, 4, 5}, []int{0, 1, 3}, "distinct", func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.MinAxes(x, []int{0, 1, 3}, false)
		}, negated(max64)),
		reduceAG("MeanAxes 2", s, []int{2}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.MeanAxes(x, []int{2}, false) },
			func(v []float64) (float64, []float64) {
				r, d := sum64(v)
				for i := range d {
					d[i] /= float64(len(v))
				}
				return r / float64(len(v)), d
			}),
		// NCHW over 0, 2, 3 (one per-channel pass), rows of 9: no multiple of 4.
		reduceAG("MeanAxes 0,2,3", []int{3, 5, 3, 3}, []int{0, 2, 3}, "normal", func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.MeanAxes(x, []int{0, 2, 3}, false)
		}, func(v []float64) (float64, []float64) {
			r, d := sum64(v)
			for i := range d {
				d[i] /= float64(len(v))
			}
			return r / float64(len(v)), d
		}),
		reduceAG("MaxAxes 1", s, []int{1}, "distinct", func(x *tensor.Tensor) *tensor.Tensor { return tensor.MaxAxes(x, []int{1}, false) }, max64),
		reduceAG("MaxAxes 0,2 keepdim", s, []int{0, 2}, "distinct", func(x *tensor.Tensor) *tensor.Tensor { return tensor.MaxAxes(x, []int{0, 2}, true) }, max64),
		reduceAG("MinAxes 2", s, []int{2}, "distinct", func(x *tensor.Tensor) *tensor.Tensor { return tensor.MinAxes(x, []int{2}, false) }, negated(max64)),
		reduceAG("VarAxes 2", s, []int{2}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.VarAxes(x, []int{2}, 1, false) }, var64(1)),
		reduceAG("VarAxes 0,1 correction 0", s, []int{0, 1}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.VarAxes(x, []int{0, 1}, 0, true) }, var64(0)),
		reduceAG("StdAxes 1", s, []int{1}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.StdAxes(x, []int{1}, 1, false) },
			func(v []float64) (float64, []float64) {
				r, d := var64(1)(v)
				sd := math.Sqrt(r)
				for i := range d {
					d[i] /= 2 * sd
				}
				return sd, d
			}),
		reduceAG("LogSumExp 1", s, []int{1}, "normal", func(x *tensor.Tensor) *tensor.Tensor { return tensor.LogSumExp(x, []int{1}, false) },
			func(v []float64) (float64, []float64) {
				m := math.Inf(-1)
				for _, x := range v {
					m = math.Max(m, x)
				}
				s := 0.0
				for _, x := range v {
					s += math.Exp(x - m)
				}
				d := make([]float64, len(v))
				for i, x := range v {
					d[i] = math.Exp(x-m) / s
				}
				return m + math.Log(s), d
			}),
	)
	cases = append(cases, shapeAutogradCases()...)
	for i := range cases {
		cases[i] = fdChecked(cases[i])
	}
	return append(cases, clamp)
}

func shapeAutogradCases() []agCase {
	perm := func(shape, p []int) []int {
		ds := denseStrides(shape)
		ps, pt := make([]int, len(p)), make([]int, len(p))
		for i, k := range p {
			ps[i], pt[i] = shape[k], ds[k]
		}
		return viewOffsets(ps, pt)
	}
	return []agCase{
		viewAG("Permute 2,0,1", [][]int{{2, 3, 4}}, func(t []*tensor.Tensor) *tensor.Tensor { return t[0].Permute(2, 0, 1) },
			func() ([][2]int, float64) { return one(perm([]int{2, 3, 4}, []int{2, 0, 1})), 0 }),
		viewAG("Slice axis 1 [1:7:2]", [][]int{{3, 8}}, func(t []*tensor.Tensor) *tensor.Tensor { return t[0].Slice(1, 1, 7, 2) },
			func() ([][2]int, float64) {
				offs := viewOffsets([]int{3, 3}, []int{8, 2})
				for i := range offs {
					offs[i]++
				}
				return one(offs), 0
			}),
		viewAG("Narrow of a slice", [][]int{{6, 5}}, func(t []*tensor.Tensor) *tensor.Tensor { return t[0].Narrow(0, 2, 3).Narrow(1, 1, 2) },
			func() ([][2]int, float64) {
				offs := viewOffsets([]int{3, 2}, []int{5, 1})
				for i := range offs {
					offs[i] += 2*5 + 1
				}
				return one(offs), 0
			}),
		withTol(tolAG, viewAG("Expand [3,1] to [2,3,4]", [][]int{{3, 1}}, func(t []*tensor.Tensor) *tensor.Tensor { return t[0].Expand(2, 3, 4) },
			func() ([][2]int, float64) { return one(viewOffsets([]int{2, 3, 4}, []int{0, 1, 0})), 0 })), // its gradient is a sum of 8
		viewAG("Concat axis 1", [][]int{{2, 3}, {2, 5}}, func(t []*tensor.Tensor) *tensor.Tensor { return tensor.Concat(1, t[0], t[1]) },
			func() ([][2]int, float64) {
				var idx [][2]int
				for r := range 2 {
					for c := range 8 {
						if c < 3 {
							idx = append(idx, [2]int{0, r*3 + c})
						} else {
							idx = append(idx, [2]int{1, r*5 + c - 3})
						}
					}
				}
				return idx, 0
			}),
		viewAG("Stack axis 1", [][]int{{2, 3}, {2, 3}}, func(t []*tensor.Tensor) *tensor.Tensor { return tensor.Stack(1, t[0], t[1]) },
			func() ([][2]int, float64) {
				var idx [][2]int
				for r := range 2 {
					for k := range 2 {
						for c := range 3 {
							idx = append(idx, [2]int{k, r*3 + c})
						}
					}
				}
				return idx, 0
			}),
		viewAG("Split then Concat reversed", [][]int{{7, 2}}, func(t []*tensor.Tensor) *tensor.Tensor {
			p := t[0].Split(0, 3, 4)
			return tensor.Concat(0, p[1], p[0])
		}, func() ([][2]int, float64) {
			var offs []int
			for r := range 7 {
				src := (r + 3) % 7
				offs = append(offs, src*2, src*2+1)
			}
			return one(offs), 0
		}),
		viewAG("Chunk", [][]int{{2, 7}}, func(t []*tensor.Tensor) *tensor.Tensor { return t[0].Chunk(3, 1)[2] },
			func() ([][2]int, float64) { return one([]int{6, 13}), 0 }),
		viewAG("Pad last (1,2) first (0,1)", [][]int{{2, 3}}, func(t []*tensor.Tensor) *tensor.Tensor { return tensor.Pad(t[0], []int{1, 2, 0, 1}, 0.5) },
			func() ([][2]int, float64) {
				var idx [][2]int
				for r := range 3 {
					for c := range 6 {
						if r < 2 && c >= 1 && c < 4 {
							idx = append(idx, [2]int{0, r*3 + c - 1})
						} else {
							idx = append(idx, [2]int{-1, 0})
						}
					}
				}
				return idx, 0.5
			}),
		viewAG("Unsqueeze, Squeeze, FlattenRange", [][]int{{2, 3, 4}}, func(t []*tensor.Tensor) *tensor.Tensor {
			return t[0].Unsqueeze(1).Squeeze(1).FlattenRange(0, 1).Unsqueeze(-1)
		}, func() ([][2]int, float64) { return one(viewOffsets([]int{24}, []int{1})), 0 }),
		viewAG("Reshape of a transpose", [][]int{{3, 4}}, func(t []*tensor.Tensor) *tensor.Tensor { return t[0].Transpose(0, 1).Reshape(2, 6) },
			func() ([][2]int, float64) { return one(viewOffsets([]int{4, 3}, []int{1, 4})), 0 }),
	}
}

func withTol(tol float64, c agCase) agCase {
	c.tol = tol
	return c
}
