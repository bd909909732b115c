package tensortest

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Tolerances of RunAutograd, relative to the largest magnitude of the
// expected tensor (a normwise test: the elementwise bounds were checked by
// RunBackend, this checks that the tensor layer calls the right operations
// with the right arguments). Against the float64 references: tolElem for
// elementwise operations, tolAG for accumulating ones (sums of up to a few
// hundred terms, whose error relative to the largest output stays well
// below it). Another backend is compared with the CPU, both of whose
// results carry such errors: twice the tolerance.
const tolAG = 2e-5

// tolWide is the tolerance of the MLP-width composites (reluXentCase,
// reluChainCase at 1024 hidden units): their input gradients are float32
// sums of a thousand terms of mixed sign, whose rounding a normwise bound
// overstates less than it understates (2e-4 of 3.4 seen on the CPU). What
// those cases check, a ReLU's mask applied once and where it belongs, moves
// the elements it gets wrong by their whole value.
const tolWide = 5e-4

// agInput describes one input of an autograd case.
type agInput struct {
	shape []int
	kind  string // "normal" (default), "distinct" (no ties), "away" (|x| >= 0.05), "grid" (multiples of 1/4 in [-2, 2])
	grad  bool
}

// agCase is a tensor-level computation with its float64 reference.
type agCase struct {
	name   string
	inputs []agInput
	labels [2]int // [n, classes] of int32 labels, zero for none
	direct bool   // Backward on the scalar output itself (seed 1), else on Σ out·W
	// gridW draws W from multiples of 1/4 too: with grid inputs every
	// gradient is then exact, for cases whose gradients are single long sums
	// (a normwise bound is the sum itself, which cancellation can make far
	// smaller than its terms).
	gridW bool
	tol   float64
	// bound, when not nil, gives for every element of the output and of
	// each gradient the magnitude that its rounding error is a multiple of
	// (an elementwise test within tol of it), where cancellation can make
	// a normwise bound, the largest result, far smaller than the terms the
	// error comes from. gout is the output's gradient, as ref's.
	bound func(in [][]float32, gout []float32) (out []float64, grads [][]float64)
	// skip, when not nil, says why backend b cannot run the case (an
	// optional interface it lacks), or "" when it can.
	skip func(b tensor.Backend) string
	fwd  func(in []*tensor.Tensor, labels *tensor.Tensor) *tensor.Tensor
	// ref returns the output and the gradient of every input that has
	// grad, given the gradient gout of the output.
	ref func(in [][]float32, labels []int32, gout []float32) (out []float64, grads [][]float64)
}

// RunAutograd checks each tensor-level operation, forward and backward, on
// b: against the float64 references when b is the CPU backend, else against
// the same computation on tensor.CPU. The loss whose gradient is taken is
// Σ out·W for a random W (so that every output element gets its own
// gradient), or the output itself for the cases marked direct.
func RunAutograd(t *testing.T, b tensor.Backend) {
	seed := baseSeed(t)
	t.Logf("tensortest: autograd on %s, seed %d (rerun with %s=%d)", b.Name(), seed, seedEnv, seed)
	t.Run("Autograd", func(t *testing.T) {
		for _, c := range autogradCases() {
			subtest(t, b, seed, c.name, func(e *env) { runAutogradCase(e, c) })
		}
	})
}

func runAutogradCase(e *env, c agCase) {
	if c.skip != nil {
		if why := c.skip(e.b); why != "" {
			e.t.Skip(why)
		}
	}
	var shapes []string
	for _, in := range c.inputs {
		shapes = append(shapes, fmt.Sprint(in.shape))
	}
	e.ctx = "inputs " + strings.Join(shapes, " ")
	ins := make([][]float32, len(c.inputs))
	for i, in := range c.inputs {
		n := 1
		for _, d := range in.shape {
			n *= d
		}
		switch in.kind {
		case "distinct":
			ins[i] = e.distinct(n)
		case "grid":
			ins[i] = e.grid(n)
		case "away":
			ins[i] = e.normal(n, 1)
			for j, v := range ins[i] {
				if math.Abs(float64(v)) < 0.05 {
					ins[i][j] = float32(math.Copysign(0.05, float64(v))) + v
				}
			}
		default:
			ins[i] = e.normal(n, 1)
		}
	}
	var lab []int32
	if c.labels[0] > 0 {
		lab = e.labels(c.labels[0], c.labels[1])
	}
	out, shape, grads, w := evalAutograd(e.b, c, ins, lab, func(n int) []float32 {
		if c.gridW {
			return e.grid(n)
		}
		return e.normal(n, 1)
	})
	tol := c.tol
	var wantOut []float64
	var wantGrads [][]float64
	if hostReference(e.b) {
		gout := w
		if c.direct {
			gout = []float32{1}
		}
		wantOut, wantGrads = c.ref(ins, lab, gout)
	} else {
		tol *= 2
		o, _, g, _ := evalAutograd(tensor.CPU, c, ins, lab, func(int) []float32 { return w })
		wantOut = f64(o)
		for _, gi := range g {
			wantGrads = append(wantGrads, f64(gi))
		}
	}
	outBound := normBound(wantOut)
	gradBound := func(i int) []float64 { return normBound(wantGrads[i]) }
	if c.bound != nil {
		gout := w
		if c.direct {
			gout = []float32{1}
		}
		var gb [][]float64
		outBound, gb = c.bound(ins, gout)
		gradBound = func(i int) []float64 { return gb[i] }
	}
	e.near("forward", shape, out, wantOut, outBound, tol)
	gi := 0
	for i, in := range c.inputs {
		if !in.grad {
			continue
		}
		if grads[gi] == nil {
			e.fail("input %d has no gradient after Backward", i)
		} else {
			e.near(fmt.Sprintf("gradient of input %d", i), in.shape, grads[gi], wantGrads[gi], gradBound(gi), tol)
		}
		gi++
	}
}

