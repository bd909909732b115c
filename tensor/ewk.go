package tensor

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Fused pointwise expressions: a chain of elementwise operations written as
// an expression over named inputs, run as one pass over memory where the
// backend can (FusedBackend: on CUDA one generated kernel) instead of one
// pass per operation, with its gradient derived symbolically (reverse mode
// over the expression) and run the same way: one pass computing the
// gradients of all inputs together.

// Expr is a pointwise expression over named float32 inputs, built with Var,
// Const and the methods below. An Expr is immutable and may be shared
// between expressions (a shared subexpression is computed once).
type Expr struct {
	kind   FusedNodeKind
	name   string // FusedInput
	value  float32
	unary  UnaryOp
	binary BinaryOp
	args   [2]*Expr
}

// Var is the input called name (the inputs are given to Fused by name).
func Var(name string) *Expr { return &Expr{kind: FusedInput, name: name} }

// Const is the constant v.
func Const(v float32) *Expr { return &Expr{kind: FusedConst, value: v} }

func (e *Expr) un(op UnaryOp) *Expr { return &Expr{kind: FusedUnary, unary: op, args: [2]*Expr{e}} }
func (e *Expr) bin(op BinaryOp, o *Expr) *Expr {
	return &Expr{kind: FusedBinary, binary: op, args: [2]*Expr{e, o}}
}

func (e *Expr) Add(o *Expr) *Expr { return e.bin(OpAdd, o) } // e + o
func (e *Expr) Sub(o *Expr) *Expr { return e.bin(OpSub, o) } // e - o
func (e *Expr) Mul(o *Expr) *Expr { return e.bin(OpMul, o) } // e · o
func (e *Expr) Div(o *Expr) *Expr { return e.bin(OpDiv, o) } // e / o

// AddConst is e + c.
func (e *Expr) AddConst(c float32) *Expr { return e.Add(Const(c)) }

// Scale is e · c.
func (e *Expr) Scale(c float32) *Expr { return e.Mul(Const(c)) }

func (e *Expr) Neg() *Expr        { return e.un(OpNeg) }     // -e
func (e *Expr) Exp() *Expr        { return e.un(OpExp) }     // e^e
func (e *Expr) Log() *Expr        { return e.un(OpLog) }     // ln e
func (e *Expr) Sqrt() *Expr       { return e.un(OpSqrt) }    // √e
func (e *Expr) Square() *Expr     { return e.un(OpSquare) }  // e²
func (e *Expr) Reciprocal() *Expr { return e.un(OpRecip) }   // 1/e
func (e *Expr) Tanh() *Expr       { return e.un(OpTanh) }    // tanh e
func (e *Expr) Sigmoid() *Expr    { return e.un(OpSigmoid) } // 1/(1+exp(-e))
func (e *Expr) Sin() *Expr        { return e.un(OpSin) }     // sin e
func (e *Expr) Cos() *Expr        { return e.un(OpCos) }     // cos e

// ReLU is max(e, 0) (NaN stays NaN); its gradient is 0 at 0, as torch's.
func (e *Expr) ReLU() *Expr { return e.un(OpReLU) }

// fusedUnaries and fusedBinaries are the operations an Expr may hold: the
// backends' FusedProgram implementations need to know only these.
var (
	fusedUnaries  = []UnaryOp{OpNeg, OpExp, OpLog, OpSqrt, OpSquare, OpRecip, OpTanh, OpSigmoid, OpSin, OpCos, OpReLU}
	fusedBinaries = []BinaryOp{OpAdd, OpSub, OpMul, OpDiv, OpGt}
)

// FusedUnaryOps and FusedBinaryOps list the operations a FusedProgram may
// contain, for a backend to check that it implements each.
func FusedUnaryOps() []UnaryOp   { return slices.Clone(fusedUnaries) }
func FusedBinaryOps() []BinaryOp { return slices.Clone(fusedBinaries) }

