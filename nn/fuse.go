package nn

import (
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/ember-ml/ember/tensor"
)

// Fusion: a Sequential (and LeNet, which is one) does not run each of
// its layers on its own. Before a forward pass it looks at consecutive
// layers and runs a group that a rule of fusionRules matches through one
// fused tensor operation: a convolution with its ReLU and a max pooling
// over disjoint windows, a convolution with its ReLU, max pooling with the
// batch norm (and activation) after it, batch norm with its ReLU or GELU,
// a linear layer with its ReLU, layer norm or an activation with the
// linear layer after it (under autocast they write the product's bfloat16
// operand); CrossEntropyLoss and LossSum run a last Linear layer
// and the loss as one operation. The fused operations compute what the
// layers do one by one (up to the order of the sums), and each falls back
// to those layers' operations on a backend without a fused form, so
// fusion changes speed, never parameters, names, checkpoints or what is
// learnt. The model chooses nothing: the framework picks the fused
// kernels.
//
// SetFusion(m, false) turns it off for a model (every layer then runs on
// its own, for debugging or to compare); EMBER_FUSION=off in the
// environment turns it off for every model of the process.

// fusionRule runs a group of consecutive layers as one operation.
type fusionRule struct {
	// name says what the rule fuses (in FusionPlan).
	name string
	// match returns how many layers at the start of ls the rule covers,
	// 0 when it does not apply. It looks at the layers' settings only, so
	// that the plan is the same for every batch.
	match func(ls []Layer) int
	// forward applies the matched layers (ls has exactly match's count).
	forward func(ls []Layer, x *tensor.Tensor) *tensor.Tensor
}

// fusionRules are tried in order at each layer, longest pattern first;
// the first that matches wins. A new pattern is a rule here with its
// fused tensor operation (whose own fallback covers backends without it).
var fusionRules = []fusionRule{
	{
		name: "conv2d+relu+maxpool2d",
		match: func(ls []Layer) int {
			if len(ls) >= 3 && simpleConv(ls[0].Module) && isReLU(ls[1].Module) && disjointPool(ls[2].Module) > 0 {
				return 3
			}
			return 0
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			c := ls[0].Module.(*Conv2d)
			stride, pad := c.simpleGeometry()
			return tensor.Conv2dReLUMaxPool(x, c.Weight, c.Bias, stride, pad, disjointPool(ls[2].Module))
		},
	},
	{
		name: "conv2d+relu",
		match: func(ls []Layer) int {
			if len(ls) >= 2 && isConv(ls[0].Module) && isReLU(ls[1].Module) {
				return 2
			}
			return 0
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			return ls[0].Module.(*Conv2d).ForwardReLU(x)
		},
	},
	{
		// Max pooling, batch norm and its activation (or none): batch
		// norm's input gradient goes straight into the pooling's
		// (tensor.MaxPoolBatchNormAct), the pooled gradient never written.
		name: "maxpool2d+batchnorm+act",
		match: func(ls []Layer) int {
			if len(ls) < 2 || disjointPool(ls[0].Module) == 0 {
				return 0
			}
			if _, ok := ls[1].Module.(*BatchNorm2d); !ok || batchNormOf(ls[1].Module) == nil {
				return 0
			}
			if len(ls) >= 3 && bnActivation(ls[2].Module) != tensor.OpIdentity {
				return 3
			}
			return 2
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			var act Module
			if len(ls) == 3 {
				act = ls[2].Module
			}
			return batchNormOf(ls[1].Module).forwardPoolAct(disjointPool(ls[0].Module), ls[0].Module, ls[1].Module, act, x)
		},
	},
	{
		// Batch norm and its activation: the activation in the pass that
		// writes the output, its gradient in batch norm's backward pass
		// (which recomputes the normalised value from the input).
		name: "batchnorm+act",
		match: func(ls []Layer) int {
			if len(ls) >= 2 && batchNormOf(ls[0].Module) != nil && bnActivation(ls[1].Module) != tensor.OpIdentity {
				return 2
			}
			return 0
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			return batchNormOf(ls[0].Module).forwardAct(ls[0].Module, ls[1].Module, x)
		},
	},
	{
		name: "linear+relu",
		match: func(ls []Layer) int {
			if len(ls) >= 2 && isLinear(ls[0].Module) && isReLU(ls[1].Module) {
				return 2
			}
			return 0
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			return ls[0].Module.(*Linear).ForwardReLU(x)
		},
	},
	{
		// Layer norm and the linear layer that takes its output: under
		// autocast the norm writes the product's bfloat16 operand
		// (tensor.LayerNormHalf).
		name: "layernorm+linear",
		match: func(ls []Layer) int {
			if ln, ok := ls[0].Module.(*LayerNorm); ok && ln != nil && len(ls) >= 2 && isLinear(ls[1].Module) {
				return 2
			}
			return 0
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			h := ls[0].Module.(*LayerNorm).ForwardHalf(x)
			y := ls[1].Module.Forward(h)
			tensor.ReleaseInput(h, y)
			return y
		},
	},
	{
		// An activation and the linear layer that takes its output: under
		// autocast the activation writes the product's bfloat16 operand
		// directly, instead of a float32 output that the product then
		// rounds (tensor.ActivationLinear).
		name: "act+linear",
		match: func(ls []Layer) int {
			if len(ls) >= 2 && isLinear(ls[1].Module) {
				if _, ok := linearActivation(ls[0].Module); ok {
					return 2
				}
			}
			return 0
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			act, _ := linearActivation(ls[0].Module)
			l := ls[1].Module.(*Linear)
			return tensor.ActivationLinear(act, x, l.Weight, l.Bias)
		},
	},
	{
		// Two or more activations in a row: one generated kernel each way
		// (tensor.Fused) instead of one per layer.
		name: "pointwise",
		match: func(ls []Layer) int {
			n := pointwiseRun(ls)
			if n < 2 {
				return 0
			}
			return n
		},
		forward: func(ls []Layer, x *tensor.Tensor) *tensor.Tensor {
			return chainOp(ls, false).Apply(x)
		},
	},
}

