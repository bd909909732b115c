package nn

import (
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
	// Ranks is the number of ranks, Rank this one's. Every rank's batch
	// has the same size.
	Ranks() int
	Rank() int
}

// SetSyncBatchNorm makes every batch norm layer of m normalise, in
// training, by the statistics of the whole batch across the ranks, as
// torch.nn.SyncBatchNorm does: every rank's per-channel mean and variance
// are gathered (one all-reduce through r) and combined into those of the
// whole batch, and in the backward pass the gradients of the gathered
// statistics are summed over the ranks (the all-reduce's own backward),
// so that N ranks with B/N samples each compute what one rank with all B
// computes, forward and backward. The running statistics follow the
// global ones, so they stay the same on every rank. nil goes back to each
// rank's own statistics (DDP's default). It returns the number of layers.
func SetSyncBatchNorm(m any, r BatchStatsReducer) int {
	seen := map[*BatchNorm]bool{}
	setSync(m, r, seen)
	return len(seen)
}

func setSync(m any, r BatchStatsReducer, seen map[*BatchNorm]bool) {
	walk(m, "", func(_ string, v any) bool {
		switch l := v.(type) {
		case interface{ batchNorm() *BatchNorm }:
			bn := l.batchNorm()
			bn.sync = r
			seen[bn] = true
		case *Sequential: // its layers are not fields that walk sees
			for _, c := range l.Layers {
				setSync(c.Module, r, seen)
			}
		}
		return true
	}, func(string, *tensor.Tensor) {})
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
// Each rank computes its batch's per-channel mean and (biased) variance
// in two passes and puts them in its row of a [ranks, 2, C] buffer of
// zeros; one all-reduce (sum) of it is the all-gather of every rank's
// statistics, which combine into the whole batch's (Chan et al.'s
// pairwise formula, for equal counts: the mean of the means, and the mean
// of each rank's variance plus its mean's squared distance from the
// whole mean), as torch's SyncBatchNorm all-gathers means and variances.
// Sums of x and x² would need an all-reduce of 2C values only, but
// E[x²] - E[x]² in float32 cancels for channels whose mean is far above
// their spread; the two-pass statistics of each rank do not.
func (n *BatchNorm) syncForward(x *tensor.Tensor) *tensor.Tensor {
	shape := x.Shape()
	nb, c := shape[0], shape[1]
	inner := 1
	for _, d := range shape[2:] {
		inner *= d
	}
	x3 := x.Reshape(nb, c, inner)
	ranks, rank := n.sync.Ranks(), n.sync.Rank()
	parts := []*tensor.Tensor{}
	if rank > 0 {
		parts = append(parts, tensor.Zeros(x.Backend(), x.Scope(), rank*2*c))
	}
	parts = append(parts, tensor.MeanAxes(x3, []int{0, 2}, false), tensor.VarAxes(x3, []int{0, 2}, 0, false))
	if rank < ranks-1 {
		parts = append(parts, tensor.Zeros(x.Backend(), x.Scope(), (ranks-1-rank)*2*c))
	}
	all := sumOverRanks(n.sync, tensor.Concat(0, parts...)).Reshape(ranks, 2, c)
	means, vars := all.Narrow(1, 0, 1).Reshape(ranks, c), all.Narrow(1, 1, 1).Reshape(ranks, c)
	mean := tensor.MeanAxes(means, []int{0}, false)
	variance := tensor.MeanAxes(tensor.Add(vars, tensor.Square(tensor.Sub(means, mean.Reshape(1, c)))), []int{0}, false)
	count := float32(nb * inner * ranks)
	inv := tensor.Rsqrt(tensor.AddScalar(variance, n.Eps))
	y := tensor.Mul(tensor.Sub(x3, mean.Reshape(1, c, 1)), inv.Reshape(1, c, 1))
	if n.Weight != nil {
		y = tensor.Mul(y, n.Weight.Reshape(1, c, 1))
	}
	if n.Bias != nil {
		y = tensor.Add(y, n.Bias.Reshape(1, c, 1))
	}
	if n.RunningMean != nil && !tensor.Recomputing(x) {
		// torch's update, with the unbiased variance of the whole batch.
		m := n.Momentum
		unbiased := float32(1)
		if count > 1 {
			unbiased = count / (count - 1)
		}
		// run += m·(scale·batch - run), in place on the device.
		update := func(run, batch *tensor.Tensor, scale float32) {
			d := tensor.Sub(tensor.MulScalar(batch.Detach(), scale), run)
			tensor.Complete(run.Backend()).Axpy(run.Buffer(), m, d.Buffer())
			if d.Scope() == nil {
				d.Release()
			}
		}
		update(n.RunningMean, mean, 1)
		update(n.RunningVar, variance, unbiased)
	}
	return y.Reshape(shape...)
}
