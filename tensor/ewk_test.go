package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// fusedCase is a fused expression and the same computation composed of the
// package's ordinary operations, which is what the fused op must match.
type fusedCase struct {
	name     string
	inputs   []string
	shapes   [][]int
	expr     func() *tensor.Expr
	composed func(in []*tensor.Tensor) *tensor.Tensor
	positive bool // inputs drawn from [0.5, 2] (log, sqrt, division)
}

var x, y, z = tensor.Var("x"), tensor.Var("y"), tensor.Var("z")

func fusedCases() []fusedCase {
	// geluTanh is 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), GELU's tanh
	// approximation written out, on x + b (a bias broadcast over rows).
	geluTanh := func(v *tensor.Expr) *tensor.Expr {
		inner := v.Add(v.Mul(v).Mul(v).Scale(0.044715)).Scale(0.7978845608)
		return v.Scale(0.5).Mul(inner.Tanh().AddConst(1))
	}
	geluComposed := func(v *tensor.Tensor) *tensor.Tensor {
		inner := tensor.Scale(tensor.Add(v, tensor.Scale(tensor.Mul(tensor.Mul(v, v), v), 0.044715)), 0.7978845608)
		return tensor.Mul(tensor.Scale(v, 0.5), tensor.AddScalar(tensor.Tanh(inner), 1))
	}
	return []fusedCase{
		{name: "x*y+1 broadcast", inputs: []string{"x", "y"}, shapes: [][]int{{3, 4, 5}, {4, 1}},
			expr:     func() *tensor.Expr { return x.Mul(y).AddConst(1) },
			composed: func(in []*tensor.Tensor) *tensor.Tensor { return tensor.AddScalar(tensor.Mul(in[0], in[1]), 1) }},
		{name: "bias+GELU-tanh", inputs: []string{"x", "b"}, shapes: [][]int{{6, 9}, {9}},
			expr:     func() *tensor.Expr { return geluTanh(x.Add(tensor.Var("b"))) },
			composed: func(in []*tensor.Tensor) *tensor.Tensor { return geluComposed(tensor.Add(in[0], in[1])) }},
		{name: "sigmoid(x)*y - exp(z)", inputs: []string{"x", "y", "z"}, shapes: [][]int{{2, 3, 4}, {3, 4}, {2, 1, 1}},
			expr: func() *tensor.Expr { return x.Sigmoid().Mul(y).Sub(z.Exp()) },
			composed: func(in []*tensor.Tensor) *tensor.Tensor {
				return tensor.Sub(tensor.Mul(tensor.Sigmoid(in[0]), in[1]), tensor.Exp(in[2]))
			}},
		{name: "log(sqrt(x))/y + 1/x", inputs: []string{"x", "y"}, shapes: [][]int{{5, 7}, {5, 7}}, positive: true,
			expr: func() *tensor.Expr { return x.Sqrt().Log().Div(y).Add(x.Reciprocal()) },
			composed: func(in []*tensor.Tensor) *tensor.Tensor {
				return tensor.Add(tensor.Div(tensor.Log(tensor.Sqrt(in[0])), in[1]), tensor.Reciprocal(in[0]))
			}},
		{name: "relu(x)·sin(y) + cos(x)², x used thrice", inputs: []string{"x", "y"}, shapes: [][]int{{4, 6}, {1, 6}},
			expr: func() *tensor.Expr { return x.ReLU().Mul(y.Sin()).Add(x.Cos().Square()).Sub(x.Neg()) },
			composed: func(in []*tensor.Tensor) *tensor.Tensor {
				a := tensor.Mul(tensor.ReLU(in[0]), tensor.Sin(in[1]))
				return tensor.Sub(tensor.Add(a, tensor.Square(tensor.Cos(in[0]))), tensor.Neg(in[0]))
			}},
	}
}

func randomInputs(rng *rand.Rand, s *tensor.Scope, b tensor.Backend, c fusedCase) []*tensor.Tensor {
	in := make([]*tensor.Tensor, len(c.shapes))
	for i, sh := range c.shapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		v := make([]float32, n)
		for j := range v {
			if c.positive {
				v[j] = float32(0.5 + 1.5*rng.Float64())
			} else {
				v[j] = float32(rng.NormFloat64())
			}
		}
		in[i] = tensor.FromFloat32(b, s, v, sh...).SetRequiresGrad(true)
	}
	return in
}

