package tensor

// FusedBackend is the optional interface of a backend that runs a whole
// pointwise expression as one pass over memory (the CUDA backend generates
// and compiles one kernel per program). Fused falls back to the composed
// Unary and Binary operations on a backend without it, which is correct but
// reads and writes memory once per node.
type FusedBackend interface {
	// Fused sets dst[j] (dense, of shape's element count) to the value of
	// prog's output j at every index of shape, reading input i through
	// in[i] (broadcast through zero strides).
	Fused(prog *FusedProgram, dst []Buffer, in []View, shape []int)
}

// FusedNodeKind says what a FusedNode computes.
type FusedNodeKind uint8

const (
	FusedInput  FusedNodeKind = iota // the element of input Input
	FusedConst                       // Value
	FusedUnary                       // Unary(Args[0]), with no parameters
	FusedBinary                      // Binary(Args[0], Args[1])
)

// FusedNode is one step of a FusedProgram: a value computed from earlier
// nodes only (Args index Nodes), so that a backend evaluates the nodes in
// order.
type FusedNode struct {
	Kind   FusedNodeKind
	Input  int
	Value  float32
	Unary  UnaryOp
	Binary BinaryOp
	Args   [2]int
}

// FusedProgram is a pointwise computation in straight-line form, each
// distinct subexpression once: what a backend compiles or interprets.
type FusedProgram struct {
	Inputs  []string    // input names, in the order of the views
	Nodes   []FusedNode // in evaluation order
	Outputs []int       // the node of each output
	// Key identifies the program's computation (not its input names), for
	// caches of compiled code.
	Key string
}