// normBound is max|want| for every element: a normwise test.
func normBound(want []float64) []float64 {
	m := 0.0
	for _, v := range want {
		m = math.Max(m, math.Abs(v))
	}
	if m == 0 {
		m = 1e-30
	}
	b := make([]float64, len(want))
	for i := range b {
		b[i] = m
	}
	return b
}

// evalAutograd runs case c on backend be: forward, backward, and reads the
// output and the gradients of the inputs that require them. makeW gives the
// weights W of the loss Σ out·W for an output of n elements.
func evalAutograd(be tensor.Backend, c agCase, ins [][]float32, lab []int32, makeW func(n int) []float32) (out []float32, shape []int, grads [][]float32, w []float32) {
	s := tensor.NewScope()
	defer s.Release()
	ts := make([]*tensor.Tensor, len(ins))
	for i, in := range c.inputs {
		ts[i] = tensor.FromFloat32(be, s, ins[i], in.shape...)
		if in.grad {
			ts[i].SetRequiresGrad(true)
		}
	}
	var lt *tensor.Tensor
	if lab != nil {
		lt = tensor.FromInt32(be, s, lab, len(lab))
	}
	o := c.fwd(ts, lt)
	out, shape = o.Float32s(), o.Shape()
	if c.direct {
		o.Backward()
	} else {
		w = makeW(len(out))
		tensor.Sum(tensor.Mul(o, tensor.FromFloat32(be, s, w, shape...))).Backward()
	}
	for i, in := range c.inputs {
		if !in.grad {
			continue
		}
		g := ts[i].Grad()
		if g == nil {
			grads = append(grads, nil)
			continue
		}
		grads = append(grads, g.Float32s())
		g.Release()
	}
	return out, shape, grads, w
}

// ---------------------------------------------------------------------------
// Cases.

func in(grad bool, shape ...int) agInput    { return agInput{shape: shape, grad: grad} }
func inK(kind string, shape ...int) agInput { return agInput{shape: shape, kind: kind, grad: true} }
func zeros64(n int) []float64               { return make([]float64, n) }

func scaled(s []float64, k float64) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = k * v
	}
	return out
}

// mm64 is a float64 matmul c = op(a)·op(b), c m×n, with refMatMul's layout.
func mm64(a, b []float64, m, n, k int, ta, tb bool) []float64 {
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				av := a[i*k+p]
				if ta {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tb {
					bv = b[j*k+p]
				}
				s += av * bv
			}
			c[i*n+j] = s
		}
	}
	return c
}

// linear64 is x·wᵀ + b for x [n,in], w [out,in].
func linear64(x, w, b []float64, n, inF, outF int) []float64 {
	y := mm64(x, w, n, outF, inF, false, true)
	if b != nil {
		for i := 0; i < n; i++ {
			for j := 0; j < outF; j++ {
				y[i*outF+j] += b[j]
			}
		}
	}
	return y
}

// linearGrads64 is the gradient of linear64: dx = g·w, dw = gᵀ·x, db = Σ g.
func linearGrads64(g, x, w []float64, n, inF, outF int) (dx, dw, db []float64) {
	dx = mm64(g, w, n, inF, outF, false, false)
	dw = mm64(g, x, outF, inF, n, true, false)
	db = make([]float64, outF)
	for i := 0; i < n; i++ {
		for j := 0; j < outF; j++ {
			db[j] += g[i*outF+j]
		}
	}
	return dx, dw, db
}

// swapAxes returns x (of shape) with axes i and j exchanged, densely.
func swapAxes(x []float64, shape []int, i, j int) []float64 {
	outShape := append([]int(nil), shape...)
	outShape[i], outShape[j] = outShape[j], outShape[i]
	strides := make([]int, len(shape))
	s := 1
	for k := len(shape) - 1; k >= 0; k-- {
		strides[k] = s
		s *= shape[k]
	}
	strides[i], strides[j] = strides[j], strides[i]
	out := make([]float64, len(x))
	idx := make([]int, len(shape))
	for o := range out {
		off := 0
		for k := range idx {
			off += idx[k] * strides[k]
		}
		out[o] = x[off]
		for k := len(idx) - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < outShape[k] {
				break
			}
			idx[k] = 0
		}
	}
	return out
}