// runCase returns the output and the inputs' gradients of Σ out·w, through
// the fused op or the composed one.
func runCase(t *testing.T, b tensor.Backend, c fusedCase, fused bool, seed uint64) (out []float32, grads [][]float32) {
	t.Helper()
	s := tensor.NewScope()
	defer s.Release()
	rng := rand.New(rand.NewPCG(seed, 7))
	in := randomInputs(rng, s, b, c)
	var res *tensor.Tensor
	if fused {
		f, err := tensor.Fused(c.expr(), c.inputs...)
		if err != nil {
			t.Fatal(err)
		}
		res = f.Apply(in...)
	} else {
		res = c.composed(in)
	}
	w := make([]float32, res.Len())
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	tensor.Sum(tensor.Mul(res, tensor.FromFloat32(b, s, w, res.Shape()...))).Backward()
	out = res.Float32s()
	for _, x := range in {
		grads = append(grads, x.Grad().Float32s())
	}
	return out, grads
}

// maxRelErr is max |got-want| relative to the largest |want| (at least 1).
func maxRelErr(got, want []float32) float64 {
	scale, worst := 1.0, 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range got {
		worst = math.Max(worst, math.Abs(float64(got[i])-float64(want[i])))
	}
	return worst / scale
}

// On the CPU the fused forward runs the composed ops' own scalar functions
// in the same order: the same bits. The gradients may associate products
// differently (g·(s·(1-s)) against the composed chain): 1e-5 of the
// largest gradient, a few float32 roundings.
func TestFusedMatchesComposedOps(t *testing.T) {
	for _, c := range fusedCases() {
		seed := rand.Uint64()
		out, grads := runCase(t, tensor.CPU, c, true, seed)
		wantOut, wantGrads := runCase(t, tensor.CPU, c, false, seed)
		for i := range out {
			if out[i] != wantOut[i] && !(math.IsNaN(float64(out[i])) && math.IsNaN(float64(wantOut[i]))) {
				t.Fatalf("%s (seed %d): forward element %d = %v, composed ops give %v", c.name, seed, i, out[i], wantOut[i])
			}
		}
		for k := range grads {
			if e := maxRelErr(grads[k], wantGrads[k]); e > 1e-5 || len(grads[k]) != len(wantGrads[k]) {
				t.Errorf("%s (seed %d): gradient of %s off by %.3g of its largest element (limit 1e-5)", c.name, seed, c.inputs[k], e)
			}
		}
	}
}

// plainBackend (ops_norm_test.go) hides the CPU's FusedBackend: Fused then
// composes Unary and Binary, the path of a backend without generated
// kernels, which must give the CPU's bits.
func TestFusedComposedFallback(t *testing.T) {
	if _, ok := any(plainBackend{tensor.Complete(tensor.CPU)}).(tensor.FusedBackend); ok {
		t.Fatal("plainBackend still implements FusedBackend")
	}
	for _, c := range fusedCases() {
		seed := rand.Uint64()
		out, grads := runCase(t, plainBackend{tensor.Complete(tensor.CPU)}, c, true, seed)
		wantOut, wantGrads := runCase(t, tensor.CPU, c, true, seed)
		if e := maxRelErr(out, wantOut); e != 0 {
			t.Errorf("%s (seed %d): composed fallback's forward differs by %.3g", c.name, seed, e)
		}
		for k := range grads {
			if e := maxRelErr(grads[k], wantGrads[k]); e != 0 {
				t.Errorf("%s (seed %d): composed fallback's gradient of %s differs by %.3g", c.name, seed, c.inputs[k], e)
			}
		}
	}
}

// eval64 evaluates the expression's printed form in float64, an
// interpreter independent of FusedProgram: it parses what Expr.String
// writes.
func eval64(s string, vars map[string]float64) float64 {
	p := &exprParser{s: s, vars: vars}
	v := p.expr()
	if p.i != len(p.s) {
		panic(fmt.Sprintf("eval64: trailing %q in %q", p.s[p.i:], s))
	}
	return v
}

type exprParser struct {
	s    string
	i    int
	vars map[string]float64
}

