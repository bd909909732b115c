package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// stateKeys lists the state dict names and shapes of m as "name [shape]".
func stateKeys(m nn.Module) []string {
	var out []string
	for _, p := range nn.StateTensors(m) {
		if p.Tensor != nil {
			out = append(out, p.Name+" "+shapeString(p.Tensor.Shape()))
		}
	}
	return out
}

func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = itoa(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func itoa(d int) string {
	if d == 0 {
		return "0"
	}
	var b []byte
	for ; d > 0; d /= 10 {
		b = append([]byte{byte('0' + d%10)}, b...)
	}
	return string(b)
}

// releaseState frees every parameter (with its gradient) and buffer of m.
func releaseState(m nn.Module) {
	for _, p := range nn.StateTensors(m) {
		if g := p.Tensor.Grad(); g != nil {
			g.Release()
		}
		p.Tensor.Release()
	}
}

// sameValues fails unless got and want hold the same values, to tol
// (absolute, plus tol relative).
func sameValues(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: [%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// panics reports whether f panics, and with a message containing want.
func panics(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			t.Fatalf("no panic; want one saying %q", want)
		}
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Fatalf("panic %v; want one saying %q", r, want)
		}
	}()
	f()
}

// conv2dRef is a direct float64 convolution (cross-correlation, as torch)
// of x [n,c,h,w] by w [k,c/groups,r,s] plus bias (may be nil).
func conv2dRef(x []float32, n, c, h, wd int, w []float32, k, r, s int, bias []float32, stride, pad, dil [2]int, groups int) ([]float64, int, int) {
	oh := (h+2*pad[0]-dil[0]*(r-1)-1)/stride[0] + 1
	ow := (wd+2*pad[1]-dil[1]*(s-1)-1)/stride[1] + 1
	cg, kg := c/groups, k/groups
	out := make([]float64, n*k*oh*ow)
	for b := 0; b < n; b++ {
		for o := 0; o < k; o++ {
			g := o / kg
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					sum := 0.0
					if bias != nil {
						sum = float64(bias[o])
					}
					for ci := 0; ci < cg; ci++ {
						for u := 0; u < r; u++ {
							for v := 0; v < s; v++ {
								y, xx := i*stride[0]-pad[0]+u*dil[0], j*stride[1]-pad[1]+v*dil[1]
								if y < 0 || y >= h || xx < 0 || xx >= wd {
									continue
								}
								sum += float64(x[((b*c+g*cg+ci)*h+y)*wd+xx]) * float64(w[((o*cg+ci)*r+u)*s+v])
							}
						}
					}
					out[((b*k+o)*oh+i)*ow+j] = sum
				}
			}
		}
	}
	return out, oh, ow
}