func convCase(name string, x, w []int, bias bool, stride, pad int) agCase {
	ins := []agInput{in(true, x...), in(true, w...)}
	if bias {
		ins = append(ins, in(true, w[0]))
	}
	g := tensor.ConvGeom{N: x[0], C: x[1], H: x[2], W: x[3], K: w[0], R: w[2], S: w[3], StrideH: stride, StrideW: stride, PadH: pad, PadW: pad}
	return agCase{
		name: name, inputs: ins, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			var b *tensor.Tensor
			if bias {
				b = t[2]
			}
			return tensor.Conv2d(t[0], t[1], b, stride, pad)
		},
		ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
			var b []float32
			if bias {
				b = v[2]
			}
			y, _ := refConv(v[0], v[1], b, g)
			r := refConvBackward(gout, v[0], v[1], g)
			grads := [][]float64{r.dx, r.dw}
			if bias {
				grads = append(grads, r.db)
			}
			return y, grads
		},
	}
}

// convPoolCase is Conv2dReLUMaxPool. Its inputs are multiples of 1/4 in
// [-2, 2], so that every convolution output is exact in float32 whatever the
// order of its sums: backends that compute the convolution differently still
// agree on the maximum of each window and on which outputs are positive, so
// the gradients take the same routes. dx says whether x takes a gradient
// (backends may have a faster path without one).
func convPoolCase(name string, x, w []int, bias bool, stride, pad, k int, dx bool) agCase {
	ins := []agInput{{shape: x, kind: "grid", grad: dx}, inK("grid", w...)}
	if bias {
		ins = append(ins, inK("grid", w[0]))
	}
	g := tensor.ConvGeom{N: x[0], C: x[1], H: x[2], W: x[3], K: w[0], R: w[2], S: w[3], StrideH: stride, StrideW: stride, PadH: pad, PadW: pad}
	p := tensor.PoolGeom{N: g.N, C: g.K, H: g.OutH(), W: g.OutW(), KH: k, KW: k, StrideH: k, StrideW: k}
	return agCase{
		name: name, inputs: ins, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			var b *tensor.Tensor
			if bias {
				b = t[2]
			}
			return tensor.Conv2dReLUMaxPool(t[0], t[1], b, stride, pad, k)
		},
		ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
			var b []float32
			if bias {
				b = v[2]
			}
			yc, _ := refConv(v[0], v[1], b, g)
			yr := make([]float32, len(yc))
			for i, y := range yc {
				yr[i] = float32(max(y, 0))
			}
			yp, idx := refPool(yr, p)
			dyr, _ := refPoolBackward(gout, idx, nil, p)
			dyc := make([]float32, len(dyr))
			for i, d := range dyr {
				if yr[i] > 0 {
					dyc[i] = float32(d)
				}
			}
			r := refConvBackward(dyc, v[0], v[1], g)
			var grads [][]float64
			if dx {
				grads = append(grads, r.dx)
			}
			grads = append(grads, r.dw)
			if bias {
				grads = append(grads, r.db)
			}
			return f64(yp), grads
		},
	}
}

func poolCase(name string, x []int, k, stride int) agCase {
	g := tensor.PoolGeom{N: x[0], C: x[1], H: x[2], W: x[3], KH: k, KW: k, StrideH: stride, StrideW: stride}
	return agCase{
		name: name, inputs: []agInput{inK("distinct", x...)}, tol: tolElem,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.MaxPool2d(t[0], k, stride) },
		ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
			y, idx := refPool(v[0], g)
			dx, _ := refPoolBackward(gout, idx, nil, g)
			return f64(y), [][]float64{dx}
		},
	}
}

func transposeCase(name string, shape []int, i, j int) agCase {
	outShape := append([]int(nil), shape...)
	outShape[i], outShape[j] = outShape[j], outShape[i]
	return agCase{
		name: name, inputs: []agInput{in(true, shape...)}, tol: 0,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return t[0].Transpose(i, j).Contiguous() },
		ref: func(v [][]float32, _ []int32, gout []float32) ([]float64, [][]float64) {
			return swapAxes(f64(v[0]), shape, i, j), [][]float64{swapAxes(f64(gout), outShape, i, j)}
		},
	}
}

func ceCase(name string, n, classes int, direct bool, scale float32) agCase {
	return agCase{
		name: name, inputs: []agInput{in(true, n, classes)}, labels: [2]int{n, classes}, direct: direct, tol: tolAG,
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			z := t[0]
			if scale != 1 {
				z = tensor.Mul(z, tensor.Full(z.Backend(), z.Scope(), scale, z.Shape()...))
			}
			return tensor.CrossEntropy(z, lab)
		},
		ref: func(v [][]float32, lab []int32, gout []float32) ([]float64, [][]float64) {
			z := v[0]
			if scale != 1 {
				z = make([]float32, len(v[0]))
				for i, x := range v[0] {
					z[i] = x * scale
				}
			}
			loss, _, dz, _ := refCE(z, lab, n, classes)
			return []float64{loss}, [][]float64{scaled(dz, float64(gout[0])*float64(scale))}
		},
	}
}

