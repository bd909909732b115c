package cuda

// Tests of the generated elementwise kernels that need no GPU: the spec's
// validation, Launch's checks, the kernels each launch picks (on the
// recording executor, which checks every launch against the generated
// kernel's C signature), the fused programs' launch counts, and the
// generated sources checked by clang's CUDA front end, which also stands in
// for NVRTC to exercise how compile errors are reported. The kernels' values
// are checked against the CPU on a GPU (ewk_gpu_test.go and the tensortest
// suites).

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// compileGenerated registers the kernels' signatures with the recorder and,
// where clang is installed, checks the source with it: a clang error comes
// back as an NVRTC compile error with clang's message as the log.
func (r *recExec) compileGenerated(src string, names []string) ([]*Function, error) {
	if msg, ok := clangCheck(r.t, src); !ok {
		return nil, &Error{Call: "nvrtcCompileProgram", Name: "NVRTC_ERROR_COMPILATION", Message: "options (clang in the tests)\n" + msg}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fns := make([]*Function, len(names))
	for i, name := range names {
		sig, ok := parseSignature(src, name)
		if !ok {
			return nil, &Error{Call: "cuModuleGetFunction", Name: "CUDA_ERROR_NOT_FOUND", Message: "no kernel " + name}
		}
		r.sigs[name] = sig
		fns[i] = &Function{Name: name}
	}
	return fns, nil
}

// parseSignature returns the parameters of the extern "C" kernel name in src.
func parseSignature(src, name string) ([]kernelParam, bool) {
	for _, m := range kernelDeclRE.FindAllStringSubmatch(src, -1) {
		if m[1] != name {
			continue
		}
		var ps []kernelParam
		for _, p := range strings.Split(m[2], ",") {
			p = strings.Join(strings.Fields(p), " ")
			i := strings.LastIndexAny(p, " *")
			typ := p[:i+1]
			kind := "int32"
			switch {
			case strings.Contains(typ, "*"):
				kind = "ptr"
			case strings.Contains(typ, "long long"):
				kind = "int64"
			case strings.Contains(typ, "float"):
				kind = "float32"
			}
			ps = append(ps, kernelParam{name: p[i+1:], kind: kind})
		}
		return ps, true
	}
	return nil, false
}

// clangCheck runs clang's CUDA front end on src as TestKernelsParseWithClang
// does (-Wall -Werror). It returns clang's output and false when src does
// not compile, true when it does or clang is not installed.
func clangCheck(t *testing.T, src string) (string, bool) {
	clang, err := exec.LookPath("clang++")
	if err != nil {
		return "", true
	}
	decls, err := filepath.Abs(filepath.Join("testdata", "cuda_decls.h"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "generated.cu")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(clang, "-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib",
		"--cuda-gpu-arch=sm_70", "-include", decls, "-Wall", "-Werror", "-fsyntax-only", file).CombinedOutput()
	return string(out), err == nil
}

func haveClang(t *testing.T) {
	if _, err := exec.LookPath("clang++"); err != nil {
		t.Skip("clang++ not installed")
	}
}

var axpySpec = ElementwiseSpec{Name: "axpy", Inputs: "x, y", Outputs: "out", Params: "float a", Body: "out = a * x + y;"}

func TestElementwiseSpecValidation(t *testing.T) {
	b, _ := newRecordingBackend(t)
	cases := []struct {
		spec ElementwiseSpec
		want string
	}{
		{ElementwiseSpec{Name: "k", Inputs: "x", Outputs: "out", Body: "out = x;"}, ""},
		{ElementwiseSpec{Name: "2k", Inputs: "x", Outputs: "out", Body: "out = x;"}, `kernel name "2k" is not a C identifier`},
		{ElementwiseSpec{Name: "k", Inputs: "x, x", Outputs: "out", Body: "out = x;"}, `input "x" is also input`},
		{ElementwiseSpec{Name: "k", Inputs: "x", Outputs: "x", Body: "x = 1;"}, `output "x" is also input`},
		{ElementwiseSpec{Name: "k", Inputs: "x", Outputs: "out", Params: "float x", Body: "out = x;"}, `parameter "x" is also input`},
		{ElementwiseSpec{Name: "k", Inputs: "x,", Outputs: "out", Body: "out = x;"}, `Inputs "x,": an empty name`},
		{ElementwiseSpec{Name: "k", Inputs: "float", Outputs: "out", Body: "out = 1;"}, `input "float" is a C++ keyword`},
		{ElementwiseSpec{Name: "k", Inputs: "threadIdx", Outputs: "out", Body: "out = 1;"}, `CUDA built-in`},
		{ElementwiseSpec{Name: "k", Inputs: "ember_n", Outputs: "out", Body: "out = 1;"}, `names starting with ember_`},
		{ElementwiseSpec{Name: "k", Inputs: "a__b", Outputs: "out", Body: "out = 1;"}, `double underscore`},
		{ElementwiseSpec{Name: "k", Inputs: "x", Outputs: "", Body: "x;"}, `no Outputs`},
		{ElementwiseSpec{Name: "k", Inputs: "x", Outputs: "out, out2", Body: "out = x;"}, `output "out2" is not assigned`},
		{ElementwiseSpec{Name: "k", Inputs: "x", Outputs: "out", Params: "double a", Body: "out = x;"}, `want "float name" or "int name"`},
		{ElementwiseSpec{Name: "k", Inputs: "a,b,c,d,e,f,g,h", Outputs: "out", Body: "out = a;"}, `more than 64`},
	}
	for _, c := range cases {
		_, err := NewElementwiseKernel(b, c.spec)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.spec, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v; want one containing %q", c.spec, err, c.want)
		}
	}
}

// A body that does not compile is reported with the compiler's first error
// line, which names the body and the line in it.
func TestElementwiseCompileErrorNamesTheLine(t *testing.T) {
	// The form of NVRTC's log, with the #line directive of the body.
	var err error = &Error{Call: "nvrtcCompileProgram", Name: "NVRTC_ERROR_COMPILATION",
		Message: "options --fmad=false --gpu-architecture=sm_90\naxpy body(2): error: identifier \"z\" is undefined\n\n1 error detected in the compilation of \"ember_kernel.cu\"."}
	if line, ok := compileErrorLine(err); !ok || line != `axpy body(2): error: identifier "z" is undefined` {
		t.Errorf("compileErrorLine = %q, %v", line, ok)
	}
	if _, ok := compileErrorLine(errors.New("no compiler")); ok {
		t.Errorf("compileErrorLine of a non-NVRTC error found a line")
	}
	haveClang(t)
	b, _ := newRecordingBackend(t)
	spec := axpySpec
	spec.Body = "float u = a * x;\nout = u + z;"
	_, err = NewElementwiseKernel(b, spec)
	if err == nil || !strings.Contains(err.Error(), `axpy body:2`) || !strings.Contains(err.Error(), "'z'") {
		t.Errorf("a body using an undeclared z: error %v; want one naming axpy body line 2 and z", err)
	}
}

func TestElementwiseKernelLaunches(t *testing.T) {
	b, rec := newRecordingBackend(t)
	k, err := NewElementwiseKernel(b, axpySpec)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := clangCheck(t, k.Source()); !ok {
		t.Fatalf("generated source does not compile:\n%s", k.Source())
	}
	s := tensor.NewScope()
	defer s.Release()
	x, y, out := tensor.Zeros(b, s, 3, 4, 5), tensor.Zeros(b, s, 3, 4, 5), tensor.Empty(b, s, 3, 4, 5)
	cases := []struct {
		name   string
		x, y   *tensor.Tensor
		kernel string
	}{
		{"dense", x, y, k.dense.Name},
		{"in place", out, y, k.dense.Name},
		{"broadcast row", x, tensor.Zeros(b, s, 4, 1), k.strided.Name},
		{"scalar", tensor.Zeros(b, s, 1), y, k.strided.Name},
		{"transposed", tensor.Zeros(b, s, 3, 5, 4).Transpose(1, 2), y, k.strided.Name},
	}
	for _, c := range cases {
		rec.reset()
		if err := k.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{c.x, c.y}, float32(2)); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if rec.launches[c.kernel] != 1 || rec.kernelLaunches() != 1 {
			t.Errorf("%s: launches %v; want one of %s", c.name, rec.launches, c.kernel)
		}
	}
	// Apply allocates the output in the inputs' broadcast shape and scope.
	rec.reset()
	res, err := k.Apply([]*tensor.Tensor{tensor.Zeros(b, s, 4, 1), tensor.Zeros(b, s, 3, 1, 5)}, float32(2))
	if err != nil || len(res) != 1 || !slices.Equal(res[0].Shape(), []int{3, 4, 5}) || res[0].Scope() != s || rec.launches[k.strided.Name] != 1 {
		t.Errorf("Apply: %v, %v", res, err)
	}
	if _, err := k.Apply([]*tensor.Tensor{tensor.Zeros(b, s, 4), tensor.Zeros(b, s, 5)}, float32(2)); err == nil || !strings.Contains(err.Error(), "input y: shapes [4] and [5] do not broadcast") {
		t.Errorf("Apply of [4] and [5]: %v", err)
	}
	// A 6-D broadcast that merges to no fewer dimensions still fits.
	x6 := tensor.Zeros(b, s, 2, 1, 2, 1, 2, 1)
	y6 := tensor.Zeros(b, s, 1, 3, 1, 3, 1, 3)
	if err := k.Launch([]*tensor.Tensor{tensor.Empty(b, s, 2, 3, 2, 3, 2, 3)}, []*tensor.Tensor{x6, y6}, 1.5); err != nil {
		t.Errorf("6-D broadcast: %v", err)
	}
}

