package nn

import (
	"fmt"
	"slices"

	"github.com/ember-ml/ember/tensor"
)

// BatchNorm is the state and forward pass shared by BatchNorm1d and
// BatchNorm2d (torch's _BatchNorm): per-channel normalisation of
// [N, C, ...] input by the batch's statistics in training and by the
// running statistics in evaluation. Its fields are named as torch's, so
// that the state dict holds weight, bias, running_mean, running_var and
// num_batches_tracked.
type BatchNorm struct {
	// Weight (ones) and Bias (zeros) [C] are the affine transform; nil
	// without one (torch's affine=False).
	Weight, Bias *tensor.Tensor
	// RunningMean (zeros) and RunningVar (ones) [C] are updated in place
	// by every training step; nil when the layer keeps no running
	// statistics (track_running_stats=False: the batch's are used in
	// evaluation too).
	RunningMean, RunningVar *tensor.Tensor
	// NumBatchesTracked counts the training steps, a float32 of shape []
	// (exact up to 2^24 steps) kept on the device and advanced there, so
	// that a captured CUDA graph of the step advances it on every replay.
	// It is saved as torch's int64 scalar (see safetensors.go).
	NumBatchesTracked *tensor.Tensor
	// Momentum weighs each batch's statistics in the running ones
	// (torch's default 0.1; torch's momentum=None, a cumulative average,
	// is not offered); Eps is added to the variance (1e-5).
	Momentum, Eps float32

	evaluating  bool // torch's modules start in training mode
	numChannels int
	sync        BatchStatsReducer // SetSyncBatchNorm's: statistics over all ranks
}

// BatchNormOptions are the settings of a batch norm layer; the zero value
// is torch's defaults.
type BatchNormOptions struct {
	// Momentum 0 is torch's 0.1 (set the layer's field after construction
	// for a momentum of exactly 0), Eps 0 is 1e-5.
	Momentum, Eps float32
	// NoAffine leaves weight and bias out (affine=False).
	NoAffine bool
	// NoRunningStats keeps no running statistics
	// (track_running_stats=False).
	NoRunningStats bool
}

// newBatchNorm builds the state of a layer over c channels on b.
func newBatchNorm(layer string, b tensor.Backend, c int, o BatchNormOptions) BatchNorm {
	if c < 1 {
		panic(fmt.Sprintf("nn: %s of %d channels; want at least one", layer, c))
	}
	if o.Momentum < 0 || o.Momentum > 1 || o.Eps < 0 {
		panic(fmt.Sprintf("nn: %s momentum %v, eps %v; want momentum in [0, 1] and eps >= 0", layer, o.Momentum, o.Eps))
	}
	n := BatchNorm{Momentum: o.Momentum, Eps: o.Eps, numChannels: c}
	if n.Momentum == 0 {
		n.Momentum = 0.1
	}
	if n.Eps == 0 {
		n.Eps = 1e-5
	}
	if !o.NoAffine {
		n.Weight = tensor.Full(b, nil, 1, c).SetRequiresGrad(true)
		n.Bias = tensor.Zeros(b, nil, c).SetRequiresGrad(true)
	}
	if !o.NoRunningStats {
		n.RunningMean = tensor.Zeros(b, nil, c)
		n.RunningVar = tensor.Full(b, nil, 1, c)
		n.NumBatchesTracked = tensor.Zeros(b, nil)
	}
	return n
}

// SetTraining switches between the batch's statistics (training, which
// also updates the running ones) and the running statistics.
func (n *BatchNorm) SetTraining(on bool) { n.evaluating = !on }

// Training reports the mode.
func (n *BatchNorm) Training() bool { return !n.evaluating }

// forward normalises x, which the caller has checked.
func (n *BatchNorm) forward(x *tensor.Tensor) *tensor.Tensor {
	return n.forwardWith(x, tensor.OpIdentity, 0)
}