// lceCase is LinearCrossEntropy on x [n, inF] (an intermediate, 2·x0, when
// mid), w [cls, inF] and a bias when bias; x takes a gradient when gradX.
// Backward runs on the loss itself when direct, else on loss·W (a gradient
// other than 1).
func lceCase(name string, n, inF, cls int, bias, gradX, mid, direct bool) agCase {
	ins := []agInput{in(gradX, n, inF), in(true, cls, inF)}
	if bias {
		ins = append(ins, in(true, cls))
	}
	return agCase{
		name: name, inputs: ins, labels: [2]int{n, cls}, direct: direct, tol: tolAG,
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			x := t[0]
			if mid {
				x = tensor.Add(x, x)
			}
			var b *tensor.Tensor
			if bias {
				b = t[2]
			}
			return tensor.LinearCrossEntropy(x, t[1], b, lab)
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			x, w := f64(v[0]), f64(v[1])
			if mid {
				x = scaled(x, 2)
			}
			var b []float64
			if bias {
				b = f64(v[2])
			}
			z := linear64(x, w, b, n, inF, cls)
			z32 := make([]float32, len(z))
			for i, a := range z {
				z32[i] = float32(a)
			}
			loss, _, dz, _ := refCE(z32, lab, n, cls)
			dx, dw, db := linearGrads64(scaled(dz, float64(g[0])), x, w, n, inF, cls)
			var grads [][]float64
			if gradX {
				if mid {
					dx = scaled(dx, 2)
				}
				grads = append(grads, dx)
			}
			grads = append(grads, dw)
			if bias {
				grads = append(grads, db)
			}
			return []float64{loss}, grads
		},
	}
}

