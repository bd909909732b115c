package cuda

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/ember-ml/ember/tensor"
)

// Generated elementwise kernels, the counterpart of PyCUDA's
// ElementwiseKernel: a C body over named float32 inputs, outputs and scalar
// parameters becomes one extern "C" kernel pair (a dense one, for operands
// of the outputs' own layout, and a strided one, which reads each input
// through its strides, broadcasting by zero strides, up to six dimensions
// after merging), compiled by NVRTC for the backend's device and cached on
// disk (Device.Compile), launched on the backend's stream so that it is
// ordered with the other operations and captured into graphs.

// ElementwiseSpec is the text of an elementwise kernel. Lists are comma
// separated; names are C identifiers, distinct, not starting with ember_
// (the generated code's own prefix) and not C++ keywords.
type ElementwiseSpec struct {
	// Name names the kernel in its source and in errors (an identifier).
	Name string
	// Inputs are the float32 tensors read, e.g. "x, y"; in Body each name
	// is the input's element (a const float).
	Inputs string
	// Outputs are the float32 tensors written, e.g. "out"; in Body each
	// name is a float the body assigns, stored after it.
	Outputs string
	// Params are scalar parameters, each "float name" or "int name", e.g.
	// "float a".
	Params string
	// Body is C statements computing the outputs for one element, e.g.
	// "out = a * x + y;".
	Body string
	// Preamble is C placed before the kernels: __device__ helper functions
	// the body calls.
	Preamble string
}

// ElementwiseKernel is a compiled ElementwiseSpec; Launch runs it.
type ElementwiseKernel struct {
	b               *Backend
	name            string
	inputs, outputs []string
	params          []ewkParam
	src             string
	dense, strided  *Function
}

type ewkParam struct{ typ, name string }

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// cKeywords are names a spec may not use: C++ keywords and the CUDA
// built-ins a body could otherwise shadow.
var cKeywords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`auto bool break case char class const constexpr continue default delete do double
		else enum extern false float for goto if inline int long namespace new operator private protected public
		register return short signed sizeof static struct switch template this true typedef typename union unsigned
		using virtual void volatile while threadIdx blockIdx blockDim gridDim warpSize`) {
		cKeywords[w] = true
	}
}

// parseNames splits a comma-separated list of identifiers.
func parseNames(what, list string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			if strings.TrimSpace(list) == "" {
				break
			}
			return nil, fmt.Errorf("%s %q: an empty name", what, list)
		}
		out = append(out, f)
	}
	return out, nil
}

func checkName(what, name string) error {
	switch {
	case !identRE.MatchString(name):
		return fmt.Errorf("%s %q is not a C identifier", what, name)
	case strings.HasPrefix(name, "ember_"):
		return fmt.Errorf("%s %q: names starting with ember_ are the generated code's", what, name)
	case strings.Contains(name, "__"):
		return fmt.Errorf("%s %q: names with a double underscore are reserved in C++", what, name)
	case cKeywords[name]:
		return fmt.Errorf("%s %q is a C++ keyword or CUDA built-in", what, name)
	}
	return nil
}

// ewkMaxParams is the most parameters the strided kernel may have: the
// most Function.Launch passes (per input a pointer and six strides).
const ewkMaxParams = maxKernelParams

