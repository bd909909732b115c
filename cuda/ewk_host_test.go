package cuda

// The generated kernels run on the host: the CUDA source, with the few
// CUDA names it uses defined for plain C++ (one block of one thread, so the
// grid-stride loop visits every element), is compiled by clang++ into a
// program that calls the kernel with the arguments the backend passed to
// the recorder and prints the outputs exactly (%a). This checks the
// generator's index arithmetic, broadcasting and fused bodies against the
// CPU backend without a GPU; it skips where clang++ is missing. The GPU
// runs the same source through NVRTC (ewk_gpu_test.go, tensortest).

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// capturingExec is the recorder, keeping the last launch's kernel and
// arguments.
type capturingExec struct {
	*recExec
	fn   *Function
	args []any
}

func (c *capturingExec) launch(f *Function, grid, block Dim3, args []any) error {
	c.fn, c.args = f, append([]any(nil), args...)
	return c.recExec.launch(f, grid, block, args)
}

// hostMem pairs recorder tensors (contiguous, the memory views are taken
// of) with their host contents.
type hostMem struct {
	b     *Backend
	bases []*tensor.Tensor
	data  [][]float32
}

// tensorPair returns a recorder tensor and a CPU tensor of shape holding
// the same values.
func (h *hostMem) tensorPair(s *tensor.Scope, values []float32, shape ...int) (*tensor.Tensor, *tensor.Tensor) {
	r := tensor.FromFloat32(h.b, s, values, shape...)
	h.bases = append(h.bases, r)
	h.data = append(h.data, values)
	return r, tensor.FromFloat32(tensor.CPU, s, values, shape...)
}

// runOnHost compiles src with a main that calls the captured launch and
// returns the contents of the outputs (the bases at outIdx) afterwards.
func (h *hostMem) runOnHost(t *testing.T, src string, c *capturingExec, outIdx []int) [][]float32 {
	t.Helper()
	clang, err := exec.LookPath("clang++")
	if err != nil {
		t.Skip("clang++ not installed")
	}
	var prog strings.Builder
	prog.WriteString(`#include <math.h>
#include <stdio.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
struct uint3 { unsigned x, y, z; };
static uint3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
`)
	prog.WriteString(src)
	for i, d := range h.data {
		fmt.Fprintf(&prog, "static float mem%d[%d] = {", i, len(d))
		for j, v := range d {
			if j > 0 {
				prog.WriteString(", ")
			}
			prog.WriteString(strconv.FormatFloat(float64(v), 'x', -1, 32) + "f")
		}
		prog.WriteString("};\n")
	}
	var args []string
	for _, a := range c.args {
		switch v := a.(type) {
		case uintptr:
			found := false
			for i, base := range h.bases {
				p := h.b.f32("host test", base.Buffer())
				if v >= p && v < p+uintptr(4*len(h.data[i])) {
					args = append(args, fmt.Sprintf("mem%d + %d", i, (v-p)/4))
					found = true
				}
			}
			if !found {
				t.Fatalf("launch pointer %#x is in none of the test's tensors", v)
			}
		case int32:
			args = append(args, strconv.Itoa(int(v)))
		case int64:
			args = append(args, strconv.FormatInt(v, 10)+"LL")
		case float32:
			args = append(args, strconv.FormatFloat(float64(v), 'x', -1, 32)+"f")
		default:
			t.Fatalf("argument of type %T", a)
		}
	}
	fmt.Fprintf(&prog, "int main() {\n    %s(%s);\n", c.fn.Name, strings.Join(args, ", "))
	for _, i := range outIdx {
		fmt.Fprintf(&prog, "    for (int i = 0; i < %d; i++) printf(\"%%a\\n\", mem%d[i]);\n", len(h.data[i]), i)
	}
	prog.WriteString("    return 0;\n}\n")
	dir := t.TempDir()
	file, bin := filepath.Join(dir, "host.cpp"), filepath.Join(dir, "host")
	if err := os.WriteFile(file, []byte(prog.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(clang, "-std=c++17", "-O1", "-ffp-contract=off", "-w", "-x", "c++", file, "-o", bin).CombinedOutput(); err != nil {
		t.Fatalf("clang++: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("running the host build: %v", err)
	}
	lines := strings.Fields(string(out))
	var res [][]float32
	for _, i := range outIdx {
		vals := make([]float32, len(h.data[i]))
		for j := range vals {
			if len(lines) == 0 {
				t.Fatalf("host program printed too few values")
			}
			f, err := strconv.ParseFloat(lines[0], 32)
			if err != nil {
				t.Fatalf("host output %q: %v", lines[0], err)
			}
			vals[j], lines = float32(f), lines[1:]
		}
		res = append(res, vals)
	}
	return res
}

func hostRandom(n int, seed uint64) []float32 {
	v := make([]float32, n)
	x := seed*2654435761 + 1
	for i := range v {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		v[i] = float32(int64(x>>40)%2000-1000) / 500 // in [-2, 2)
	}
	return v
}

// within reports whether got matches want to tol relative to want's
// largest magnitude (at least 1).
func within(got, want []float32, tol float64) (float64, bool) {
	scale, worst := 1.0, 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-float64(want[i])))
	}
	return worst / scale, worst/scale <= tol && len(got) == len(want)
}