// pointwiseRun is the number of pointwise layers at the start of ls.
func pointwiseRun(ls []Layer) int {
	n := 0
	for n < len(ls) && pointwiseOf(ls[n].Module) != nil {
		n++
	}
	return n
}

// pointwiseLayer is an activation as an expression: key names it in the
// cache of compiled chains, apply builds it on its input.
type pointwiseLayer struct {
	key   string
	apply func(e *tensor.Expr) *tensor.Expr
}

// geluTanhK is √(2/π), the constant of GELU's tanh approximation.
const geluTanhK = 0.7978845608028654

// pointwiseOf returns m as an expression, or nil when it is not one of the
// activations a generated kernel computes exactly as the layer does
// (GELU by erf and LeakyReLU's gradient at 0 are not in the expression
// language).
func pointwiseOf(m Module) *pointwiseLayer {
	switch v := m.(type) {
	case ReLU, *ReLU:
		return &pointwiseLayer{"relu", (*tensor.Expr).ReLU}
	case Tanh, *Tanh:
		return &pointwiseLayer{"tanh", (*tensor.Expr).Tanh}
	case Sigmoid, *Sigmoid:
		return &pointwiseLayer{"sigmoid", (*tensor.Expr).Sigmoid}
	case SiLU, *SiLU:
		return &pointwiseLayer{"silu", func(e *tensor.Expr) *tensor.Expr { return e.Mul(e.Sigmoid()) }}
	case Identity, *Identity:
		return &pointwiseLayer{"identity", func(e *tensor.Expr) *tensor.Expr { return e }}
	case GELU:
		if v.Tanh {
			return &pointwiseLayer{"gelu_tanh", geluTanh}
		}
	case *GELU:
		if v != nil && v.Tanh {
			return &pointwiseLayer{"gelu_tanh", geluTanh}
		}
	}
	return nil
}

// geluTanh is 0.5·e·(1 + tanh(√(2/π)·(e + 0.044715·e³))), tensor.GELU's
// tanh form.
func geluTanh(e *tensor.Expr) *tensor.Expr {
	inner := e.Add(e.Mul(e).Mul(e).Scale(0.044715)).Scale(geluTanhK)
	return e.Scale(0.5).Mul(inner.Tanh().AddConst(1))
}

// chains caches the compiled chains by their layers' keys (and whether a
// residual is added), so that each is generated once per process; the
// backends cache their kernels by the program.
var chains = struct {
	sync.Mutex
	ops map[string]*tensor.FusedOp
}{ops: map[string]*tensor.FusedOp{}}

// chainOp returns the fused op of the pointwise layers ls applied in
// order to input "x" and, with residual, added to input "r": r + f(x).
func chainOp(ls []Layer, residual bool) *tensor.FusedOp {
	keys := make([]string, len(ls))
	pls := make([]*pointwiseLayer, len(ls))
	for i, l := range ls {
		pls[i] = pointwiseOf(l.Module)
		keys[i] = pls[i].key
	}
	key := strings.Join(keys, ",")
	if residual {
		key = "r+" + key
	}
	chains.Lock()
	defer chains.Unlock()
	if op := chains.ops[key]; op != nil {
		return op
	}
	e := tensor.Var("x")
	for _, pl := range pls {
		e = pl.apply(e)
	}
	inputs := []string{"x"}
	if residual {
		e = tensor.Var("r").Add(e)
		inputs = []string{"r", "x"}
	}
	op := tensor.MustFused(e, inputs...)
	chains.ops[key] = op
	return op
}