// Conv2d with a rectangular kernel, per-axis stride, padding and
// dilation, groups and no bias: shapes, torch's init bound
// 1/√(in/groups·kh·kw), the state dict, and the output against a direct
// float64 convolution (float32 sums of at most 24 products of N(0,1) and
// the bound: 1e-5 relative leaves a wide margin).
func TestConv2dWithOptions(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	cases := []struct {
		name    string
		in, out int
		o       nn.Conv2dOptions
	}{
		{"rectangular strided padded dilated", 4, 6, nn.Conv2dOptions{Kernel: [2]int{3, 2}, Stride: [2]int{2, 1}, Padding: [2]int{1, 2}, Dilation: [2]int{1, 2}}},
		{"groups 2 without bias", 4, 6, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, Groups: 2, NoBias: true}},
		{"depthwise", 4, 8, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Groups: 4}},
	}
	for _, tc := range cases {
		c := nn.NewConv2dWith(tensor.CPU, rng, tc.in, tc.out, tc.o)
		groups := max(tc.o.Groups, 1)
		kh, kw := tc.o.Kernel[0], tc.o.Kernel[1]
		wantShape := []int{tc.out, tc.in / groups, kh, kw}
		if !slices.Equal(c.Weight.Shape(), wantShape) {
			t.Fatalf("%s: weight %v, want %v", tc.name, c.Weight.Shape(), wantShape)
		}
		fanIn := tc.in / groups * kh * kw
		checkInit(t, tc.name+" weight", c.Weight, fanIn)
		wantKeys := []string{"weight " + shapeString(wantShape)}
		if tc.o.NoBias {
			if c.Bias != nil {
				t.Fatalf("%s: NoBias gave a bias", tc.name)
			}
		} else {
			checkInit(t, tc.name+" bias", c.Bias, fanIn)
			wantKeys = append(wantKeys, "bias ["+itoa(tc.out)+"]")
		}
		if got := stateKeys(c); !slices.Equal(got, wantKeys) {
			t.Errorf("%s: state dict %v, want %v", tc.name, got, wantKeys)
		}
		s := tensor.NewScope()
		const n, h, w = 2, 7, 6
		xv := layerNormals(rng, n*tc.in*h*w)
		x := tensor.FromFloat32(tensor.CPU, s, xv, n, tc.in, h, w)
		y := c.Forward(x)
		var bias []float32
		if c.Bias != nil {
			bias = c.Bias.Float32s()
		}
		ref, oh, ow := conv2dRef(xv, n, tc.in, h, w, c.Weight.Float32s(), tc.out, kh, kw, bias,
			[2]int{max(tc.o.Stride[0], 1), max(tc.o.Stride[1], 1)}, tc.o.Padding,
			[2]int{max(tc.o.Dilation[0], 1), max(tc.o.Dilation[1], 1)}, groups)
		if !slices.Equal(y.Shape(), []int{n, tc.out, oh, ow}) {
			t.Fatalf("%s: output %v, want [%d %d %d %d]", tc.name, y.Shape(), n, tc.out, oh, ow)
		}
		want := make([]float32, len(ref))
		for i, v := range ref {
			want[i] = float32(v)
		}
		sameValues(t, tc.name, y.Float32s(), want, 1e-5)
		// The layer is the core's operation with its options.
		sameValues(t, tc.name+" vs Conv2dWith", y.Float32s(), tensor.Conv2dWith(x, c.Weight, c.Bias, *c.Options).Float32s(), 0)
		// Gradients reach the weight (and the bias when there is one).
		tensor.Sum(y).Backward()
		for _, p := range nn.Parameters(c) {
			if p.Tensor.Grad() == nil {
				t.Errorf("%s: no gradient for %s", tc.name, p.Name)
			}
		}
		s.Release()
		releaseState(c)
	}
	panics(t, "groups 3", func() { nn.NewConv2dWith(tensor.CPU, nil, 4, 6, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Groups: 3}) })
	panics(t, "kernel", func() { nn.NewConv2dWith(tensor.CPU, nil, 4, 6, nn.Conv2dOptions{}) })
}

// Linear without bias, on [B, T, In] input: only weight in the state dict,
// and y = x·Wᵀ row by row (float64 reference, 1e-6 relative: sums of 5
// products).
func TestLinearNoBiasLeadingDims(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 1))
	l := nn.NewLinearNoBias(tensor.CPU, rng, 5, 3)
	defer releaseState(l)
	checkInit(t, "weight", l.Weight, 5)
	if got := stateKeys(l); !slices.Equal(got, []string{"weight [3,5]"}) {
		t.Errorf("state dict %v", got)
	}
	s := tensor.NewScope()
	defer s.Release()
	xv := layerNormals(rng, 2*4*5)
	y := l.Forward(tensor.FromFloat32(tensor.CPU, s, xv, 2, 4, 5))
	if !slices.Equal(y.Shape(), []int{2, 4, 3}) {
		t.Fatalf("shape %v", y.Shape())
	}
	w := l.Weight.Float32s()
	want := make([]float32, 2*4*3)
	for r := 0; r < 8; r++ {
		for o := 0; o < 3; o++ {
			sum := 0.0
			for k := 0; k < 5; k++ {
				sum += float64(xv[r*5+k]) * float64(w[o*5+k])
			}
			want[r*3+o] = float32(sum)
		}
	}
	sameValues(t, "Linear no bias", y.Float32s(), want, 1e-6)
	sameValues(t, "ForwardReLU", l.ForwardReLU(tensor.FromFloat32(tensor.CPU, s, xv, 2, 4, 5)).Float32s(),
		tensor.ReLU(y).Float32s(), 0)
}