// parseSpec checks spec and returns its parts.
func parseSpec(spec ElementwiseSpec) (name string, ins, outs []string, params []ewkParam, err error) {
	name = spec.Name
	if err = checkName("kernel name", name); err != nil {
		return
	}
	if ins, err = parseNames("Inputs", spec.Inputs); err != nil {
		return
	}
	if outs, err = parseNames("Outputs", spec.Outputs); err != nil {
		return
	}
	if len(outs) == 0 {
		err = fmt.Errorf("no Outputs (want e.g. \"out\")")
		return
	}
	fields, err := parseNames("Params", spec.Params)
	if err != nil {
		return
	}
	for _, f := range fields {
		typ, pname, ok := strings.Cut(f, " ")
		pname = strings.TrimSpace(pname)
		if !ok || (typ != "float" && typ != "int") {
			err = fmt.Errorf("parameter %q of Params: want \"float name\" or \"int name\"", f)
			return
		}
		params = append(params, ewkParam{typ, pname})
	}
	seen := map[string]string{}
	check := func(what, n string) error {
		if err := checkName(what, n); err != nil {
			return err
		}
		if prev, dup := seen[n]; dup {
			return fmt.Errorf("%s %q is also %s", what, n, prev)
		}
		seen[n] = what
		return nil
	}
	for _, n := range ins {
		if err = check("input", n); err != nil {
			return
		}
	}
	for _, n := range outs {
		if err = check("output", n); err != nil {
			return
		}
		if !regexp.MustCompile(`\b` + n + `\b`).MatchString(spec.Body) {
			err = fmt.Errorf("output %q is not assigned by the body %q", n, spec.Body)
			return
		}
	}
	for _, p := range params {
		if err = check("parameter", p.name); err != nil {
			return
		}
	}
	// The strided kernel's parameters: n, small, rank, the pointers, the
	// scalars, six sizes, six strides per input.
	if k := 3 + len(outs) + len(ins) + len(params) + 6 + 6*len(ins); k > ewkMaxParams {
		err = fmt.Errorf("%d inputs, %d outputs and %d parameters need %d kernel parameters, more than %d", len(ins), len(outs), len(params), k, ewkMaxParams)
	}
	return
}

// NewElementwiseKernel generates, compiles and loads the kernels of spec on
// b's device. An error in the body or preamble comes back naming the first
// error line of NVRTC's log (the body is compiled as the file "<Name>
// body", so that its line numbers are the body's own).
func NewElementwiseKernel(b *Backend, spec ElementwiseSpec) (*ElementwiseKernel, error) {
	name, ins, outs, params, err := parseSpec(spec)
	if err != nil {
		return nil, fmt.Errorf("cuda: NewElementwiseKernel: %w", err)
	}
	k := &ElementwiseKernel{b: b, name: name, inputs: ins, outputs: outs, params: params}
	var kname string
	k.src, kname = ewkSource(name, ins, outs, params, spec.Body, spec.Preamble)
	fns, err := b.compileGenerated(k.src, kname+"_dense", kname+"_strided")
	if err != nil {
		if line, ok := compileErrorLine(err); ok {
			return nil, fmt.Errorf("cuda: elementwise kernel %q does not compile: %s", name, line)
		}
		return nil, fmt.Errorf("cuda: elementwise kernel %q: %w", name, err)
	}
	k.dense, k.strided = fns[0], fns[1]
	return k, nil
}

// Source is the generated CUDA source.
func (k *ElementwiseKernel) Source() string { return k.src }

// compileErrorLine is the first error line of a compile error's log.
func compileErrorLine(err error) (string, bool) {
	var e *Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Call, "nvrtc") {
		return "", false
	}
	for _, l := range strings.Split(e.Message, "\n") {
		if strings.Contains(l, "error") && !strings.HasPrefix(l, "options ") {
			return strings.TrimSpace(l), true
		}
	}
	return "", false
}