func autogradCases() []agCase {
	cases := []agCase{
		{
			name: "Add", inputs: []agInput{in(true, 7, 33), in(true, 7, 33)}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Add(t[0], t[1]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				out := make([]float64, len(v[0]))
				for i := range out {
					out[i] = float64(v[0][i]) + float64(v[1][i])
				}
				return out, [][]float64{f64(g), f64(g)}
			},
		},
		{
			name: "Add/one input without grad", inputs: []agInput{in(false, 257), in(true, 257)}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Add(t[0], t[1]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				out := make([]float64, len(v[0]))
				for i := range out {
					out[i] = float64(v[0][i]) + float64(v[1][i])
				}
				return out, [][]float64{f64(g)}
			},
		},
		{
			name: "Mul", inputs: []agInput{in(true, 1000), in(true, 1000)}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Mul(t[0], t[1]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				n := len(v[0])
				out, ga, gb := zeros64(n), zeros64(n), zeros64(n)
				for i := range out {
					a, b, gg := float64(v[0][i]), float64(v[1][i]), float64(g[i])
					out[i], ga[i], gb[i] = a*b, gg*b, gg*a
				}
				return out, [][]float64{ga, gb}
			},
		},
		{
			name: "Mul/fan-out x*x", inputs: []agInput{in(true, 3, 11)}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Mul(t[0], t[0]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				n := len(v[0])
				out, gx := zeros64(n), zeros64(n)
				for i := range out {
					x := float64(v[0][i])
					out[i], gx[i] = x*x, 2*x*float64(g[i])
				}
				return out, [][]float64{gx}
			},
		},
		{
			name: "Sum", inputs: []agInput{in(true, 33, 7)}, tol: tolAG,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Sum(t[0]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				var s float64
				gx := zeros64(len(v[0]))
				for i, x := range v[0] {
					s += float64(x)
					gx[i] = float64(g[0])
				}
				return []float64{s}, [][]float64{gx}
			},
		},
		{
			name: "Sum/direct", inputs: []agInput{in(true, 4099)}, direct: true, tol: tolAG,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Sum(t[0]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				var s float64
				gx := zeros64(len(v[0]))
				for i, x := range v[0] {
					s += float64(x)
					gx[i] = float64(g[0])
				}
				return []float64{s}, [][]float64{gx}
			},
		},
	}
	for _, mm := range [][3]int{{7, 33, 5}, {1, 1, 257}, {33, 64, 10}} {
		m, k, n := mm[0], mm[1], mm[2]
		// 1x1·1x257: the gradient of the 1x1 input is one sum of 257 terms;
		// on multiples of 1/4 it is exact (backends sum in different orders).
		long := m*k == 1
		ins := []agInput{in(true, m, k), in(true, k, n)}
		if long {
			ins = []agInput{{shape: []int{m, k}, kind: "grid", grad: true}, {shape: []int{k, n}, kind: "grid", grad: true}}
		}
		cases = append(cases, agCase{
			name: "MatMul/" + shapeName(m, k, n), inputs: ins, gridW: long, tol: tolAG,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.MatMul(t[0], t[1]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				a, b, gg := f64(v[0]), f64(v[1]), f64(g)
				return mm64(a, b, m, n, k, false, false),
					[][]float64{mm64(gg, b, m, k, n, false, true), mm64(a, gg, k, n, m, true, false)}
			},
		})
	}
	// Linear: a small layer (one launch each way on a GPU backend), one with
	// more rows than those launches take, and two for tiled kernels (tiles
	// cut by the edges, sums split over blocks) or a BLAS.
	for i, d := range [][3]int{{7, 33, 10}, {7, 33, 10}, {130, 40, 12}, {64, 800, 500}, {100, 300, 70}} {
		bias := i != 1
		n, inF, outF := d[0], d[1], d[2]
		name := fmt.Sprintf("Linear/%dx%d·%dx%d", n, inF, inF, outF)
		ins := []agInput{in(true, n, inF), in(true, outF, inF)}
		if bias {
			ins = append(ins, in(true, outF))
		} else {
			name += " no bias"
		}
		cases = append(cases, agCase{
			name: name, inputs: ins, tol: tolAG,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				var b *tensor.Tensor
				if bias {
					b = t[2]
				}
				return tensor.Linear(t[0], t[1], b)
			},
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				var b []float64
				if bias {
					b = f64(v[2])
				}
				x, w := f64(v[0]), f64(v[1])
				dx, dw, db := linearGrads64(f64(g), x, w, n, inF, outF)
				grads := [][]float64{dx, dw}
				if bias {
					grads = append(grads, db)
				}
				return linear64(x, w, b, n, inF, outF), grads
			},
		})
	}
	// Linear whose input takes no gradient, whose input is an intermediate
	// (its gradient is written, not added), and whose input is its weight
	// (both gradients reach one tensor: a backend that computes them at once
	// must not race).
	{
		n, inF, outF := 7, 33, 10
		cases = append(cases,
			agCase{
				name: "Linear/input without gradient", inputs: []agInput{in(false, n, inF), in(true, outF, inF), in(true, outF)}, tol: tolAG,
				fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Linear(t[0], t[1], t[2]) },
				ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
					x, w := f64(v[0]), f64(v[1])
					_, dw, db := linearGrads64(f64(g), x, w, n, inF, outF)
					return linear64(x, w, f64(v[2]), n, inF, outF), [][]float64{dw, db}
				},
			},
			agCase{
				name: "Linear/intermediate input", inputs: []agInput{in(true, n, inF), in(true, outF, inF), in(true, outF)}, tol: tolAG,
				fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
					return tensor.Linear(tensor.Add(t[0], t[0]), t[1], t[2])
				},
				ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
					x2 := f64(v[0])
					for i := range x2 {
						x2[i] *= 2
					}
					w := f64(v[1])
					dx, dw, db := linearGrads64(f64(g), x2, w, n, inF, outF)
					for i := range dx {
						dx[i] *= 2
					}
					return linear64(x2, w, f64(v[2]), n, inF, outF), [][]float64{dx, dw, db}
				},
			},
			agCase{
				name: "Linear/input is the weight", inputs: []agInput{in(true, n, inF)}, tol: tolAG,
				fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Linear(t[0], t[0], nil) },
				ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
					x := f64(v[0])
					dx, dw, _ := linearGrads64(f64(g), x, x, n, inF, n)
					for i := range dx {
						dx[i] += dw[i]
					}
					return linear64(x, x, nil, n, inF, n), [][]float64{dx}
				},
			})
	}
	// LinearReLU on multiples of 1/4 (exact sums, so that every backend
	// agrees on the ReLU's mask): the small product, LeNet's fc1, one whose
	// gradients' sums a GPU backend splits over blocks (with and without a
	// bias), and one whose input takes no gradient.
	for _, d := range []struct {
		n, in, out  int
		bias, gradX bool
	}{{7, 33, 10, true, true}, {64, 800, 500, true, true}, {200, 96, 300, true, true}, {200, 96, 300, false, true}, {70, 130, 90, true, false}, {300, 40, 20, false, true}} {
		n, inF, outF := d.n, d.in, d.out
		name := fmt.Sprintf("LinearReLU/%dx%d·%dx%d", n, inF, inF, outF)
		ins := []agInput{inK("grid", n, inF), inK("grid", outF, inF)}
		ins[0].grad = d.gradX
		if !d.gradX {
			name += " input without gradient"
		}
		if d.bias {
			ins = append(ins, inK("grid", outF))
		} else {
			name += " no bias"
		}
		cases = append(cases, agCase{
			name: name, inputs: ins, tol: tolAG,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				var b *tensor.Tensor
				if d.bias {
					b = t[2]
				}
				return tensor.LinearReLU(t[0], t[1], b)
			},
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				x, w := f64(v[0]), f64(v[1])
				var b []float64
				if d.bias {
					b = f64(v[2])
				}
				out := linear64(x, w, b, n, inF, outF)
				gm := f64(g)
				for i, o := range out {
					if o <= 0 {
						out[i], gm[i] = 0, 0
					}
				}
				dx, dw, db := linearGrads64(gm, x, w, n, inF, outF)
				var grads [][]float64
				if d.gradX {
					grads = append(grads, dx)
				}
				grads = append(grads, dw)
				if d.bias {
					grads = append(grads, db)
				}
				return out, grads
			},
		})
	}
	cases = append(cases,
		convCase("Conv2d/stride 2 pad 1", []int{2, 3, 9, 7}, []int{4, 3, 3, 3}, true, 2, 1),
		convCase("Conv2d/stride 1 pad 0 no bias", []int{2, 2, 8, 6}, []int{3, 2, 3, 3}, false, 1, 0),
		convCase("Conv2d/stride 1 pad 2", []int{1, 1, 7, 10}, []int{2, 1, 5, 5}, true, 1, 2),
		convCase("Conv2d/LeNet conv2", []int{2, 20, 12, 12}, []int{50, 20, 5, 5}, true, 1, 0),
		convPoolCase("Conv2dReLUMaxPool/LeNet conv1", []int{3, 1, 28, 28}, []int{20, 1, 5, 5}, true, 1, 0, 2, false),
		convPoolCase("Conv2dReLUMaxPool/LeNet conv2", []int{2, 20, 12, 12}, []int{50, 20, 5, 5}, true, 1, 0, 2, true),
		convPoolCase("Conv2dReLUMaxPool/pad 1 uncovered edge dx", []int{2, 3, 9, 7}, []int{4, 3, 3, 3}, true, 1, 1, 2, true),
		convPoolCase("Conv2dReLUMaxPool/pad 1 uncovered edge", []int{2, 3, 9, 7}, []int{4, 3, 3, 3}, true, 1, 1, 2, false),
		convPoolCase("Conv2dReLUMaxPool/k3 no bias", []int{2, 2, 11, 10}, []int{3, 2, 3, 3}, false, 1, 0, 3, false),
		convPoolCase("Conv2dReLUMaxPool/stride 2 C·R·S 45", []int{2, 5, 11, 11}, []int{4, 5, 3, 3}, true, 2, 1, 2, false),
		convPoolCase("Conv2dReLUMaxPool/large image", []int{2, 1, 71, 66}, []int{3, 1, 3, 3}, true, 1, 1, 2, false),
		convPoolCase("Conv2dReLUMaxPool/3x3 pad 1 one channel", []int{3, 1, 13, 10}, []int{7, 1, 3, 3}, true, 1, 1, 2, false),
		convPoolCase("Conv2dReLUMaxPool/5x5 odd channels", []int{2, 1, 16, 15}, []int{37, 1, 5, 5}, false, 1, 2, 2, false),
		convPoolCase("Conv2dReLUMaxPool/5x5 three channels", []int{2, 3, 12, 11}, []int{6, 3, 5, 5}, true, 1, 0, 2, false),
		convPoolCase("Conv2dReLUMaxPool/3x3 nine channels", []int{2, 9, 8, 8}, []int{5, 9, 3, 3}, true, 1, 1, 2, false),
		convPoolCase("Conv2dReLUMaxPool/3x3 pad 1 odd pooled width dx", []int{3, 8, 10, 11}, []int{7, 8, 3, 3}, true, 1, 1, 2, true),
		convPoolCase("Conv2dReLUMaxPool/5x5 pad 2 eighteen channels dx", []int{2, 8, 9, 8}, []int{18, 8, 5, 5}, false, 1, 2, 2, true),
		convPoolCase("Conv2dReLUMaxPool/260 images dx", []int{260, 8, 6, 6}, []int{5, 8, 3, 3}, true, 1, 0, 2, true),
		convPoolCase("Conv2dReLUMaxPool/300 images one channel", []int{300, 1, 8, 8}, []int{6, 1, 3, 3}, true, 1, 1, 2, false),
		poolCase("MaxPool2d/k2 s2", []int{2, 3, 8, 9}, 2, 2),
		poolCase("MaxPool2d/k3 s2", []int{1, 2, 9, 9}, 3, 2),
		poolCase("MaxPool2d/k2 s1", []int{2, 2, 5, 7}, 2, 1),
		agCase{
			name: "ReLU", inputs: []agInput{inK("away", 1000)}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.ReLU(t[0]) },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				out, gx := zeros64(len(v[0])), zeros64(len(v[0]))
				for i, x := range v[0] {
					if x > 0 {
						out[i], gx[i] = float64(x), float64(g[i])
					}
				}
				return out, [][]float64{gx}
			},
		},
		ceCase("CrossEntropy/direct", 7, 10, true, 1),
		ceCase("CrossEntropy/weighted", 33, 10, false, 1),
		ceCase("CrossEntropy/large logits", 16, 10, true, 80),
		lceCase("LinearCrossEntropy/direct", 9, 13, 5, true, true, false, true),
		lceCase("LinearCrossEntropy/weighted", 33, 20, 10, true, true, false, false),
		lceCase("LinearCrossEntropy/intermediate input", 17, 24, 10, true, true, true, true),
		lceCase("LinearCrossEntropy/LeNet fc2", 64, 500, 10, true, true, true, true),
		lceCase("LinearCrossEntropy/300 rows no bias", 300, 64, 10, false, true, false, false),
		lceCase("LinearCrossEntropy/input without gradient 17 classes", 70, 129, 17, true, false, false, true),
		lceCase("LinearCrossEntropy/32 classes", 40, 36, 32, true, true, true, false),
		lceCase("LinearCrossEntropy/40 classes", 5, 7, 40, true, true, false, true),
		agCase{
			name: "Reshape", inputs: []agInput{in(true, 6, 35)}, tol: 0,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				return tensor.Mul(t[0].Reshape(5, -1), tensor.Full(t[0].Backend(), t[0].Scope(), 1, 5, 42)).Reshape(-1)
			},
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				return f64(v[0]), [][]float64{f64(g)}
			},
		},
		agCase{
			name: "Reshape/Flatten", inputs: []agInput{in(true, 2, 3, 4, 5)}, tol: 0,
			fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return t[0].Flatten() },
			ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
				return f64(v[0]), [][]float64{f64(g)}
			},
		},
		transposeCase("Transpose/2-D", []int{7, 33}, 0, 1),
		transposeCase("Transpose/3-D axes 0,2", []int{3, 4, 5}, 0, 2),
		transposeCase("Transpose/4-D axes 1,3", []int{2, 3, 4, 5}, 1, 3),
		mlpCase(),
		reluXentCase("Composite/LinearReLU-LinearCrossEntropy", 9, 13, 17, 5, 0, true),
		reluXentCase("Composite/LinearReLU-LinearCrossEntropy weighted, MLP widths", 64, 512, 1024, 10, 0, false),
		reluChainCase("Composite/LinearReLU-LinearReLU-LinearCrossEntropy", 9, 13, 17, 11, 5),
		reluChainCase("Composite/LinearReLU-LinearReLU-LinearCrossEntropy, MLP widths", 64, 512, 1024, 512, 10),
		reluXentCase("Composite/LinearReLU-LinearCrossEntropy and a Sum of the ReLU's output after", 9, 13, 17, 5, 1, true),
		reluXentCase("Composite/LinearReLU-LinearCrossEntropy and a Sum of the ReLU's output before", 9, 13, 17, 5, 2, false),
		fanoutCase(),
	)
	cases = append(cases, softmaxAutogradCases()...)
	cases = append(cases, indexAutogradCases()...)
	cases = append(cases, lossAutogradCases()...)
	cases = append(cases, matmulAutogradCases()...)
	cases = append(cases, attentionCases()...)
	cases = append(cases, stridedAttentionCases()...)
	cases = append(cases, convGeneralAutogradCases()...)
	cases = append(cases, poolAutogradCases()...)
	cases = append(cases, randomCases()...)
	cases = append(cases, normCases()...)
	cases = append(cases, autocastCases()...)
	cases = append(cases, elementwiseAutogradCases()...)
	cases = append(cases, fusedAutogradCases()...)
	return cases
}