// TestElementwiseKernelOnHost: axpy dense, with a broadcast row and a
// transposed, narrowed input, and a 6-D broadcast, each against the CPU
// backend's a·x + y: exact (the host build rounds a·x and the sum as the
// CPU does).
func TestElementwiseKernelOnHost(t *testing.T) {
	haveClang(t)
	b, rec := newRecordingBackend(t)
	cx := &capturingExec{recExec: rec}
	b.x = cx
	k, err := NewElementwiseKernel(b, axpySpec)
	if err != nil {
		t.Fatal(err)
	}
	s := tensor.NewScope()
	defer s.Release()
	cases := []struct {
		name           string
		shape          []int
		xShape, yShape []int
		xView, yView   func(*tensor.Tensor) *tensor.Tensor
		strided        bool
	}{
		{"dense", []int{3, 4, 5}, []int{3, 4, 5}, []int{3, 4, 5}, nil, nil, false},
		{"broadcast row", []int{3, 4, 5}, []int{3, 4, 5}, []int{4, 1}, nil, nil, true},
		{"transposed and narrowed x", []int{3, 4, 5}, []int{3, 7, 4}, []int{5}, func(x *tensor.Tensor) *tensor.Tensor {
			return x.Narrow(1, 2, 5).Transpose(1, 2)
		}, nil, true},
		{"6-D", []int{2, 3, 2, 3, 2, 3}, []int{2, 1, 2, 1, 2, 1}, []int{3, 1, 3, 1, 3}, nil, nil, true},
	}
	for ci, c := range cases {
		h := &hostMem{b: b}
		n := 1
		for _, d := range c.xShape {
			n *= d
		}
		xr, xc := h.tensorPair(s, hostRandom(n, uint64(3*ci+1)), c.xShape...)
		n = 1
		for _, d := range c.yShape {
			n *= d
		}
		yr, yc := h.tensorPair(s, hostRandom(n, uint64(3*ci+2)), c.yShape...)
		if c.xView != nil {
			xr, xc = c.xView(xr), c.xView(xc)
		}
		n = 1
		for _, d := range c.shape {
			n *= d
		}
		out, _ := h.tensorPair(s, make([]float32, n), c.shape...)
		if err := k.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{xr, yr}, float32(1.5)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if (cx.fn == k.strided) != c.strided {
			t.Errorf("%s: launched %s", c.name, cx.fn.Name)
		}
		got := h.runOnHost(t, k.Source(), cx, []int{2})[0]
		want := tensor.Add(tensor.Scale(xc, 1.5), yc).Float32s()
		if e, ok := within(got, want, 0); !ok {
			t.Errorf("%s: the generated kernel differs from the CPU by %.3g", c.name, e)
		}
		if c.strided { // again in 64-bit index arithmetic (ember_small, argument 1, off)
			cx.args[1] = int32(0)
			got = h.runOnHost(t, k.Source(), cx, []int{2})[0]
			if e, ok := within(got, want, 0); !ok {
				t.Errorf("%s, 64-bit indices: the generated kernel differs from the CPU by %.3g", c.name, e)
			}
		}
	}
}