// ewkSource generates the two kernels and returns the source and the
// kernels' common name prefix, which carries a hash of the source text so
// that two specs of one Name do not clash (in a recorder's table, say).
func ewkSource(name string, ins, outs []string, params []ewkParam, body, preamble string) (string, string) {
	h := fnv.New64a()
	for _, s := range [][]string{ins, outs, {body, preamble}} {
		h.Write([]byte(strings.Join(s, ",") + ";"))
	}
	for _, p := range params {
		h.Write([]byte(p.typ + " " + p.name + ";"))
	}
	kname := fmt.Sprintf("ember_ewk_%s_%012x", name, h.Sum64()&(1<<48-1))

	var src strings.Builder
	line := 1
	w := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		src.WriteString(s)
		line += strings.Count(s, "\n")
	}
	w("// Code generated by cuda.NewElementwiseKernel for %q. DO NOT EDIT.\n", name)
	if preamble != "" {
		w("#line 1 \"%s preamble\"\n%s\n", name, preamble)
		w("#line %d \"%s generated\"\n", line+1, name)
	}
	var sig []string
	for j := range outs {
		sig = append(sig, fmt.Sprintf("float* ember_out%d", j))
	}
	for i := range ins {
		sig = append(sig, fmt.Sprintf("const float* ember_in%d", i))
	}
	for _, p := range params {
		sig = append(sig, p.typ+" "+p.name)
	}
	element := func(index func(i int) string) {
		for i, n := range ins {
			// (void): a body need not use every input (the gradient of
			// x + y uses neither), which must not warn.
			w("        const float %s = ember_in%d[%s];\n        (void)%s;\n", n, i, index(i), n)
		}
		for _, n := range outs {
			w("        float %s = 0.0f;\n", n)
		}
		w("        {\n#line 1 \"%s body\"\n%s\n", name, body)
		w("#line %d \"%s generated\"\n", line+1, name)
		w("        }\n")
		for j, n := range outs {
			w("        ember_out%d[ember_i] = %s;\n", j, n)
		}
	}
	const loop = "    for (long long ember_i = (long long)blockIdx.x * blockDim.x + threadIdx.x; ember_i < ember_n;\n" +
		"         ember_i += (long long)gridDim.x * blockDim.x) {\n"

	// Dense: every operand has the outputs' layout.
	w("\nextern \"C\" __global__ void %s_dense(long long ember_n, %s) {\n", kname, strings.Join(sig, ", "))
	w(loop)
	element(func(int) string { return "ember_i" })
	w("    }\n}\n")

	// Strided: the index is split into the rank real coordinates of the
	// six (padded on the left with sizes of 1; the innermost last), in
	// 32-bit arithmetic when ember_small (n < 2^32), and each input's offset
	// is the sum of coordinates times its strides. What remains after
	// dimension 1 is the coordinate of dimension 0 (0 when rank < 6: every
	// real dimension has been split off).
	var dims, strides []string
	for d := range 6 {
		dims = append(dims, fmt.Sprintf("long long ember_d%d", d))
	}
	for i := range ins {
		for d := range 6 {
			strides = append(strides, fmt.Sprintf("long long ember_s%d_%d", i, d))
		}
	}
	all := append(append(append([]string{"long long ember_n", "int ember_small", "int ember_rank"}, sig...), dims...), strides...)
	w("\nextern \"C\" __global__ void %s_strided(%s) {\n", kname, strings.Join(all, ", "))
	w(loop)
	for i := range ins {
		w("        long long ember_o%d = 0;\n", i)
	}
	split := func(typ string) {
		w("            %s ember_r = (%s)ember_i, ember_c;\n", typ, typ)
		for d := 5; d >= 1; d-- {
			// Dimension d is real when rank >= 6-d; the padding's sizes
			// of 1 would divide for nothing (the branch is uniform).
			w("            if (ember_rank >= %d) {\n", 6-d)
			w("                ember_c = ember_r %% (%s)ember_d%d;\n                ember_r /= (%s)ember_d%d;\n", typ, d, typ, d)
			for i := range ins {
				w("                ember_o%d += (long long)ember_c * ember_s%d_%d;\n", i, i, d)
			}
			w("            }\n")
		}
		for i := range ins {
			w("            ember_o%d += (long long)ember_r * ember_s%d_0;\n", i, i)
		}
	}
	w("        if (ember_small) {\n")
	split("unsigned int")
	w("        } else {\n")
	split("long long")
	w("        }\n")
	element(func(i int) string { return fmt.Sprintf("ember_o%d", i) })
	w("    }\n}\n")
	return src.String(), kname
}

// generatedCompiler is implemented by an executor that compiles generated
// kernels itself (the tests' recorder, which has no device).
type generatedCompiler interface {
	compileGenerated(src string, names []string) ([]*Function, error)
}

// generated holds a backend's generated modules (unloaded by Close) and the
// kernels of its fused programs, by program key.
type generated struct {
	mu    sync.Mutex
	mods  []*Module
	fused map[string]*ElementwiseKernel
}