func shapeName(m, k, n int) string { return fmt.Sprintf("%dx%d·%dx%d", m, k, k, n) }

// mlpCase is Linear → ReLU → Linear → CrossEntropy: gradients flow through
// intermediate (non-leaf) tensors.
func mlpCase() agCase {
	const n, inF, hid, cls = 9, 13, 17, 5
	return agCase{
		name:   "Composite/Linear-ReLU-Linear-CrossEntropy",
		inputs: []agInput{in(true, n, inF), in(true, hid, inF), in(true, hid), in(true, cls, hid), in(true, cls)},
		labels: [2]int{n, cls}, direct: true, tol: tolAG,
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			h := tensor.ReLU(tensor.Linear(t[0], t[1], t[2]))
			return tensor.CrossEntropy(tensor.Linear(h, t[3], t[4]), lab)
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			x, w1, b1, w2, b2 := f64(v[0]), f64(v[1]), f64(v[2]), f64(v[3]), f64(v[4])
			h := linear64(x, w1, b1, n, inF, hid)
			r := relu64(append([]float64(nil), h...))
			// The loss at float32-rounded logits: what the device sees.
			loss, _, dz, _ := refCE(rounded32(linear64(r, w2, b2, n, hid, cls)), lab, n, cls)
			dr, dw2, db2 := linearGrads64(scaled(dz, float64(g[0])), r, w2, n, hid, cls)
			maskNonPositive(dr, h)
			dx, dw1, db1 := linearGrads64(dr, x, w1, n, inF, hid)
			return []float64{loss}, [][]float64{dx, dw1, db1, dw2, db2}
		},
	}
}

