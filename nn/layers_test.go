package nn_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Layers are thin wrappers over the tensor operations (checked against
// float64 references and finite differences in package tensor); these
// tests check the wiring: shapes, names, initialisation, strides and
// padding, and a finite-difference check through a Sequential.

func layerRelease(m nn.Module) {
	for _, p := range nn.Parameters(m) {
		if g := p.Tensor.Grad(); g != nil {
			g.Release()
		}
		p.Tensor.Release()
	}
}

func layerNormals(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

func layerSameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func checkInit(t *testing.T, name string, p *tensor.Tensor, fanIn int) {
	t.Helper()
	bound := 1 / math.Sqrt(float64(fanIn))
	for _, v := range p.Float32s() {
		if math.Abs(float64(v)) > bound {
			t.Fatalf("%s: value %g outside the init bound ±%g", name, v, bound)
		}
	}
	if !p.RequiresGrad() {
		t.Errorf("%s does not require grad", name)
	}
}

// A Conv2d layer with stride 2 and padding 1 computes exactly
// tensor.Conv2d with those settings.
func TestConv2dLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	c := nn.NewConv2d(tensor.CPU, rng, 3, 4, 3)
	defer layerRelease(c)
	if c.Stride != 1 || c.Padding != 0 {
		t.Errorf("NewConv2d: stride %d, padding %d; want 1, 0", c.Stride, c.Padding)
	}
	ps := c.Parameters()
	if len(ps) != 2 || ps[0].Name != "weight" || ps[1].Name != "bias" ||
		!layerSameInts(c.Weight.Shape(), []int{4, 3, 3, 3}) || !layerSameInts(c.Bias.Shape(), []int{4}) {
		t.Fatalf("Conv2d parameters: %v %v %v", ps, c.Weight.Shape(), c.Bias.Shape())
	}
	checkInit(t, "conv weight", c.Weight, 27)
	checkInit(t, "conv bias", c.Bias, 27)
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 2*3*9*7), 2, 3, 9, 7)
	for _, sp := range [][2]int{{1, 0}, {2, 1}, {1, 2}, {2, 0}} {
		c.Stride, c.Padding = sp[0], sp[1]
		y := c.Forward(x)
		want := tensor.Conv2d(x, c.Weight, c.Bias, sp[0], sp[1])
		if !layerSameInts(y.Shape(), want.Shape()) {
			t.Fatalf("stride %d pad %d: shape %v, want %v", sp[0], sp[1], y.Shape(), want.Shape())
		}
		oh := (9+2*sp[1]-3)/sp[0] + 1
		ow := (7+2*sp[1]-3)/sp[0] + 1
		if !layerSameInts(y.Shape(), []int{2, 4, oh, ow}) {
			t.Errorf("stride %d pad %d: shape %v, want [2 4 %d %d]", sp[0], sp[1], y.Shape(), oh, ow)
		}
		a, b := y.Float32s(), want.Float32s()
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("stride %d pad %d: layer output differs from tensor.Conv2d at %d", sp[0], sp[1], i)
			}
		}
	}
}

// Linear computes x·Wᵀ + b.
func TestLinearLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	l := nn.NewLinear(tensor.CPU, rng, 5, 3)
	defer layerRelease(l)
	checkInit(t, "linear weight", l.Weight, 5)
	checkInit(t, "linear bias", l.Bias, 5)
	s := tensor.NewScope()
	defer s.Release()
	xv := layerNormals(rng, 2*5)
	y := l.Forward(tensor.FromFloat32(tensor.CPU, s, xv, 2, 5)).Float32s()
	w, b := l.Weight.Float32s(), l.Bias.Float32s()
	for i := 0; i < 2; i++ {
		for o := 0; o < 3; o++ {
			want := float64(b[o])
			for k := 0; k < 5; k++ {
				want += float64(xv[i*5+k]) * float64(w[o*5+k])
			}
			if math.Abs(float64(y[i*3+o])-want) > 1e-6*(1+math.Abs(want)) {
				t.Errorf("y[%d,%d] = %v, want %v", i, o, y[i*3+o], want)
			}
		}
	}
	// A nil rng draws from a fixed seed: two layers are identical.
	a, c := nn.NewLinear(tensor.CPU, nil, 4, 2), nn.NewLinear(tensor.CPU, nil, 4, 2)
	defer layerRelease(a)
	defer layerRelease(c)
	if av, cv := a.Weight.Float32s(), c.Weight.Float32s(); av[0] != cv[0] || av[7] != cv[7] {
		t.Errorf("NewLinear with a nil rng is not deterministic")
	}
}

// MaxPool2d's stride defaults to its window; an explicit stride gives
// overlapping windows.
func TestMaxPool2dLayer(t *testing.T) {
	p := nn.NewMaxPool2d(2)
	if p.Kernel != 2 || p.Stride != 2 || p.Parameters() != nil {
		t.Fatalf("NewMaxPool2d(2) = %+v", p)
	}
	s := tensor.NewScope()
	defer s.Release()
	x := make([]float32, 25)
	for i := range x {
		x[i] = float32(i % 7)
	}
	xt := tensor.FromFloat32(tensor.CPU, s, x, 1, 1, 5, 5)
	y := p.Forward(xt)
	if !layerSameInts(y.Shape(), []int{1, 1, 2, 2}) {
		t.Fatalf("shape %v", y.Shape())
	}
	// Rows of x: [0 1 2 3 4] [5 6 0 1 2] [3 4 5 6 0] [1 2 3 4 5] [6 0 1 2 3]
	want := []float32{6, 3, 4, 6}
	for i, v := range y.Float32s() {
		if v != want[i] {
			t.Fatalf("k2 s2: %v, want %v", y.Float32s(), want)
		}
	}
	o := (&nn.MaxPool2d{Kernel: 3, Stride: 2}).Forward(xt)
	want = []float32{6, 6, 6, 6}
	if !layerSameInts(o.Shape(), []int{1, 1, 2, 2}) {
		t.Fatalf("k3 s2 shape %v", o.Shape())
	}
	for i, v := range o.Float32s() {
		if v != want[i] {
			t.Fatalf("k3 s2: %v, want %v", o.Float32s(), want)
		}
	}
}