// forwardWith normalises x, max-pooled first over disjoint pool×pool
// windows when pool > 0, and applies act (OpIdentity: none) in the same
// operation; with statistics from all ranks act must be OpIdentity and
// pool 0.
func (n *BatchNorm) forwardWith(x *tensor.Tensor, act tensor.UnaryOp, pool int) *tensor.Tensor {
	training := !n.evaluating || n.RunningMean == nil
	var y *tensor.Tensor
	// Without running statistics evaluation uses the batch's too, but
	// this rank's own: evaluation may run on some ranks only (the
	// trainer's, on rank 0), where an all-reduce would wait for peers
	// that never join it (torch's need_sync = bn_training and
	// self.training).
	if training && !n.evaluating && n.sync != nil {
		y = n.syncForward(x)
	} else if pool > 0 {
		y = tensor.MaxPoolBatchNormAct(x, pool, n.Weight, n.Bias, n.RunningMean, n.RunningVar, training, n.Momentum, n.Eps, act)
	} else {
		y = tensor.BatchNormAct(x, n.Weight, n.Bias, n.RunningMean, n.RunningVar, training, n.Momentum, n.Eps, act)
	}
	if training && n.NumBatchesTracked != nil && !tensor.Recomputing(x) {
		// One more step (Recompute's second run counts none), counted on
		// the device: no host synchronisation, and replayed by a captured
		// graph.
		// Seen as [1], so that backends take their dense one-dimensional
		// path rather than a rank-0 one.
		tensor.AddScalarInPlace(n.NumBatchesTracked.Reshape(1), 1)
	}
	return y
}

// forwardAct is act(bn(x)) for the layers bn (a BatchNorm1d or
// BatchNorm2d whose state n is) and act (ReLU or GELU): one operation each
// way (tensor.BatchNormAct), or the two layers one after the other where
// the statistics come from all ranks (SetSyncBatchNorm).
func (n *BatchNorm) forwardAct(bn, act Module, x *tensor.Tensor) *tensor.Tensor {
	if n.sync != nil && !n.evaluating {
		return act.Forward(bn.Forward(x))
	}
	switch l := bn.(type) {
	case *BatchNorm2d:
		l.check(x)
	case *BatchNorm1d:
		l.check(x)
	}
	return n.forwardWith(x, bnActivation(act), 0)
}

// forwardPoolAct is act(bn(pool(x))) for pool a MaxPool2d over disjoint
// k×k windows and act nil or an activation that bnActivation takes: one
// operation each way (tensor.MaxPoolBatchNormAct), or the layers one
// after the other where the statistics come from all ranks.
func (n *BatchNorm) forwardPoolAct(k int, pool, bn, act Module, x *tensor.Tensor) *tensor.Tensor {
	if n.sync != nil && !n.evaluating {
		y := bn.Forward(pool.Forward(x))
		if act != nil {
			y = act.Forward(y)
		}
		return y
	}
	if l, ok := bn.(*BatchNorm2d); ok {
		l.check(x) // pooling keeps the rank and the channels
	}
	op := tensor.OpIdentity
	if act != nil {
		op = bnActivation(act)
	}
	return n.forwardWith(x, op, k)
}

// BatchNorm1d normalises [N, C] or [N, C, L] input per channel, as
// nn.BatchNorm1d.
type BatchNorm1d struct{ BatchNorm }

// NewBatchNorm1d returns a BatchNorm1d over c channels on b with torch's
// defaults (momentum 0.1, eps 1e-5, affine, running statistics).
func NewBatchNorm1d(b tensor.Backend, c int) *BatchNorm1d {
	return NewBatchNorm1dWith(b, c, BatchNormOptions{})
}

// NewBatchNorm1dWith returns a BatchNorm1d with the options o.
func NewBatchNorm1dWith(b tensor.Backend, c int, o BatchNormOptions) *BatchNorm1d {
	return &BatchNorm1d{newBatchNorm("BatchNorm1d", b, c, o)}
}

// Forward normalises x [N, C] or [N, C, L].
func (n *BatchNorm1d) Forward(x *tensor.Tensor) *tensor.Tensor {
	n.check(x)
	return n.forward(x)
}

