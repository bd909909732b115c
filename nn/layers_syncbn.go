package nn

import (
	"math"

	"github.com/ember-ml/ember/tensor"
)

// BatchStatsReducer sums a layer's per-channel batch statistics over the
// ranks of a data-parallel job, for synchronised batch norm
// (SetSyncBatchNorm). nn/trainer makes one from its communicator.
type BatchStatsReducer interface {
	// SumOverRanks replaces the contiguous float32 tensor t on every rank
	// by the sum of all ranks' t, queued on the device like any other
	// operation (so that a captured step holds it).
	SumOverRanks(t *tensor.Tensor)
	// Ranks is the number of ranks. Every rank's batch has the same size.
	Ranks() int
}

// SetSyncBatchNorm makes every batch norm layer of m normalise, in
// training, by the statistics of the whole batch across the ranks, as
// torch.nn.SyncBatchNorm does: the per-channel sums of x and x² are summed
// over the ranks (r) before the mean and variance are formed, and in the
// backward pass the gradients of those sums are summed over the ranks
// too, so that N ranks with B/N samples each compute what one rank with
// all B computes, forward and backward. The running statistics follow the
// global ones, so they stay the same on every rank. nil goes back to each
// rank's own statistics (DDP's default). It returns the number of layers.
//
// The variance is E[x²] - E[x]² in float32 (what one all-reduce of the
// two sums allows, as torch's does of per-rank means and variances): for
// activations of mean far from zero relative to their spread it loses
// more precision than the single-rank kernel's two-pass variance.
func SetSyncBatchNorm(m any, r BatchStatsReducer) int {
	seen := map[*BatchNorm]bool{}
	walk(m, "", func(_ string, v any) bool {
		if b, ok := v.(interface{ batchNorm() *BatchNorm }); ok {
			bn := b.batchNorm()
			bn.sync = r
			seen[bn] = true
		}
		return true
	}, func(string, *tensor.Tensor) {})
	return len(seen)
}

func (n *BatchNorm) batchNorm() *BatchNorm { return n }

// sumOverRanks is r's all-reduce as an operation of the autograd graph:
// forward and backward both sum over the ranks.
func sumOverRanks(r BatchStatsReducer, x *tensor.Tensor) *tensor.Tensor {
	x = x.Contiguous()
	out := tensor.Empty(x.Backend(), x.Scope(), x.Shape()...)
	tensor.CopyTensor(out, x.Detach())
	r.SumOverRanks(out)
	return tensor.Function("sum_over_ranks", out, func(g *tensor.Tensor) []*tensor.Tensor {
		gg := tensor.Empty(g.Backend(), g.Scope(), g.Shape()...)
		tensor.CopyTensor(gg, g.Contiguous().Detach())
		r.SumOverRanks(gg)
		return []*tensor.Tensor{gg}
	}, x)
}

// syncForward is forward in training with the statistics of all ranks.
func (n *BatchNorm) syncForward(x *tensor.Tensor) *tensor.Tensor {
	shape := x.Shape()
	nb, c := shape[0], shape[1]
	inner := 1
	for _, d := range shape[2:] {
		inner *= d
	}
	x3 := x.Reshape(nb, c, inner)
	sums := tensor.Concat(0, tensor.SumAxes(x3, []int{0, 2}, false), tensor.SumAxes(tensor.Square(x3), []int{0, 2}, false))
	total := sumOverRanks(n.sync, sums) // [2C]: Σx, then Σx²
	count := float32(nb * inner * n.sync.Ranks())
	mean := tensor.MulScalar(total.Narrow(0, 0, c), 1/count)
	variance := tensor.Clamp(tensor.Sub(tensor.MulScalar(total.Narrow(0, c, c), 1/count), tensor.Square(mean)), 0, math.MaxFloat32)
	inv := tensor.Rsqrt(tensor.AddScalar(variance, n.Eps))
	y := tensor.Mul(tensor.Sub(x3, mean.Reshape(1, c, 1)), inv.Reshape(1, c, 1))
	if n.Weight != nil {
		y = tensor.Mul(y, n.Weight.Reshape(1, c, 1))
	}
	if n.Bias != nil {
		y = tensor.Add(y, n.Bias.Reshape(1, c, 1))
	}
	if n.RunningMean != nil {
		// torch's update, with the unbiased variance of the whole batch.
		m := n.Momentum
		unbiased := float32(1)
		if count > 1 {
			unbiased = count / (count - 1)
		}
		// run += m·(scale·batch - run), in place on the device.
		update := func(run, batch *tensor.Tensor, scale float32) {
			d := tensor.Sub(tensor.MulScalar(batch.Detach(), scale), run)
			run.Backend().Axpy(run.Buffer(), m, d.Buffer())
			if d.Scope() == nil {
				d.Release()
			}
		}
		update(n.RunningMean, mean, 1)
		update(n.RunningVar, variance, unbiased)
	}
	return y.Reshape(shape...)
}