// residualForward is x + f(x) for a Residual's child f, with the add
// fused into f's last activations when f is a Sequential that ends with
// some (a pointwise tail that no other rule took): one generated kernel
// for the activations and the skip connection. ok is false when f has no
// such tail.
func residualForward(f Module, x *tensor.Tensor) (y *tensor.Tensor, ok bool) {
	s, isSeq := f.(*Sequential)
	if fusionOff || !isSeq || s.Unfused || len(s.Layers) == 0 {
		return nil, false
	}
	steps := plan(s.Layers, false)
	last := steps[len(steps)-1]
	if last.rule != nil && last.rule.name != "pointwise" || last.rule == nil && pointwiseOf(s.Layers[last.start].Module) == nil {
		return nil, false
	}
	h := runLayers(s.Layers[:last.start], false, x)
	if !slices.Equal(h.Shape(), x.Shape()) { // no broadcasting x: Add's check names the mismatch
		y = addReleasing(x, runLayers(s.Layers[last.start:], true, h))
	} else {
		y = chainOp(s.Layers[last.start:], true).Apply(x, h)
	}
	if h != x {
		tensor.ReleaseInput(h, y) // h is read (where no backward pass reads it)
	}
	return y, true
}

// addReleasing is x + f, f given back once read where the scope releases
// early and no backward pass reads f (tensor.ReleaseInput), unless it is x
// itself.
func addReleasing(x, f *tensor.Tensor) *tensor.Tensor {
	y := tensor.Add(x, f)
	if f != x {
		tensor.ReleaseInput(f, y)
	}
	return y
}

// fusionOff is the process-wide switch (EMBER_FUSION=off or 0).
var fusionOff = func() bool {
	v := strings.ToLower(os.Getenv("EMBER_FUSION"))
	return v == "off" || v == "0" || v == "false"
}()

// Fuser is a module that can run groups of its layers as fused
// operations (Sequential); SetFusion switches it.
type Fuser interface {
	SetFusion(on bool)
}

// SetFusion turns fusion on (the default) or off for m and every
// container inside it. With it off, each layer runs its own operations,
// as written; results are the same up to the order of sums.
func SetFusion(m any, on bool) {
	walk(m, "", func(_ string, v any) bool {
		if f, ok := v.(Fuser); ok {
			f.SetFusion(on)
		}
		return true
	}, func(string, *tensor.Tensor) {})
}

// fusionStep is one entry of a plan: layers [start, start+n) run by rule
// (nil: the layer runs on its own, n = 1).
type fusionStep struct {
	start, n int
	rule     *fusionRule
}

// plan groups the layers as the rules match them; with fusion off, every
// layer is its own step.
func plan(ls []Layer, off bool) []fusionStep {
	var steps []fusionStep
	for i := 0; i < len(ls); {
		st := fusionStep{start: i, n: 1}
		if !off && !fusionOff {
			for r := range fusionRules {
				if n := fusionRules[r].match(ls[i:]); n > 0 {
					st.n, st.rule = n, &fusionRules[r]
					break
				}
			}
		}
		steps = append(steps, st)
		i += st.n
	}
	return steps
}

// runLayers applies ls in order, grouped as plan says, giving back each
// intermediate result once the next group has run where the scope
// releases early and no backward pass reads it (tensor.ReleaseInput).
func runLayers(ls []Layer, off bool, x *tensor.Tensor) *tensor.Tensor {
	first := x
	for _, st := range plan(ls, off) {
		in := x
		if st.rule == nil {
			x = ls[st.start].Module.Forward(x)
		} else {
			x = st.rule.forward(ls[st.start:st.start+st.n], x)
		}
		if in != first { // the caller's input stays
			tensor.ReleaseInput(in, x)
		}
	}
	return x
}

