package tensor

import "fmt"

// Softmax returns exp(x) / Σ exp(x) over axis (negative counts from the
// end), computed stably (the maximum subtracted), as torch.softmax.
func Softmax(x *Tensor, axis int) *Tensor { return softmax("Softmax", x, axis, false) }

// LogSoftmax returns log Softmax(x, axis), computed as x - max - log Σ
// exp(x - max) so that it stays finite where Softmax underflows.
func LogSoftmax(x *Tensor, axis int) *Tensor { return softmax("LogSoftmax", x, axis, true) }

func softmax(op string, x *Tensor, axis int, log bool) *Tensor {
	outer, n, inner := axisView(op, x.shape, axis)
	x = x.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	if out.Len() == 0 {
		return out
	}
	be.Softmax(out.buffer(), x.buffer(), outer, n, inner, log)
	record(out, "softmax", func(g *Tensor, e *engine) {
		if dx, acc := e.sink(x); !dx.Empty() {
			be.SoftmaxBackward(dx, g.buffer(), out.buffer(), outer, n, inner, log, acc)
		}
	}, x)
	return out
}

// axisView normalises axis of shape (negative counts from the end) and
// returns the [outer, n, inner] view of a dense tensor around it.
func axisView(op string, shape []int, axis int) (outer, n, inner int) {
	if axis < 0 {
		axis += len(shape)
	}
	if axis < 0 || axis >= len(shape) {
		panic(fmt.Sprintf("tensor: %s over axis %d of a tensor of shape %v", op, axis, shape))
	}
	return numel(shape[:axis]), shape[axis], numel(shape[axis+1:])
}

// LossReduction says how a loss combines its elements.
type LossReduction uint8

const (
	LossMean LossReduction = iota // the mean over the counted (not ignored) targets, torch's "mean"
	LossSum                       // the sum, torch's "sum"
)

// CrossEntropyOptions are the options of torch.nn.functional.cross_entropy
// that CrossEntropyLoss supports. The zero value is torch's default except
// for the ignore index, which is off unless Ignore is set (torch's default
// -100 can never be a class, so only labels of -100 behave differently: here
// they are out of range).
type CrossEntropyOptions struct {
	Reduction LossReduction
	// LabelSmoothing ε in [0, 1]: the loss of a target t is (1-ε)·(-log
	// p_t) + ε·mean over the classes c of (-log p_c).
	LabelSmoothing float32
	// Ignore makes targets equal to IgnoreIndex count for nothing: no loss,
	// no gradient, and not counted by LossMean.
	Ignore      bool
	IgnoreIndex int32
}

// CrossEntropyLoss is torch.nn.functional.cross_entropy(logits, labels):
// logits [N, C] with int32 labels [N], or, as torch lays them out, logits
// [N, C, d1, ...] with the classes on axis 1 and labels [N, d1, ...]. A mean
// divides by the number of targets not ignored (NaN when every target is
// ignored, as torch). The plain case ([N, C], mean, no smoothing, no ignore
// index) is CrossEntropy, one backend operation; the others are one
// ClassLoss on a backend that has it (no synchronization: it can run in a
// captured CUDA graph), else they read the labels to the host to weight
// the log-probabilities of LogSoftmax over axis 1. With ClassLoss an
// ignored target's gradient is zero even when the mean is NaN, as torch's
// (the composed path makes it NaN).
func CrossEntropyLoss(logits, labels *Tensor, opt CrossEntropyOptions) *Tensor {
	ls := logits.shape
	bad := len(ls) < 2 || labels.DType() != Int32 || len(labels.shape) != len(ls)-1 || labels.shape[0] != ls[0] ||
		!sameShape(labels.shape[1:], ls[2:]) || opt.LabelSmoothing < 0 || opt.LabelSmoothing > 1 || opt.Reduction > LossSum
	if bad {
		panic(fmt.Sprintf("tensor: CrossEntropyLoss of logits %v with %s labels %v (label smoothing %g, reduction %d); want logits [N, C, d...] and labels [N, d...]",
			ls, labels.DType(), labels.shape, opt.LabelSmoothing, opt.Reduction))
	}
	sameBackend(logits, labels)
	if len(ls) == 2 && opt.Reduction == LossMean && opt.LabelSmoothing == 0 && !opt.Ignore && ls[1] > 0 {
		return CrossEntropy(logits, labels)
	}
	n, classes, inner := ls[0], ls[1], numel(ls[2:])
	if cl, ok := logits.st.b.(ClassLossBackend); ok && numel(ls) > 0 {
		return classLoss(cl, logits, labels, ClassLossSpec{Outer: n, Classes: classes, Inner: inner,
			Smoothing: opt.LabelSmoothing, Ignore: opt.Ignore, IgnoreIndex: opt.IgnoreIndex, Sum: opt.Reduction == LossSum})
	}
	return crossEntropyComposed(logits, labels, opt)
}