// Sequential names its layers "0", "1", ... as torch.nn.Sequential, and
// applies them in order.
func TestSequential(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	m := nn.NewSequential(
		nn.NewConv2d(tensor.CPU, rng, 1, 2, 3),
		nn.ReLU{},
		nn.NewMaxPool2d(2),
		nn.Flatten{},
		nn.NewLinear(tensor.CPU, rng, 2*3*3, 4),
	)
	defer layerRelease(m)
	var names []string
	for _, p := range nn.Parameters(m) {
		names = append(names, p.Name)
	}
	want := []string{"0.weight", "0.bias", "4.weight", "4.bias"}
	if len(names) != len(want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("names %v, want %v", names, want)
		}
	}
	if n := nn.NumParameters(m); n != 2*9+2+18*4+4 {
		t.Errorf("NumParameters = %d", n)
	}
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 2*64), 2, 1, 8, 8)
	y := m.Forward(x)
	l := m.Layers
	manual := l[4].Module.Forward(tensor.MaxPool2d(tensor.ReLU(l[0].Module.Forward(x)), 2, 2).Flatten())
	a, b := y.Float32s(), manual.Float32s()
	if !layerSameInts(y.Shape(), []int{2, 4}) {
		t.Fatalf("shape %v", y.Shape())
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("Sequential output %v, layers applied by hand %v", a, b)
		}
	}
	if p := nn.Prefixed("net", nn.Parameters(m)); p[2].Name != "net.4.weight" {
		t.Errorf("Prefixed: %q", p[2].Name)
	}
}

// Finite differences in float64 through a Sequential
// Linear → ReLU → Linear and CrossEntropyLoss, for all four parameters:
// |analytic − fd| ≤ 1e-4·|fd| + 1e-5·max|fd| (see tensor/grad_test.go for
// the reasoning; the seed is fixed and no hidden pre-activation is within
// 1e-3 of the ReLU kink).
func TestSequentialGradFD(t *testing.T) {
	const n, in, hid, out = 6, 3, 5, 4
	rng := rand.New(rand.NewPCG(4, 4))
	l1, l2 := nn.NewLinear(tensor.CPU, rng, in, hid), nn.NewLinear(tensor.CPU, rng, hid, out)
	m := nn.NewSequential(l1, nn.ReLU{}, l2)
	defer layerRelease(m)
	xv := layerNormals(rng, n*in)
	labels := []int32{0, 3, 1, 2, 3, 0}
	s := tensor.NewScope()
	defer s.Release()
	loss := nn.CrossEntropyLoss(m.Forward(tensor.FromFloat32(tensor.CPU, s, xv, n, in)), tensor.FromInt32(tensor.CPU, s, labels, n))
	loss.Backward()

	params := nn.Parameters(m)
	vals := make([][]float64, len(params))
	for i, p := range params {
		for _, v := range p.Tensor.Float32s() {
			vals[i] = append(vals[i], float64(v))
		}
	}
	forward := func(checkKinks bool) float64 {
		w1, b1, w2, b2 := vals[0], vals[1], vals[2], vals[3]
		total := 0.0
		for r := 0; r < n; r++ {
			h := make([]float64, hid)
			for j := range h {
				a := b1[j]
				for k := 0; k < in; k++ {
					a += float64(xv[r*in+k]) * w1[j*in+k]
				}
				if checkKinks && math.Abs(a) < 1e-3 {
					t.Fatalf("hidden pre-activation %g too close to the ReLU kink; change the seed", a)
				}
				h[j] = math.Max(a, 0)
			}
			z := make([]float64, out)
			m := math.Inf(-1)
			for o := range z {
				z[o] = b2[o]
				for j := 0; j < hid; j++ {
					z[o] += h[j] * w2[o*hid+j]
				}
				m = math.Max(m, z[o])
			}
			se := 0.0
			for _, v := range z {
				se += math.Exp(v - m)
			}
			total += m + math.Log(se) - z[labels[r]]
		}
		return total / n
	}
	if want := forward(true); math.Abs(float64(loss.Item())-want) > 1e-6*want {
		t.Errorf("loss %v, float64 reference %v", loss.Item(), want)
	}
	for i, p := range params {
		analytic := p.Tensor.Grad().Float32s()
		fd := make([]float64, len(vals[i]))
		maxFD := 0.0
		for j, v := range vals[i] {
			h := 1e-6 * math.Max(1, math.Abs(v))
			vals[i][j] = v + h
			fp := forward(false)
			vals[i][j] = v - h
			fm := forward(false)
			vals[i][j] = v
			fd[j] = (fp - fm) / (2 * h)
			maxFD = math.Max(maxFD, math.Abs(fd[j]))
		}
		for j := range fd {
			if math.Abs(float64(analytic[j])-fd[j]) > 1e-4*math.Abs(fd[j])+1e-5*maxFD {
				t.Errorf("%s[%d]: analytic %.9g, finite difference %.9g", p.Name, j, analytic[j], fd[j])
			}
		}
	}
}