func TestElementwiseLaunchErrors(t *testing.T) {
	b, _ := newRecordingBackend(t)
	k, err := NewElementwiseKernel(b, ElementwiseSpec{Name: "shift", Inputs: "x", Outputs: "out", Params: "float a, int k", Body: "out = x * a + k;"})
	if err != nil {
		t.Fatal(err)
	}
	s := tensor.NewScope()
	defer s.Release()
	x, out := tensor.Zeros(b, s, 4, 6), tensor.Empty(b, s, 4, 6)
	outs, ins := []*tensor.Tensor{out}, []*tensor.Tensor{x}
	cases := []struct {
		name      string
		outs, ins []*tensor.Tensor
		params    []any
		want      string
	}{
		{"ok", outs, ins, []any{float32(1), int32(2)}, ""},
		{"Go int and float64", outs, ins, []any{1.0, 2}, ""},
		{"missing parameter", outs, ins, []any{float32(1)}, "1 outputs, 1 inputs and 1 parameters given; it takes 1 (out), 1 (x) and 2"},
		{"int for a float", outs, ins, []any{int32(1), int32(2)}, "parameter a is float, given a int32"},
		{"float for an int", outs, ins, []any{float32(1), float32(2)}, "parameter k is int, given a float32"},
		{"string", outs, ins, []any{"1", int32(2)}, "parameter a is a string"},
		{"int too large", outs, ins, []any{float32(1), 1 << 40}, "does not fit an int"},
		{"input does not broadcast", outs, []*tensor.Tensor{tensor.Zeros(b, s, 5)}, []any{float32(1), int32(2)}, "input x: tensor: shape [5] does not broadcast to [4 6]"},
		{"input larger than the output", outs, []*tensor.Tensor{tensor.Zeros(b, s, 2, 4, 6)}, []any{float32(1), int32(2)}, "does not broadcast to [4 6]"},
		{"strided output", []*tensor.Tensor{tensor.Empty(b, s, 6, 4).Transpose(0, 1)}, ins, []any{float32(1), int32(2)}, "output out is [4 6] (contiguous false)"},
		{"int32 input", outs, []*tensor.Tensor{tensor.FromInt32(b, s, make([]int32, 24), 4, 6)}, []any{float32(1), int32(2)}, "input x is int32, want float32"},
		{"CPU input", outs, []*tensor.Tensor{tensor.Zeros(tensor.CPU, s, 4, 6)}, []any{float32(1), int32(2)}, "input x is on cpu, the kernel on cuda:rec"},
		{"nil output", []*tensor.Tensor{nil}, ins, []any{float32(1), int32(2)}, "output out is nil"},
		{"7-D after merging", []*tensor.Tensor{tensor.Empty(b, s, 2, 3, 2, 3, 2, 3, 2)}, []*tensor.Tensor{tensor.Zeros(b, s, 2, 1, 2, 1, 2, 1, 2)}, []any{float32(1), int32(2)}, "7 dimensions after merging; the kernel takes at most 6"},
	}
	for _, c := range cases {
		err := k.Launch(c.outs, c.ins, c.params...)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v; want one containing %q", c.name, err, c.want)
		}
	}
}