// crossEntropyOf is the mean cross entropy of m(x) against labels, added
// into sum when sum is not nil. A Linear layer (and a Sequential ending in
// one) runs with the loss as one operation (tensor.LinearCrossEntropySum)
// unless fusion is off.
func crossEntropyOf(m Module, x, labels, sum *tensor.Tensor) *tensor.Tensor {
	if !fusionOff {
		switch l := m.(type) {
		case *Linear:
			if len(x.Shape()) == 2 {
				if sum == nil {
					return tensor.LinearCrossEntropy(x, l.Weight, l.Bias, labels)
				}
				return tensor.LinearCrossEntropySum(x, l.Weight, l.Bias, labels, sum)
			}
		case *Sequential:
			if !l.Unfused && len(l.Layers) > 0 {
				last := len(l.Layers) - 1
				return crossEntropyOf(l.Layers[last].Module, l.run(l.Layers[:last], x), labels, sum)
			}
		}
	}
	loss := tensor.CrossEntropy(m.Forward(x), labels)
	if sum != nil {
		// The trainer's running total of the epoch, on the device.
		tensor.Complete(loss.Backend()).Axpy(sum.Buffer(), 1, loss.Buffer())
	}
	return loss
}

// batchNormOf is the state of a BatchNorm1d or BatchNorm2d layer, nil for
// another module.
func batchNormOf(m Module) *BatchNorm {
	switch v := m.(type) {
	case *BatchNorm2d:
		if v != nil {
			return &v.BatchNorm
		}
	case *BatchNorm1d:
		if v != nil {
			return &v.BatchNorm
		}
	}
	return nil
}

// bnActivation is the op of an activation layer that batch norm can run
// in its own kernels (ReLU, GELU in either form), else OpIdentity.
func bnActivation(m Module) tensor.UnaryOp {
	switch v := m.(type) {
	case ReLU, *ReLU:
		return tensor.OpReLU
	case GELU:
		return geluOp(v.Tanh)
	case *GELU:
		if v != nil {
			return geluOp(v.Tanh)
		}
	}
	return tensor.OpIdentity
}

// linearActivation is the unary op of an activation layer that
// tensor.ActivationLinear takes (GELU, SiLU, Tanh, Sigmoid).
func linearActivation(m Module) (tensor.UnaryOp, bool) {
	switch v := m.(type) {
	case GELU:
		return geluOp(v.Tanh), true
	case *GELU:
		if v != nil {
			return geluOp(v.Tanh), true
		}
	case SiLU, *SiLU:
		return tensor.OpSiLU, true
	case Tanh, *Tanh:
		return tensor.OpTanh, true
	case Sigmoid, *Sigmoid:
		return tensor.OpSigmoid, true
	}
	return 0, false
}

func geluOp(approximateTanh bool) tensor.UnaryOp {
	if approximateTanh {
		return tensor.OpGELUTanh
	}
	return tensor.OpGELU
}

// isReLU reports whether m is a ReLU layer.
func isReLU(m Module) bool {
	switch m.(type) {
	case ReLU, *ReLU:
		return true
	}
	return false
}

func isConv(m Module) bool {
	c, ok := m.(*Conv2d)
	return ok && c != nil
}

func isLinear(m Module) bool {
	l, ok := m.(*Linear)
	return ok && l != nil
}

// simpleConv reports whether m is a Conv2d with one stride and padding
// for both axes, no dilation and no groups: the form the fused
// convolution + ReLU + pooling takes.
func simpleConv(m Module) bool {
	c, ok := m.(*Conv2d)
	if !ok || c == nil {
		return false
	}
	stride, _ := c.simpleGeometry()
	return stride > 0
}

// simpleGeometry returns the layer's stride and padding when they are the
// same for both axes with no dilation and one group, and stride 0
// otherwise.
func (c *Conv2d) simpleGeometry() (stride, pad int) {
	o := c.Options
	if o == nil {
		return c.Stride, c.Padding
	}
	if o.Stride[0] != o.Stride[1] || o.Padding[0] != o.Padding[1] || max(o.Dilation[0], 1) != 1 || max(o.Dilation[1], 1) != 1 || max(o.Groups, 1) != 1 {
		return 0, 0
	}
	return max(o.Stride[0], 1), o.Padding[0]
}

// disjointPool returns k when m is a max pooling over k×k windows with
// stride k, no padding and no ceil mode (windows that tile the input),
// and 0 otherwise.
func disjointPool(m Module) int {
	p, ok := m.(*MaxPool2d)
	if !ok || p == nil {
		return 0
	}
	if p.Options == nil {
		if p.Kernel >= 1 && p.Stride == p.Kernel {
			return p.Kernel
		}
		return 0
	}
	o := p.Options
	k := o.Kernel[0]
	stride := o.Stride
	if stride == [2]int{} {
		stride = o.Kernel
	}
	if k < 1 || o.Kernel[1] != k || stride != [2]int{k, k} || o.Padding != [2]int{} || o.CeilMode {
		return 0
	}
	return k
}
