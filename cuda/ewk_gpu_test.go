package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// GPU tests of NewElementwiseKernel: values against the same expression
// evaluated in Go, on fresh random inputs, dense, broadcast and transposed,
// and a compile error reported by NVRTC itself. They skip without a GPU.
//
// Tolerances: axpy is exact (a·x + y with --fmad=false is two IEEE
// roundings on both sides); the GELU body calls tanhf, which errs by up to
// 2 ulp against Go's correctly rounded math, so 1e-6 relative to the
// largest output.
func TestGPUElementwiseKernel(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	s := tensor.NewScope()
	defer s.Release()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 11))
	random := func(shape ...int) (*tensor.Tensor, []float32) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return tensor.FromFloat32(b, s, v, shape...), v
	}
	axpy, err := NewElementwiseKernel(b, axpySpec)
	gpuCheck(t, err)
	gelu, err := NewElementwiseKernel(b, ElementwiseSpec{Name: "gelu", Inputs: "x", Outputs: "out, slope", Params: "float k",
		Preamble: "__device__ float cube(float v) { return v * v * v; }",
		Body:     "float th = tanhf(k * (x + 0.044715f * cube(x)));\nout = 0.5f * x * (1.0f + th);\nslope = 1.0f - th * th;"})
	gpuCheck(t, err)

	// axpy over [3, 40, 50]: y dense, then broadcast [40, 1], then x a
	// transposed view.
	x, xs := random(3, 40, 50)
	for _, c := range []struct {
		name  string
		shape []int
		trans bool
	}{{"dense", []int{3, 40, 50}, false}, {"broadcast", []int{40, 1}, false}, {"transposed x", []int{3, 40, 50}, true}} {
		y, _ := random(c.shape...)
		xin, xv := x, xs
		if c.trans {
			xt, _ := random(3, 50, 40)
			xin = xt.Transpose(1, 2)
			xv = xin.Float32s() // the view's elements in row-major order
		}
		out := tensor.Empty(b, s, 3, 40, 50)
		gpuCheck(t, axpy.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{xin, y}, float32(1.5)))
		got := out.Float32s()
		yb := y.Expand(3, 40, 50).Float32s()
		for i := range got {
			if want := float32(1.5)*xv[i] + yb[i]; got[i] != want {
				t.Fatalf("axpy %s: element %d = %v, want %v", c.name, i, got[i], want)
			}
		}
	}

	xg, xgs := random(1000, 37)
	out, slope := tensor.Empty(b, s, 1000, 37), tensor.Empty(b, s, 1000, 37)
	gpuCheck(t, gelu.Launch([]*tensor.Tensor{out, slope}, []*tensor.Tensor{xg}, 0.7978845608))
	got, gotSlope := out.Float32s(), slope.Float32s()
	for i, v := range xgs {
		x := float64(v)
		th := math.Tanh(float64(float32(0.7978845608)) * (x + float64(float32(0.044715))*x*x*x))
		if d := math.Abs(float64(got[i]) - 0.5*x*(1+th)); d > 1e-6*math.Max(1, math.Abs(x)) {
			t.Fatalf("gelu(%v) = %v, want %v", x, got[i], 0.5*x*(1+th))
		}
		if d := math.Abs(float64(gotSlope[i]) - (1 - th*th)); d > 1e-6 {
			t.Fatalf("slope output at %v = %v, want %v", x, gotSlope[i], 1-th*th)
		}
	}

	spec := axpySpec
	spec.Name, spec.Body = "broken", "float u = a * x;\nout = u + z;"
	if _, err := NewElementwiseKernel(b, spec); err == nil || !strings.Contains(err.Error(), "broken body(2)") {
		t.Errorf("a body using an undeclared z: error %v; want one naming line 2 of the body", err)
	}
}

// A fused expression whose kernel is first needed inside a graph capture:
// it is generated, compiled and loaded during the capture (relaxed mode
// allows it), launched into the graph, and every replay reads the inputs'
// current values. Checked against the CPU backend's interpreter: 1e-6 of
// the largest value (expf and tanhf against Go's math).
func TestGPUFusedFirstUseInCapture(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	x, y := tensor.Var("x"), tensor.Var("y")
	// A constant no other test uses, so that this program is new to b.
	op := tensor.MustFused(x.Tanh().Mul(y.Exp()).AddConst(1.2345), "x", "y")
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	values := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	xs, ys := values(300), values(20)
	// The inputs' scope also holds what the captured work allocates (the
	// fused output), which must outlive the graph: released last.
	keep := tensor.NewNoGradScope()
	defer keep.Release()
	host := tensor.NewNoGradScope()
	defer host.Release()
	xt, yt := tensor.FromFloat32(b, keep, xs, 15, 20), tensor.FromFloat32(b, keep, ys, 20)
	res := tensor.Empty(b, keep, 15, 20)
	g, err := b.Capture(func() {
		tensor.CopyTensor(res, op.Apply(xt, yt))
	})
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	defer g.Close()
	for round := range 2 {
		if round == 1 {
			xs = values(300)
			xt.CopyFrom(xs)
		}
		gpuCheck(t, g.Replay())
		want := op.Apply(tensor.FromFloat32(tensor.CPU, host, xs, 15, 20), tensor.FromFloat32(tensor.CPU, host, ys, 20)).Float32s()
		got := res.Float32s()
		for i := range want {
			if d := math.Abs(float64(got[i]) - float64(want[i])); d > 1e-6*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("replay %d: element %d = %v, want %v", round, i, got[i], want[i])
			}
		}
	}
}