func (g *generated) unload() []error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for _, m := range g.mods {
		errs = append(errs, m.Unload())
	}
	g.mods, g.fused = nil, nil
	return errs
}

// compileGenerated compiles src with the backend's kernel options and
// returns the named kernels.
func (b *Backend) compileGenerated(src string, names ...string) ([]*Function, error) {
	if c, ok := b.x.(generatedCompiler); ok {
		return c.compileGenerated(src, names)
	}
	if b.closed.Load() || b.dev == nil {
		return nil, ErrClosed
	}
	m, err := b.dev.Compile(src, kernelOptions...)
	if err != nil {
		return nil, err
	}
	fns := make([]*Function, len(names))
	for i, n := range names {
		if fns[i], err = m.Function(n); err != nil {
			m.Unload()
			return nil, err
		}
	}
	b.gen.mu.Lock()
	b.gen.mods = append(b.gen.mods, m)
	b.gen.mu.Unlock()
	return fns, nil
}

// Launch runs the kernel over the elements of the outputs, which must be
// contiguous float32 tensors of one shape on k's backend; each input must
// broadcast to that shape (any layout: transposed and sliced views are read
// through their strides). params are the scalars in the order of Params: a
// float32 or float64 for a float, an int32 or int for an int. An output
// may be an input of the same layout (in place); an output that overlaps
// an input otherwise gives undefined results. The work is queued on the
// backend's stream; Launch does not wait for it.
func (k *ElementwiseKernel) Launch(outs, ins []*tensor.Tensor, params ...any) error {
	if len(outs) != len(k.outputs) || len(ins) != len(k.inputs) || len(params) != len(k.params) {
		return fmt.Errorf("cuda: elementwise kernel %q: %d outputs, %d inputs and %d parameters given; it takes %d (%s), %d (%s) and %d",
			k.name, len(outs), len(ins), len(params), len(k.outputs), strings.Join(k.outputs, ", "), len(k.inputs), strings.Join(k.inputs, ", "), len(k.params))
	}
	var shape []int
	dst := make([]tensor.Buffer, len(outs))
	check := func(what, name string, t *tensor.Tensor) error {
		switch {
		case t == nil:
			return fmt.Errorf("cuda: elementwise kernel %q: %s %s is nil", k.name, what, name)
		case t.Backend() != tensor.Backend(k.b):
			return fmt.Errorf("cuda: elementwise kernel %q: %s %s is on %s, the kernel on %s", k.name, what, name, t.Backend().Name(), k.b.Name())
		case t.DType() != tensor.Float32:
			return fmt.Errorf("cuda: elementwise kernel %q: %s %s is %v, want float32", k.name, what, name, t.DType())
		case t.Released():
			return fmt.Errorf("cuda: elementwise kernel %q: %s %s was released", k.name, what, name)
		}
		return nil
	}
	for j, t := range outs {
		if err := check("output", k.outputs[j], t); err != nil {
			return err
		}
		if j == 0 {
			shape = t.Shape()
		}
		if !slices.Equal(t.Shape(), shape) || !t.IsContiguous() {
			return fmt.Errorf("cuda: elementwise kernel %q: output %s is %v (contiguous %v); want a contiguous tensor of shape %v, as %s", k.name, k.outputs[j], t.Shape(), t.IsContiguous(), shape, k.outputs[0])
		}
		dst[j] = t.Buffer()
	}
	views := make([]tensor.View, len(ins))
	for i, t := range ins {
		if err := check("input", k.inputs[i], t); err != nil {
			return err
		}
		v, err := tensor.BroadcastView(t, shape)
		if err != nil {
			return fmt.Errorf("cuda: elementwise kernel %q: input %s: %w", k.name, k.inputs[i], err)
		}
		views[i] = v
	}
	allStrides := [][]int{tensorStrides(shape)}
	for _, v := range views {
		allStrides = append(allStrides, v.Strides)
	}
	if merged, _ := mergeOperands(shape, allStrides); len(merged) > maxStridedRank {
		return fmt.Errorf("cuda: elementwise kernel %q: shape %v with these input layouts has %d dimensions after merging; the kernel takes at most %d", k.name, shape, len(merged), maxStridedRank)
	}
	args := make([]any, len(params))
	for i, p := range params {
		want := k.params[i]
		switch v := p.(type) {
		case float32:
			args[i] = v
		case float64:
			args[i] = float32(v)
		case int32:
			args[i] = v
		case int:
			if v < math.MinInt32 || v > math.MaxInt32 {
				return fmt.Errorf("cuda: elementwise kernel %q: parameter %s = %d does not fit an int", k.name, want.name, v)
			}
			args[i] = int32(v)
		default:
			return fmt.Errorf("cuda: elementwise kernel %q: parameter %s is a %T; want a number", k.name, want.name, p)
		}
		_, isFloat := args[i].(float32)
		if isFloat != (want.typ == "float") {
			return fmt.Errorf("cuda: elementwise kernel %q: parameter %s is %s, given a %T", k.name, want.name, want.typ, p)
		}
	}
	return tensor.Guard(func() { k.launch(dst, views, shape, args) })
}