func (p *exprParser) expr() float64 {
	if p.s[p.i] == '(' {
		p.i++
		a := p.expr()
		op := p.s[p.i+1]
		p.i += 3
		b := p.expr()
		p.i++ // ')'
		switch op {
		case '+':
			return a + b
		case '-':
			return a - b
		case '*':
			return a * b
		case '/':
			return a / b
		case '>':
			if a > b {
				return 1
			}
			return 0
		}
		panic("eval64: operator " + string(op))
	}
	j := p.i
	for j < len(p.s) && strings.IndexByte("(), ", p.s[j]) < 0 {
		j++
	}
	word := p.s[p.i:j]
	p.i = j
	if p.i < len(p.s) && p.s[p.i] == '(' {
		p.i++
		a := p.expr()
		p.i++
		fns := map[string]func(float64) float64{"neg": func(v float64) float64 { return -v }, "exp": math.Exp, "log": math.Log,
			"sqrt": math.Sqrt, "square": func(v float64) float64 { return v * v }, "reciprocal": func(v float64) float64 { return 1 / v },
			"tanh": math.Tanh, "sigmoid": func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }, "sin": math.Sin, "cos": math.Cos,
			"relu": func(v float64) float64 { return math.Max(v, 0) }}
		return fns[word](a)
	}
	if v, ok := p.vars[word]; ok {
		return v
	}
	var v float64
	if _, err := fmt.Sscan(word, &v); err != nil {
		panic(fmt.Sprintf("eval64: %q: %v", word, err))
	}
	return v
}

// The symbolic gradients against central finite differences of the
// expression, both in float64 (so the check is of the derivation alone):
// step 1e-5, whose truncation error (h² times the third derivative) and rounding (~1e-16/h)
// stay below 1e-7 for these smooth functions at points away from ReLU's
// kink.
func TestFusedGradientsFiniteDifferences(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for _, c := range fusedCases() {
		f, err := tensor.Fused(c.expr(), c.inputs...)
		if err != nil {
			t.Fatal(err)
		}
		src := f.Expr().String()
		for range 20 {
			vars := map[string]float64{}
			for _, name := range c.inputs {
				v := rng.NormFloat64()
				if c.positive {
					v = 0.5 + 1.5*rng.Float64()
				}
				if math.Abs(v) < 1e-3 {
					v = 0.1
				}
				vars[name] = v
			}
			for _, name := range c.inputs {
				const h = 1e-5
				x0 := vars[name]
				vars[name] = x0 + h
				up := eval64(src, vars)
				vars[name] = x0 - h
				down := eval64(src, vars)
				vars[name] = x0
				fd := (up - down) / (2 * h)
				g := eval64(f.Gradient(name).String(), vars)
				if math.Abs(g-fd) > 1e-6*math.Max(1, math.Abs(fd)) {
					t.Errorf("%s: d/d%s at %v: symbolic %.9g (%v), finite difference %.9g", c.name, name, vars, g, f.Gradient(name), fd)
				}
			}
		}
	}
}