// TestFusedOnHost runs the generated forward and gradient programs of a
// fused expression with broadcast inputs against the CPU backend's
// interpreter of the same programs. The host's libm (expf, tanhf) and Go's
// math may differ in the last bit: 1e-6 of the largest value.
func TestFusedOnHost(t *testing.T) {
	haveClang(t)
	b, rec := newRecordingBackend(t)
	cx := &capturingExec{recExec: rec}
	b.x = cx
	x, bias, scale := tensor.Var("x"), tensor.Var("bias"), tensor.Var("scale")
	v := x.Add(bias)
	gelu := v.Scale(0.5).Mul(v.Add(v.Mul(v).Mul(v).Scale(0.044715)).Scale(0.7978845608).Tanh().AddConst(1))
	expr := gelu.Mul(scale.Sigmoid()).Sub(x.Exp().Div(scale.Square().AddConst(1))).Add(x.ReLU())
	f := tensor.MustFused(expr, "x", "bias", "scale")
	// The other operations: log, sqrt, reciprocal, sin, cos, neg.
	f2 := tensor.MustFused(x.Square().AddConst(1).Sqrt().Log().Add(bias.Square().AddConst(2).Reciprocal().Mul(scale.Sin())).Sub(x.Cos()).Neg(), "x", "bias", "scale")
	shape := []int{4, 3, 5}
	shapes := [][]int{{4, 3, 5}, {5}, {4, 1, 1}, {4, 3, 5}} // x, bias, scale, and the incoming gradient
	s := tensor.NewScope()
	defer s.Release()
	programs := []struct {
		name string
		p    *tensor.FusedProgram
	}{{"forward", f.Program()}, {"gradients of all inputs", f.GradientProgram([]bool{true, true, true})}, {"gradient of bias", f.GradientProgram([]bool{false, true, false})},
		{"second forward", f2.Program()}, {"second gradients", f2.GradientProgram([]bool{true, true, true})}}
	for _, pc := range programs {
		p := pc.p
		h := &hostMem{b: b}
		var viewsR, viewsC []tensor.View
		for i := range p.Inputs {
			n := 1
			for _, d := range shapes[i] {
				n *= d
			}
			r, c := h.tensorPair(s, hostRandom(n, uint64(10+i)), shapes[i]...)
			vr, err := tensor.BroadcastView(r, shape)
			if err != nil {
				t.Fatal(err)
			}
			vc, _ := tensor.BroadcastView(c, shape)
			viewsR, viewsC = append(viewsR, vr), append(viewsC, vc)
		}
		var dstR, dstC []tensor.Buffer
		var outIdx []int
		for range p.Outputs {
			r, c := h.tensorPair(s, make([]float32, 60), shape...)
			outIdx = append(outIdx, len(h.bases)-1)
			dstR, dstC = append(dstR, r.Buffer()), append(dstC, c.Buffer())
		}
		b.Fused(p, dstR, viewsR, shape)
		tensor.CPU.(tensor.FusedBackend).Fused(p, dstC, viewsC, shape)
		src := b.gen.fused[p.Key].Source()
		got := h.runOnHost(t, src, cx, outIdx)
		for j := range p.Outputs {
			want := downloadF(tensor.CPU, dstC[j])
			if e, ok := within(got[j], want, 1e-6); !ok {
				t.Errorf("%s, output %d: the generated kernel differs from the CPU by %.3g", pc.name, j, e)
			}
		}
	}
}