var unaryNames = map[UnaryOp]string{OpNeg: "neg", OpExp: "exp", OpLog: "log", OpSqrt: "sqrt", OpSquare: "square",
	OpRecip: "reciprocal", OpTanh: "tanh", OpSigmoid: "sigmoid", OpSin: "sin", OpCos: "cos", OpReLU: "relu"}
var binaryNames = map[BinaryOp]string{OpAdd: "+", OpSub: "-", OpMul: "*", OpDiv: "/", OpGt: ">"}

// String writes e in a readable infix form, e.g. (x * y) + 1.
func (e *Expr) String() string {
	if e == nil {
		return "<nil>"
	}
	switch e.kind {
	case FusedInput:
		return e.name
	case FusedConst:
		return strconv.FormatFloat(float64(e.value), 'g', -1, 32)
	case FusedUnary:
		return unaryNames[e.unary] + "(" + e.args[0].String() + ")"
	default:
		return "(" + e.args[0].String() + " " + binaryNames[e.binary] + " " + e.args[1].String() + ")"
	}
}

// FusedOp is a compiled pointwise expression: Apply runs it on tensors,
// with autograd.
type FusedOp struct {
	inputs  []string
	root    *Expr
	forward *FusedProgram
	grads   []*Expr // d root / d input i, times the incoming gradient Var(gradName)

	mu       sync.Mutex
	backward map[string]*FusedProgram // by which inputs need a gradient
}

// gradName is the incoming gradient's input in the gradient programs; it is
// not a C identifier, so no user input can take it.
const gradName = "<grad>"