// Fused expressions on the recorder: the forward pass is one generated
// launch, the backward pass one more (all input gradients together) plus
// the reductions that sum a broadcast input's gradient back to its shape,
// and no composed elementwise kernel runs.
func TestFusedOnRecorder(t *testing.T) {
	b, rec := newRecordingBackend(t)
	x, bias := tensor.Var("x"), tensor.Var("bias")
	v := x.Add(bias)
	gelu := v.Scale(0.5).Mul(v.Add(v.Mul(v).Mul(v).Scale(0.044715)).Scale(0.7978845608).Tanh().AddConst(1))
	f := tensor.MustFused(gelu, "x", "bias")
	s := tensor.NewScope()
	defer s.Release()
	xt := tensor.Zeros(b, s, 8, 16).SetRequiresGrad(true)
	bt := tensor.Zeros(b, s, 16).SetRequiresGrad(true)
	rec.reset()
	out := f.Apply(xt, bt)
	fwd := rec.kernelLaunches()
	k := b.gen.fused[f.Program().Key]
	if k == nil || fwd != 1 || rec.launches[k.strided.Name] != 1 {
		t.Fatalf("forward: launches %v; want one strided launch of the fused kernel", rec.launches)
	}
	if _, ok := clangCheck(t, k.Source()); !ok {
		t.Errorf("forward source does not compile:\n%s", k.Source())
	}
	rec.reset()
	tensor.Sum(out).Backward()
	gk := b.gen.fused[f.GradientProgram([]bool{true, true}).Key]
	if gk == nil || rec.launches[gk.strided.Name] != 1 {
		t.Fatalf("backward: launches %v; want one of the gradient kernel", rec.launches)
	}
	for name, n := range rec.launches {
		if strings.HasPrefix(name, "ember_unary") || strings.HasPrefix(name, "ember_binary") {
			t.Errorf("backward launched %d of the composed kernel %s", n, name)
		}
	}
	if xt.Grad() == nil || bt.Grad() == nil || !slices.Equal(bt.Grad().Shape(), []int{16}) {
		t.Errorf("gradients missing or of the wrong shape")
	}
	// The gradient program of x + y uses neither input: it must still
	// compile without warnings (clang -Wall -Werror in the recorder).
	sum := tensor.MustFused(x.Add(bias), "x", "bias")
	tensor.Sum(sum.Apply(xt, bt)).Backward()
	// The same program again compiles nothing new.
	mods := len(b.gen.fused)
	f.Apply(xt, bt)
	if len(b.gen.fused) != mods {
		t.Errorf("a second Apply generated another kernel")
	}
}

// Every operation a FusedProgram may hold has a generated form, so that an
// operation added to tensor's expressions cannot reach this backend
// without one (fusedNodeC panics on an unknown op).
func TestFusedOpsHaveGeneratedForms(t *testing.T) {
	for _, op := range tensor.FusedUnaryOps() {
		if c := fusedNodeC(tensor.FusedNode{Kind: tensor.FusedUnary, Unary: op}); c == "" {
			t.Errorf("unary op %d: empty C", op)
		}
	}
	for _, op := range tensor.FusedBinaryOps() {
		if c := fusedNodeC(tensor.FusedNode{Kind: tensor.FusedBinary, Binary: op, Args: [2]int{0, 1}}); c == "" {
			t.Errorf("binary op %d: empty C", op)
		}
	}
}