// reluXentCase is LinearCrossEntropy(LinearReLU(x, w1, b1), w2, b2), the
// tail of an MLP: on a backend that fuses both, the cross entropy hands the
// ReLU's output its gradient already through the mask, and LinearReLU's
// backward pass skips its own. With sum 1 (2) the loss also adds
// Sum(h)/8 after (before) the cross entropy: a second part of h's
// gradient that comes without the mask, so the mask must be applied again.
// x, w1 and b1 are on the grid, so that every backend agrees on the mask.
func reluXentCase(name string, n, inF, hid, cls, sum int, direct bool) agCase {
	return agCase{
		name:   name,
		inputs: []agInput{inK("grid", n, inF), inK("grid", hid, inF), inK("grid", hid), in(true, cls, hid), in(true, cls)},
		labels: [2]int{n, cls}, direct: direct, tol: wideTol(hid),
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			h := tensor.LinearReLU(t[0], t[1], t[2])
			switch sum {
			case 1:
				return tensor.Add(tensor.LinearCrossEntropy(h, t[3], t[4], lab), tensor.MulScalar(tensor.Sum(h), 0.125))
			case 2:
				return tensor.Add(tensor.MulScalar(tensor.Sum(h), 0.125), tensor.LinearCrossEntropy(h, t[3], t[4], lab))
			}
			return tensor.LinearCrossEntropy(h, t[3], t[4], lab)
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			x, w1, b1, w2, b2 := f64(v[0]), f64(v[1]), f64(v[2]), f64(v[3]), f64(v[4])
			h := relu64(linear64(x, w1, b1, n, inF, hid))
			loss, _, dz, _ := refCE(rounded32(linear64(h, w2, b2, n, hid, cls)), lab, n, cls)
			dh, dw2, db2 := linearGrads64(scaled(dz, float64(g[0])), h, w2, n, hid, cls)
			if sum != 0 {
				for i, a := range h {
					dh[i] += 0.125 * float64(g[0])
					loss += 0.125 * a
				}
			}
			maskNonPositive(dh, h)
			dx, dw1, db1 := linearGrads64(dh, x, w1, n, inF, hid)
			return []float64{loss}, [][]float64{dx, dw1, db1, dw2, db2}
		},
	}
}