// Fused prepares root, an expression over the named inputs, for Apply. It
// fails when a name is not an identifier (letters, digits, _, not starting
// with a digit), is given twice, or the expression uses a name that is not
// among the inputs, or holds a nil operand.
func Fused(root *Expr, inputs ...string) (*FusedOp, error) {
	if len(inputs) == 0 {
		return nil, fmt.Errorf("tensor: Fused: no inputs named (give the names the expression's Vars use)")
	}
	seen := map[string]bool{}
	for _, name := range inputs {
		if !isIdentifier(name) {
			return nil, fmt.Errorf("tensor: Fused: input name %q is not an identifier (letters, digits and _, not starting with a digit)", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("tensor: Fused: input %q named twice", name)
		}
		seen[name] = true
	}
	if err := checkExpr(root, seen); err != nil {
		return nil, fmt.Errorf("tensor: Fused %v: %w", root, err)
	}
	f := &FusedOp{inputs: slices.Clone(inputs), root: root, backward: map[string]*FusedProgram{}}
	var err error
	if f.forward, err = buildProgram(inputs, []*Expr{root}); err != nil {
		return nil, err
	}
	f.grads = gradients(root, inputs, Var(gradName))
	return f, nil
}

// MustFused is Fused for expressions fixed in the program text: it panics
// on an error.
func MustFused(root *Expr, inputs ...string) *FusedOp {
	f, err := Fused(root, inputs...)
	if err != nil {
		panic(err)
	}
	return f
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'):
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func checkExpr(e *Expr, inputs map[string]bool) error {
	if e == nil {
		return fmt.Errorf("nil operand")
	}
	switch e.kind {
	case FusedInput:
		if !inputs[e.name] {
			return fmt.Errorf("uses %q, which is not among the inputs", e.name)
		}
	case FusedUnary:
		return checkExpr(e.args[0], inputs)
	case FusedBinary:
		if err := checkExpr(e.args[0], inputs); err != nil {
			return err
		}
		return checkExpr(e.args[1], inputs)
	}
	return nil
}

// Inputs returns the input names, in Apply's order.
func (f *FusedOp) Inputs() []string { return slices.Clone(f.inputs) }

// Expr returns the expression.
func (f *FusedOp) Expr() *Expr { return f.root }

// Program returns the forward program.
func (f *FusedOp) Program() *FusedProgram { return f.forward }

// Gradient returns the derivative of the expression by input, symbolic:
// an expression over the inputs.
func (f *FusedOp) Gradient(input string) *Expr {
	i := slices.Index(f.inputs, input)
	if i < 0 {
		panic(fmt.Sprintf("tensor: FusedOp.Gradient: no input %q among %v", input, f.inputs))
	}
	return substitute(f.grads[i], gradName, Const(1), map[*Expr]*Expr{})
}

// GradientProgram returns the program of the backward pass for the inputs
// marked in wanted: its inputs are the forward inputs and then the incoming
// gradient, its outputs the gradients of the wanted inputs, in order.
func (f *FusedOp) GradientProgram(wanted []bool) *FusedProgram {
	var key strings.Builder
	var outs []*Expr
	for i, w := range wanted {
		if w {
			key.WriteByte('1')
			outs = append(outs, f.grads[i])
		} else {
			key.WriteByte('0')
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.backward[key.String()]; p != nil {
		return p
	}
	p, err := buildProgram(append(slices.Clone(f.inputs), gradName), outs)
	if err != nil {
		panic(err) // the gradients use only the inputs and the gradient
	}
	f.backward[key.String()] = p
	return p
}

// Apply evaluates the expression on xs (one tensor per input, in the order
// of Inputs, float32, broadcast together) into a new tensor of the
// broadcast shape, recording its gradient.
func (f *FusedOp) Apply(xs ...*Tensor) *Tensor {
	if len(xs) != len(f.inputs) {
		panic(fmt.Sprintf("tensor: Fused %v: %d tensors for the %d inputs %v", f.root, len(xs), len(f.inputs), f.inputs))
	}
	for i, x := range xs {
		if x == nil || x.DType() != Float32 {
			panic(fmt.Sprintf("tensor: Fused %v: input %s is not a float32 tensor", f.root, f.inputs[i]))
		}
	}
	sameBackend(xs...)
	shape := broadcastAll("Fused", xs...)
	be := xs[0].st.b
	out := Empty(be, scopeOf(xs...), shape...)
	views := make([]View, len(xs))
	for i, x := range xs {
		views[i] = viewOf(x, shape)
	}
	runFused(be, f.forward, []Buffer{out.buffer()}, views, shape)
	record(out, "fused", func(g *Tensor, e *engine) {
		wanted := make([]bool, len(xs))
		anyGrad := false
		for i, x := range xs {
			wanted[i] = x.requiresGrad
			anyGrad = anyGrad || wanted[i]
		}
		if !anyGrad {
			return
		}
		p := f.GradientProgram(wanted)
		in := make([]View, 0, len(xs)+1)
		for _, x := range xs {
			in = append(in, viewOf(x, shape))
		}
		in = append(in, denseView(g))
		var dst []Buffer
		var gs []*Tensor
		for i, x := range xs {
			if wanted[i] {
				t := Empty(be, e.scopeFor(x), shape...)
				gs = append(gs, t)
				dst = append(dst, t.buffer())
			}
		}
		runFused(be, p, dst, in, shape)
		j := 0
		for i, x := range xs {
			if wanted[i] {
				giveSummed(e, x, gs[j], true)
				j++
			}
		}
	}, xs...)
	return out
}

// runFused runs p on be, through FusedBackend where be has it.
func runFused(be Backend, p *FusedProgram, dst []Buffer, in []View, shape []int) {
	if fb, ok := be.(FusedBackend); ok {
		fb.Fused(p, dst, in, shape)
		return
	}
	fusedComposed(be, p, dst, in, shape)
}

// fusedComposed runs p as one Unary or Binary per node: the path of a
// backend without FusedBackend.
func fusedComposed(be Backend, p *FusedProgram, dst []Buffer, in []View, shape []int) {
	vals := make([]View, len(p.Nodes))
	var temps []*Tensor
	defer func() {
		for _, t := range temps {
			t.Release()
		}
	}()
	zero := make([]int, len(shape))
	for i, nd := range p.Nodes {
		switch nd.Kind {
		case FusedInput:
			vals[i] = in[nd.Input]
		case FusedConst:
			t := Full(be, nil, nd.Value, 1)
			temps = append(temps, t)
			vals[i] = View{Buf: t.buffer(), Strides: zero}
		case FusedUnary:
			t := rawUnary(nil, be, nd.Unary, vals[nd.Args[0]], shape, 0, 0)
			temps = append(temps, t)
			vals[i] = Dense(t.buffer(), shape)
		case FusedBinary:
			t := rawBinary(nil, be, nd.Binary, vals[nd.Args[0]], vals[nd.Args[1]], shape)
			temps = append(temps, t)
			vals[i] = Dense(t.buffer(), shape)
		}
	}
	for j, o := range p.Outputs {
		be.CopyView(Dense(dst[j], shape), vals[o], shape, false)
	}
}

// BroadcastView is t's memory as a View of shape, which t must broadcast
// to: for backends' custom kernels that read tensors of any layout.
func BroadcastView(t *Tensor, shape []int) (View, error) {
	if t.Released() {
		return View{}, fmt.Errorf("tensor: BroadcastView of a released tensor")
	}
	s, err := BroadcastShape(t.shape, shape)
	if err != nil || !sameShape(s, shape) {
		return View{}, fmt.Errorf("tensor: shape %v does not broadcast to %v", t.shape, shape)
	}
	return viewOf(t, shape), nil
}

// ---- programs ----

// buildProgram flattens the expressions into a FusedProgram, each distinct
// subexpression (by structure, not only by pointer) once.
func buildProgram(inputs []string, outs []*Expr) (*FusedProgram, error) {
	b := &progBuilder{p: &FusedProgram{Inputs: slices.Clone(inputs)}, byKey: map[string]int{}, memo: map[*Expr]int{}}
	for _, e := range outs {
		i, err := b.node(e)
		if err != nil {
			return nil, err
		}
		b.p.Outputs = append(b.p.Outputs, i)
	}
	var key strings.Builder
	fmt.Fprintf(&key, "in%d", len(inputs))
	for _, k := range b.keys {
		key.WriteString(";" + k)
	}
	key.WriteString(";out")
	for _, o := range b.p.Outputs {
		key.WriteString("," + strconv.Itoa(o))
	}
	b.p.Key = key.String()
	return b.p, nil
}

type progBuilder struct {
	p     *FusedProgram
	keys  []string // of each node
	byKey map[string]int
	memo  map[*Expr]int
}

func (b *progBuilder) node(e *Expr) (int, error) {
	if i, ok := b.memo[e]; ok {
		return i, nil
	}
	nd := FusedNode{Kind: e.kind}
	var key string
	switch e.kind {
	case FusedInput:
		nd.Input = slices.Index(b.p.Inputs, e.name)
		if nd.Input < 0 {
			return 0, fmt.Errorf("tensor: Fused: %q is not among the inputs %v", e.name, b.p.Inputs)
		}
		key = "i" + strconv.Itoa(nd.Input)
	case FusedConst:
		nd.Value = e.value
		key = "c" + strconv.FormatUint(uint64(math.Float32bits(e.value)), 16)
	case FusedUnary:
		a, err := b.node(e.args[0])
		if err != nil {
			return 0, err
		}
		nd.Unary, nd.Args[0] = e.unary, a
		key = fmt.Sprintf("u%d(%d)", e.unary, a)
	case FusedBinary:
		a, err := b.node(e.args[0])
		if err != nil {
			return 0, err
		}
		c, err := b.node(e.args[1])
		if err != nil {
			return 0, err
		}
		nd.Binary, nd.Args = e.binary, [2]int{a, c}
		key = fmt.Sprintf("b%d(%d,%d)", e.binary, a, c)
	}
	i, ok := b.byKey[key]
	if !ok {
		i = len(b.p.Nodes)
		b.p.Nodes = append(b.p.Nodes, nd)
		b.keys = append(b.keys, key)
		b.byKey[key] = i
	}
	b.memo[e] = i
	return i, nil
}

// ---- symbolic gradients ----

// gradients returns, for each input, the expression of g · d root/d input
// by reverse-mode differentiation of the expression graph: every node's
// adjoint (the gradient of root by that node) is the sum over its users of
// the user's adjoint times the local derivative, visited from the root
// down in reverse topological order. An input root does not use gets Const(0).
func gradients(root *Expr, inputs []string, g *Expr) []*Expr {
	var order []*Expr // post-order: operands before users
	seen := map[*Expr]bool{}
	var visit func(e *Expr)
	visit = func(e *Expr) {
		if seen[e] {
			return
		}
		seen[e] = true
		switch e.kind {
		case FusedUnary:
			visit(e.args[0])
		case FusedBinary:
			visit(e.args[0])
			visit(e.args[1])
		}
		order = append(order, e)
	}
	visit(root)
	adj := map[*Expr]*Expr{root: g}
	acc := func(e, v *Expr) {
		if a := adj[e]; a != nil {
			adj[e] = a.Add(v)
		} else {
			adj[e] = v
		}
	}
	byName := map[string]*Expr{}
	for i := len(order) - 1; i >= 0; i-- {
		n := order[i]
		a := adj[n]
		if a == nil {
			continue
		}
		x, y := n.args[0], n.args[1]
		switch n.kind {
		case FusedInput:
			if s := byName[n.name]; s != nil {
				byName[n.name] = s.Add(a)
			} else {
				byName[n.name] = a
			}
		case FusedUnary:
			switch n.unary {
			case OpNeg:
				acc(x, a.Neg())
			case OpExp:
				acc(x, a.Mul(n))
			case OpLog:
				acc(x, a.Div(x))
			case OpSqrt:
				acc(x, a.Div(n.Scale(2)))
			case OpSquare:
				acc(x, a.Mul(x.Scale(2)))
			case OpRecip:
				acc(x, a.Mul(n.Square()).Neg())
			case OpTanh:
				acc(x, a.Mul(Const(1).Sub(n.Square())))
			case OpSigmoid:
				acc(x, a.Mul(n.Mul(Const(1).Sub(n))))
			case OpSin:
				acc(x, a.Mul(x.Cos()))
			case OpCos:
				acc(x, a.Mul(x.Sin()).Neg())
			case OpReLU:
				acc(x, a.Mul(x.bin(OpGt, Const(0))))
			default:
				panic(fmt.Sprintf("tensor: Fused: no derivative of unary op %d", n.unary))
			}
		case FusedBinary:
			switch n.binary {
			case OpAdd:
				acc(x, a)
				acc(y, a)
			case OpSub:
				acc(x, a)
				acc(y, a.Neg())
			case OpMul:
				acc(x, a.Mul(y))
				acc(y, a.Mul(x))
			case OpDiv:
				acc(x, a.Div(y))
				acc(y, a.Mul(n).Div(y).Neg())
			case OpGt: // a step: derivative 0 wherever it exists
			default:
				panic(fmt.Sprintf("tensor: Fused: no derivative of binary op %d", n.binary))
			}
		}
	}
	out := make([]*Expr, len(inputs))
	for i, name := range inputs {
		if out[i] = byName[name]; out[i] == nil {
			out[i] = Const(0)
		}
	}
	return out
}

// substitute replaces the input called name by v in e.
func substitute(e *Expr, name string, v *Expr, memo map[*Expr]*Expr) *Expr {
	if r, ok := memo[e]; ok {
		return r
	}
	r := e
	switch e.kind {
	case FusedInput:
		if e.name == name {
			r = v
		}
	case FusedUnary:
		if a := substitute(e.args[0], name, v, memo); a != e.args[0] {
			r = a.un(e.unary)
		}
	case FusedBinary:
		a, b := substitute(e.args[0], name, v, memo), substitute(e.args[1], name, v, memo)
		if a != e.args[0] || b != e.args[1] {
			r = a.bin(e.binary, b)
		}
	}
	memo[e] = r
	return r
}
