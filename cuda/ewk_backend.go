package cuda

import (
	"fmt"
	"math"
	"strings"

	"github.com/ember-ml/ember/tensor"
)

// The CUDA backend's tensor.FusedBackend: a FusedProgram becomes the body
// of a generated elementwise kernel (ewk.go), one statement per node, with
// the scalar functions of kernels/strided.cu so that a fused expression
// computes what its composed operations compute. Each program is compiled
// once per backend (and cached on disk across runs by Device.Compile).

var _ tensor.FusedBackend = (*Backend)(nil)

// Fused runs p as one kernel launch.
func (b *Backend) Fused(p *tensor.FusedProgram, dst []tensor.Buffer, in []tensor.View, shape []int) {
	if len(dst) != len(p.Outputs) || len(in) != len(p.Inputs) {
		panic(fmt.Sprintf("cuda: fused: %d outputs and %d inputs for a program of %d and %d", len(dst), len(in), len(p.Outputs), len(p.Inputs)))
	}
	b.fusedKernel(p).launch(dst, in, shape, nil)
}

// fusedKernel returns p's kernel, generating and compiling it on first use.
func (b *Backend) fusedKernel(p *tensor.FusedProgram) *ElementwiseKernel {
	b.gen.mu.Lock()
	k := b.gen.fused[p.Key]
	b.gen.mu.Unlock()
	if k != nil {
		return k
	}
	k, err := NewElementwiseKernel(b, fusedSpec(p))
	if err != nil {
		panic(&tensor.Error{Op: "cuda: fused", Err: err})
	}
	b.gen.mu.Lock()
	if b.gen.fused == nil {
		b.gen.fused = map[string]*ElementwiseKernel{}
	}
	b.gen.fused[p.Key] = k
	b.gen.mu.Unlock()
	return k
}

// fusedSpec is p as an ElementwiseSpec: inputs in0, in1, ..., outputs out0,
// ..., and a body of one const float per node.
func fusedSpec(p *tensor.FusedProgram) ElementwiseSpec {
	ins := make([]string, len(p.Inputs))
	for i := range ins {
		ins[i] = fmt.Sprintf("in%d", i)
	}
	outs := make([]string, len(p.Outputs))
	for j := range outs {
		outs[j] = fmt.Sprintf("out%d", j)
	}
	var body strings.Builder
	for i, nd := range p.Nodes {
		fmt.Fprintf(&body, "const float t%d = %s;\n", i, fusedNodeC(nd))
	}
	for j, o := range p.Outputs {
		fmt.Fprintf(&body, "out%d = t%d;\n", j, o)
	}
	return ElementwiseSpec{Name: "fused", Inputs: strings.Join(ins, ", "), Outputs: strings.Join(outs, ", "), Body: body.String(), Preamble: fusedPreamble}
}

// fusedPreamble holds the functions whose CPU form is more than one C
// operator, written as in kernels/strided.cu.
const fusedPreamble = `__device__ __forceinline__ float ember_fused_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float ember_fused_relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }`

// fusedNodeC is the C expression of one node.
func fusedNodeC(nd tensor.FusedNode) string {
	a, c := fmt.Sprintf("t%d", nd.Args[0]), fmt.Sprintf("t%d", nd.Args[1])
	switch nd.Kind {
	case tensor.FusedInput:
		return fmt.Sprintf("in%d", nd.Input)
	case tensor.FusedConst:
		// The exact bits, whatever the value (NaN and infinities too).
		return fmt.Sprintf("__int_as_float((int)0x%08xu)", math.Float32bits(nd.Value))
	case tensor.FusedUnary:
		switch nd.Unary {
		case tensor.OpNeg:
			return "-" + a
		case tensor.OpExp:
			return "expf(" + a + ")"
		case tensor.OpLog:
			return "logf(" + a + ")"
		case tensor.OpSqrt:
			return "sqrtf(" + a + ")"
		case tensor.OpSquare:
			return a + " * " + a
		case tensor.OpRecip:
			return "1.0f / " + a
		case tensor.OpTanh:
			return "tanhf(" + a + ")"
		case tensor.OpSigmoid:
			return "ember_fused_sigmoid(" + a + ")"
		case tensor.OpSin:
			return "sinf(" + a + ")"
		case tensor.OpCos:
			return "cosf(" + a + ")"
		case tensor.OpReLU:
			return "ember_fused_relu(" + a + ")"
		}
		panic(fmt.Sprintf("cuda: fused: unary op %d has no generated form", nd.Unary))
	case tensor.FusedBinary:
		switch nd.Binary {
		case tensor.OpAdd:
			return a + " + " + c
		case tensor.OpSub:
			return a + " - " + c
		case tensor.OpMul:
			return a + " * " + c
		case tensor.OpDiv:
			return a + " / " + c
		case tensor.OpGt:
			return "(" + a + " > " + c + ") ? 1.0f : 0.0f"
		}
		panic(fmt.Sprintf("cuda: fused: binary op %d has no generated form", nd.Binary))
	}
	panic(fmt.Sprintf("cuda: fused: node kind %d", nd.Kind))
}