func (n *BatchNorm1d) check(x *tensor.Tensor) {
	if s := x.Shape(); (len(s) != 2 && len(s) != 3) || (n.channels() > 0 && s[1] != n.channels()) {
		panic(fmt.Sprintf("nn: BatchNorm1d of %d channels given %v; want [N, %d] or [N, %d, L]", n.channels(), s, n.channels(), n.channels()))
	}
}

// BatchNorm2d normalises [N, C, H, W] input per channel, as
// nn.BatchNorm2d.
type BatchNorm2d struct{ BatchNorm }

// NewBatchNorm2d returns a BatchNorm2d over c channels on b with torch's
// defaults (momentum 0.1, eps 1e-5, affine, running statistics).
func NewBatchNorm2d(b tensor.Backend, c int) *BatchNorm2d {
	return NewBatchNorm2dWith(b, c, BatchNormOptions{})
}

// NewBatchNorm2dWith returns a BatchNorm2d with the options o.
func NewBatchNorm2dWith(b tensor.Backend, c int, o BatchNormOptions) *BatchNorm2d {
	return &BatchNorm2d{newBatchNorm("BatchNorm2d", b, c, o)}
}

// Forward normalises x [N, C, H, W].
func (n *BatchNorm2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	n.check(x)
	return n.forward(x)
}

func (n *BatchNorm2d) check(x *tensor.Tensor) {
	if s := x.Shape(); len(s) != 4 || (n.channels() > 0 && s[1] != n.channels()) {
		panic(fmt.Sprintf("nn: BatchNorm2d of %d channels given %v; want [N, %d, H, W]", n.channels(), s, n.channels()))
	}
}

// channels is C: the constructor's, or for a layer built as a struct
// literal that of its per-channel tensors (0 for none: no check).
func (n *BatchNorm) channels() int {
	if n.numChannels > 0 {
		return n.numChannels
	}
	for _, t := range []*tensor.Tensor{n.Weight, n.RunningMean} {
		if t != nil {
			return t.Dim(0)
		}
	}
	return 0
}

// LayerNorm normalises over the last dimensions of its input (their shape
// is Shape), each row by its own mean and biased variance, as
// nn.LayerNorm.
type LayerNorm struct {
	// Weight (ones) and Bias (zeros), of shape Shape, are the elementwise
	// affine transform; nil without one (elementwise_affine=False).
	Weight, Bias *tensor.Tensor
	Shape        []int `nn:"-"`
	Eps          float32
}

// NewLayerNorm returns a LayerNorm over the trailing dimensions
// normalizedShape on b, with torch's defaults (eps 1e-5, an elementwise
// affine transform).
func NewLayerNorm(b tensor.Backend, normalizedShape ...int) *LayerNorm {
	return NewLayerNormWith(b, normalizedShape, 1e-5, true)
}

// NewLayerNormWith returns a LayerNorm with the given eps, and weight and
// bias when affine (torch's elementwise_affine).
func NewLayerNormWith(b tensor.Backend, normalizedShape []int, eps float32, affine bool) *LayerNorm {
	if len(normalizedShape) == 0 || slices.ContainsFunc(normalizedShape, func(d int) bool { return d < 1 }) {
		panic(fmt.Sprintf("nn: LayerNorm over %v; want one or more dimensions, each >= 1", normalizedShape))
	}
	l := &LayerNorm{Shape: slices.Clone(normalizedShape), Eps: eps}
	if affine {
		l.Weight = tensor.Full(b, nil, 1, normalizedShape...).SetRequiresGrad(true)
		l.Bias = tensor.Zeros(b, nil, normalizedShape...).SetRequiresGrad(true)
	}
	return l
}

// Forward normalises x [..., Shape...].
func (l *LayerNorm) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.LayerNorm(x, l.Shape, l.Weight, l.Bias, l.Eps)
}

// ForwardHalf is Forward for an output that only autocast's products
// read (tensor.LayerNormHalf: bfloat16 under autocast, written once).
func (l *LayerNorm) ForwardHalf(x *tensor.Tensor) *tensor.Tensor {
	return tensor.LayerNormHalf(x, l.Shape, l.Weight, l.Bias, l.Eps)
}