// Apply is Launch into new outputs of the inputs' broadcast shape, in the
// scope of the first scoped input (as tensor operations place their
// results).
func (k *ElementwiseKernel) Apply(ins []*tensor.Tensor, params ...any) ([]*tensor.Tensor, error) {
	if len(ins) != len(k.inputs) {
		return nil, fmt.Errorf("cuda: elementwise kernel %q: %d inputs given; it takes %d (%s)", k.name, len(ins), len(k.inputs), strings.Join(k.inputs, ", "))
	}
	var shape []int
	var scope *tensor.Scope
	for i, t := range ins {
		if t == nil {
			return nil, fmt.Errorf("cuda: elementwise kernel %q: input %s is nil", k.name, k.inputs[i])
		}
		s, err := tensor.BroadcastShape(shape, t.Shape())
		if err != nil {
			return nil, fmt.Errorf("cuda: elementwise kernel %q: input %s: %w", k.name, k.inputs[i], err)
		}
		shape = s
		if scope == nil {
			scope = t.Scope()
		}
	}
	outs := make([]*tensor.Tensor, len(k.outputs))
	var err error
	if gerr := tensor.Guard(func() {
		for j := range outs {
			outs[j] = tensor.Empty(k.b, scope, shape...)
		}
	}); gerr != nil {
		err = gerr
	} else {
		err = k.Launch(outs, ins, params...)
	}
	if err != nil {
		for _, o := range outs {
			if o != nil {
				o.Release()
			}
		}
		return nil, err
	}
	return outs, nil
}

// launch queues the kernel: dense where every input has the outputs'
// layout after merging dimensions, else strided.
func (k *ElementwiseKernel) launch(dst []tensor.Buffer, in []tensor.View, shape []int, params []any) {
	op := "elementwise kernel " + k.name
	n := elementCount(op, shape)
	ptrs := make([]any, 0, len(dst)+len(in))
	for _, d := range dst {
		need(op, "output", d, n)
		ptrs = append(ptrs, k.b.f32(op, d))
	}
	allStrides := [][]int{tensorStrides(shape)}
	for _, v := range in {
		ptrs = append(ptrs, k.b.viewPtr(op, "input", v, shape, n))
		allStrides = append(allStrides, v.Strides)
	}
	if n == 0 {
		return
	}
	o := strided(op, shape, allStrides...)
	dense := o.rank == 1
	for _, t := range o.strides {
		dense = dense && t[maxStridedRank-1] == 1
	}
	if dense {
		args := append(append([]any{int64(n)}, ptrs...), params...)
		k.b.launch(op, k.dense, n, args...)
		return
	}
	args := append(append([]any{int64(n), flag(n <= math.MaxUint32), int32(o.rank)}, ptrs...), params...)
	for _, d := range o.shape {
		args = append(args, d)
	}
	for _, t := range o.strides[1:] {
		for _, s := range t {
			args = append(args, s)
		}
	}
	k.b.launch(op, k.strided, n, args...)
}