// The pooling layers are the core's pooling operations with their
// options, and have no state.
func TestPoolingLayers(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 1))
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 2*3*7*9), 2, 3, 7, 9)
	po := tensor.PoolOptions{Kernel: [2]int{3, 2}, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}, CeilMode: true}
	ao := tensor.AvgPoolOptions{PoolOptions: po, ExcludePad: true}
	for _, c := range []struct {
		name  string
		layer nn.Module
		want  *tensor.Tensor
	}{
		{"MaxPool2dWith", nn.NewMaxPool2dWith(po), tensor.MaxPool2dWith(x, po)},
		{"MaxPool2d", nn.NewMaxPool2d(2), tensor.MaxPool2d(x, 2, 2)},
		{"AvgPool2dWith", nn.NewAvgPool2dWith(ao), tensor.AvgPool2d(x, ao)},
		{"AvgPool2d", nn.NewAvgPool2d(3), tensor.AvgPool2d(x, tensor.AvgPoolOptions{PoolOptions: tensor.PoolOptions{Kernel: [2]int{3, 3}}})},
		{"AdaptiveAvgPool2d", nn.NewAdaptiveAvgPool2d(3, 4), tensor.AdaptiveAvgPool2d(x, 3, 4)},
		{"AdaptiveMaxPool2d", nn.NewAdaptiveMaxPool2d(1, 1), tensor.AdaptiveMaxPool2d(x, 1, 1)},
	} {
		y := c.layer.Forward(x)
		if !slices.Equal(y.Shape(), c.want.Shape()) {
			t.Fatalf("%s: shape %v, want %v", c.name, y.Shape(), c.want.Shape())
		}
		sameValues(t, c.name, y.Float32s(), c.want.Float32s(), 0)
		if k := stateKeys(c.layer); len(k) != 0 {
			t.Errorf("%s has state %v", c.name, k)
		}
	}
	// Ceil mode and padding give torch's size on 8×9 input: rows
	// ⌈(8+2-3)/2⌉+1 = 5 (floor mode: 4); columns ⌈(9+2-2)/2⌉+1 = 6, less
	// the last window, which would start in the padding (at 10 ≥ 9+1): 5.
	x89 := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 8*9), 1, 1, 8, 9)
	if got := nn.NewMaxPool2dWith(po).Forward(x89).Shape(); !slices.Equal(got, []int{1, 1, 5, 5}) {
		t.Errorf("MaxPool2d k(3,2) s2 p1 ceil of 8x9: %v, want [1 1 5 5]", got)
	}
	panics(t, "AdaptiveAvgPool2d output 0x2", func() { nn.NewAdaptiveAvgPool2d(0, 2) })
}

// The activation layers are the core's operations.
func TestActivationLayers(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 1))
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 64), 4, 16)
	for _, c := range []struct {
		name  string
		layer nn.Module
		want  *tensor.Tensor
	}{
		{"GELU", nn.GELU{}, tensor.GELU(x, false)},
		{"GELU tanh", nn.GELU{Tanh: true}, tensor.GELU(x, true)},
		{"SiLU", nn.SiLU{}, tensor.SiLU(x)},
		{"Tanh", nn.Tanh{}, tensor.Tanh(x)},
		{"Sigmoid", nn.Sigmoid{}, tensor.Sigmoid(x)},
		{"LeakyReLU", nn.NewLeakyReLU(nn.DefaultLeakySlope), tensor.LeakyReLU(x, 0.01)},
		{"ReLU", nn.ReLU{}, tensor.ReLU(x)},
		{"Identity", nn.Identity{}, x},
	} {
		sameValues(t, c.name, c.layer.Forward(x).Float32s(), c.want.Float32s(), 0)
	}
	// The two GELUs differ (by up to ~1e-3 near |x| = 2), so the flag is
	// passed on.
	a, b := nn.GELU{}.Forward(x).Float32s(), nn.GELU{Tanh: true}.Forward(x).Float32s()
	if slices.Equal(a, b) {
		t.Error("GELU and its tanh approximation agree exactly: the flag is not used")
	}
}