// classLoss is CrossEntropyLoss on a ClassLossBackend: one operation that
// also forms the gradient of the logits when they need one, as
// CrossEntropy does. Making the gradient in the forward pass is the faster
// choice for a language model's head ([16384, 96]: 6 MB of logits) where
// the loss itself is differentiated: one read of the logits and one write
// of the gradient, and a backward pass that only hands the gradient on.
// Recomputing it there instead would read the logits twice (18 MB of
// traffic rather than 12); only when the upstream gradient is not 1 (a loss
// inside a larger graph) does the ScaleBy below cost a pass more (24 MB).
func classLoss(cl ClassLossBackend, logits, labels *Tensor, spec ClassLossSpec) *Tensor {
	logits, labels = logits.Contiguous(), labels.Contiguous()
	be := logits.st.b
	s := scopeOf(logits, labels)
	loss := Empty(be, s, 1)
	var dlogits *Tensor
	var dbuf Buffer
	if logits.requiresGrad && s.GradEnabled() {
		dlogits = Empty(be, s, logits.shape...)
		dbuf = dlogits.buffer()
	}
	cl.ClassLoss(loss.buffer(), dbuf, logits.buffer(), labels.buffer(), spec)
	record(loss, "class_loss", func(g *Tensor, e *engine) {
		if g.isOne {
			e.give(logits, dlogits)
			return
		}
		dst, acc := e.sink(logits)
		Complete(be).ScaleBy(dst, dlogits.buffer(), g.buffer(), acc)
	}, logits)
	saveFor(loss, dlogits)
	return loss
}

// crossEntropyComposed is CrossEntropyLoss on backends without
// ClassLossBackend: the labels are read to the host (a synchronization) to
// weight LogSoftmax over axis 1.
func crossEntropyComposed(logits, labels *Tensor, opt CrossEntropyOptions) *Tensor {
	ls := logits.shape
	n, classes, inner := ls[0], ls[1], numel(ls[2:])
	lab := labels.Int32s()
	eps := float64(opt.LabelSmoothing)
	w := make([]float32, n*classes*inner) // the loss is -Σ w·log p
	counted := 0
	for o := 0; o < n; o++ {
		for r := 0; r < inner; r++ {
			t := lab[o*inner+r]
			if opt.Ignore && t == opt.IgnoreIndex {
				continue
			}
			if t < 0 || int(t) >= classes {
				panic(fmt.Sprintf("tensor: CrossEntropyLoss: label %d at %d outside [0, %d)", t, o*inner+r, classes))
			}
			counted++
			for c := 0; c < classes; c++ {
				v := eps / float64(classes)
				if c == int(t) {
					v += 1 - eps
				}
				w[(o*classes+c)*inner+r] = float32(v)
			}
		}
	}
	scale := -1.0
	if opt.Reduction == LossMean {
		scale = -1 / float64(counted) // -Inf when nothing counts: 0·-Inf gives torch's NaN
	}
	for i, v := range w {
		w[i] = float32(float64(v) * scale)
	}
	if len(w) == 0 { // no targets: 0, or NaN for a mean
		return Full(logits.st.b, scopeOf(logits, labels), float32(-scale*0), 1)
	}
	weights := FromFloat32(logits.st.b, scopeOf(logits, labels), w, ls...)
	return Sum(Mul(weights, LogSoftmax(logits, 1)))
}