// Float32 finite differences through Apply itself (the whole forward on the
// CPU) against Backward's gradient: step 1e-2 on inputs of order 1, so that
// float32 rounding of the loss (~1e-7·Σ|terms|, over 1e-2) stays near 1e-4;
// tolerance 3e-3 of the largest gradient.
func TestFusedApplyFiniteDifferences(t *testing.T) {
	for _, c := range fusedCases() {
		if strings.Contains(c.name, "relu") {
			continue // a kink within a step of some input is likely
		}
		seed := rand.Uint64()
		_, grads := runCase(t, tensor.CPU, c, true, seed)
		loss := func(k, j int, dx float32) float64 {
			s := tensor.NewScope()
			defer s.Release()
			rng := rand.New(rand.NewPCG(seed, 7))
			in := randomInputs(rng, s, tensor.CPU, c)
			v := in[k].Float32s()
			v[j] += dx
			in[k] = tensor.FromFloat32(tensor.CPU, s, v, in[k].Shape()...)
			res := tensor.MustFused(c.expr(), c.inputs...).Apply(in...)
			w := make([]float32, res.Len())
			for i := range w {
				w[i] = float32(rng.NormFloat64())
			}
			sum := 0.0
			for i, o := range res.Float32s() {
				sum += float64(o) * float64(w[i])
			}
			return sum
		}
		for k, g := range grads {
			scale := 1e-3
			for _, v := range g {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			for j := range g {
				const h = 1e-2
				fd := (loss(k, j, h) - loss(k, j, -h)) / (2 * h)
				if math.Abs(fd-float64(g[j])) > 3e-3*scale {
					t.Errorf("%s (seed %d): d/d%s[%d] = %v, finite difference %v", c.name, seed, c.inputs[k], j, g[j], fd)
				}
			}
		}
	}
}

func TestFusedValidation(t *testing.T) {
	cases := []struct {
		expr   *tensor.Expr
		inputs []string
		want   string
	}{
		{x.Add(y), []string{"x"}, `uses "y", which is not among the inputs`},
		{x, nil, "no inputs named"},
		{x, []string{"x", "x"}, `input "x" named twice`},
		{x, []string{"x", "2y"}, `input name "2y" is not an identifier`},
		{x, []string{"x", "a-b"}, `input name "a-b" is not an identifier`},
		{x.Mul(nil), []string{"x"}, "nil operand"},
		{nil, []string{"x"}, "nil operand"},
	}
	for _, c := range cases {
		_, err := tensor.Fused(c.expr, c.inputs...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Fused(%v, %q) = %v; want an error containing %q", c.expr, c.inputs, err, c.want)
		}
	}
	f := tensor.MustFused(x.Mul(y), "x", "y")
	s := tensor.NewScope()
	defer s.Release()
	a, b := tensor.Zeros(tensor.CPU, s, 3, 4), tensor.Zeros(tensor.CPU, s, 5)
	mustPanic(t, "Apply of one tensor", "1 tensors for the 2 inputs", func() { f.Apply(a) })
	mustPanic(t, "Apply of shapes that do not broadcast", "do not broadcast", func() { f.Apply(a, b) })
	mustPanic(t, "Apply of an int32 tensor", "input y is not a float32 tensor", func() { f.Apply(a, tensor.FromInt32(tensor.CPU, s, []int32{1}, 1)) })
}

// Shared subexpressions, by pointer or only by structure, are computed
// once; an input the expression does not use gets a zero gradient.
func TestFusedProgramShape(t *testing.T) {
	f := tensor.MustFused(x.Mul(x).Add(tensor.Var("x").Mul(tensor.Var("x"))), "x", "unused")
	if n := len(f.Program().Nodes); n != 3 {
		t.Errorf("x*x + x*x: %d nodes, want 3 (x, x*x, the sum): %+v", n, f.Program().Nodes)
	}
	s := tensor.NewScope()
	defer s.Release()
	a := tensor.FromFloat32(tensor.CPU, s, []float32{1, 2, 3}, 3).SetRequiresGrad(true)
	u := tensor.FromFloat32(tensor.CPU, s, []float32{5}, 1).SetRequiresGrad(true)
	tensor.Sum(f.Apply(a, u)).Backward()
	if got := a.Grad().Float32s(); got[0] != 4 || got[1] != 8 || got[2] != 12 {
		t.Errorf("d(2x²)/dx at 1, 2, 3 = %v, want [4 8 12]", got)
	}
	if got := u.Grad().Float32s(); got[0] != 0 {
		t.Errorf("gradient of the unused input = %v, want [0]", got)
	}
	// Gradient programs for different sets of inputs are built separately
	// and compute only what is asked.
	if p := f.GradientProgram([]bool{true, false}); len(p.Outputs) != 1 {
		t.Errorf("gradient program for x alone has %d outputs", len(p.Outputs))
	}
}

// A transposed view and the same tensor given for two inputs.
func TestFusedStridedAndRepeatedInputs(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	v := make([]float32, 12)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	a := tensor.FromFloat32(tensor.CPU, s, v, 3, 4).SetRequiresGrad(true)
	at := a.Transpose(0, 1)
	f := tensor.MustFused(x.Mul(y.Tanh()), "x", "y")
	got := f.Apply(at, at)
	want := tensor.Mul(at, tensor.Tanh(at))
	if e := maxRelErr(got.Float32s(), want.Float32s()); e != 0 {
		t.Errorf("x·tanh(x) of a transpose differs by %.3g", e)
	}
	tensor.Sum(got).Backward()
	g := a.Grad().Float32s()
	for i, xv := range v {
		th := math.Tanh(float64(xv))
		d := th + float64(xv)*(1-th*th)
		if math.Abs(float64(g[i])-d) > 1e-6 {
			t.Errorf("d(x·tanh x)/dx at %v = %v, want %v", xv, g[i], d)
		}
	}
}