// reluChainCase is a three-layer MLP, LinearCrossEntropy(LinearReLU(
// LinearReLU(x, w1, b1), w2, b2), w3, b3): the second layer's gradient
// comes masked from the cross entropy, the first's does not. x and the
// first two layers are on the grid, so that every backend agrees on the
// masks.
func reluChainCase(name string, n, inF, h1, h2, cls int) agCase {
	return agCase{
		name: name,
		inputs: []agInput{inK("grid", n, inF), inK("grid", h1, inF), inK("grid", h1), inK("grid", h2, h1), inK("grid", h2),
			in(true, cls, h2), in(true, cls)},
		labels: [2]int{n, cls}, direct: true, tol: wideTol(h1),
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			a := tensor.LinearReLU(t[0], t[1], t[2])
			return tensor.LinearCrossEntropy(tensor.LinearReLU(a, t[3], t[4]), t[5], t[6], lab)
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			x, w1, b1, w2, b2, w3, b3 := f64(v[0]), f64(v[1]), f64(v[2]), f64(v[3]), f64(v[4]), f64(v[5]), f64(v[6])
			a1 := relu64(linear64(x, w1, b1, n, inF, h1))
			a2 := relu64(linear64(a1, w2, b2, n, h1, h2))
			loss, _, dz, _ := refCE(rounded32(linear64(a2, w3, b3, n, h2, cls)), lab, n, cls)
			d2, dw3, db3 := linearGrads64(scaled(dz, float64(g[0])), a2, w3, n, h2, cls)
			maskNonPositive(d2, a2)
			d1, dw2, db2 := linearGrads64(d2, a1, w2, n, h1, h2)
			maskNonPositive(d1, a1)
			dx, dw1, db1 := linearGrads64(d1, x, w1, n, inF, h1)
			return []float64{loss}, [][]float64{dx, dw1, db1, dw2, db2, dw3, db3}
		},
	}
}

// wideTol is tolAG, or tolWide for sums over more than 256 hidden units.
func wideTol(hidden int) float64 {
	if hidden > 256 {
		return tolWide
	}
	return tolAG
}

// relu64 sets h to max(h, 0) and returns it.
func relu64(h []float64) []float64 {
	for i, a := range h {
		h[i] = math.Max(a, 0)
	}
	return h
}

// maskNonPositive zeroes d where h <= 0: a ReLU's backward pass, h its
// input or its output.
func maskNonPositive(d, h []float64) {
	for i := range d {
		if h[i] <= 0 {
			d[i] = 0
		}
	}
}

// rounded32 is z rounded to float32 (logits as a device holds them).
func rounded32(z []float64) []float32 {
	out := make([]float32, len(z))
	for i, a := range z {
		out[i] = float32(a)
	}
	return out
}

// fanoutCase uses an intermediate tensor three times: h = Linear(x),
// out = h*h + h, so that its gradient accumulates (2h + 1)·g.
func fanoutCase() agCase {
	const n, inF, outF = 5, 8, 6
	return agCase{
		name:   "Composite/fan-out of an intermediate",
		inputs: []agInput{in(true, n, inF), in(true, outF, inF)},
		tol:    tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			h := tensor.Linear(t[0], t[1], nil)
			return tensor.Add(tensor.Mul(h, h), h)
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			x, w := f64(v[0]), f64(v[1])
			h := linear64(x, w, nil, n, inF, outF)
			out, dh := zeros64(len(h)), zeros64(len(h))
			for i, a := range h {
				out[i] = a*a + a
				dh[i] = (2*a + 1) * float64(g[i])
			}
			dx, dw, _ := linearGrads64(dh, x, w, n, inF, outF)
			return out, [][]float64{dx, dw}
		},
	}
}
