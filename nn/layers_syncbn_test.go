package nn_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/parallel"
	"github.com/ember-ml/ember/tensor"
)

// fakeReducer sums over the ranks of a FakeGroup.
type fakeReducer struct{ c *parallel.FakeComm }

func (r fakeReducer) SumOverRanks(t *tensor.Tensor) {
	if err := parallel.AllReduceSum(r.c, t); err != nil {
		panic(err)
	}
}
func (r fakeReducer) Ranks() int { return r.c.Size() }
func (r fakeReducer) Rank() int  { return r.c.Rank() }

// bnRun is one forward and backward pass of a BatchNorm2d over x (rows of
// a [N, 3, 2, 2] batch) with the loss Σ y·w: its output, the gradients of
// x, weight and bias, and the running statistics after.
type bnRun struct{ y, dx, dw, db, mean, variance []float32 }

func runBN(x, w []float32, n int, r nn.BatchStatsReducer) bnRun {
	bn := nn.NewBatchNorm2d(tensor.CPU, 3)
	defer releaseState(bn)
	if r != nil && nn.SetSyncBatchNorm(bn, r) != 1 {
		panic("SetSyncBatchNorm did not find the layer")
	}
	s := tensor.NewScope()
	defer s.Release()
	xt := tensor.FromFloat32(tensor.CPU, nil, x, n, 3, 2, 2).SetRequiresGrad(true)
	defer xt.Release()
	y := bn.Forward(xt)
	tensor.Sum(tensor.Mul(y, tensor.FromFloat32(tensor.CPU, s, w, n, 3, 2, 2))).Backward()
	defer xt.Grad().Release()
	return bnRun{y.Float32s(), xt.Grad().Float32s(), bn.Weight.Grad().Float32s(), bn.Bias.Grad().Float32s(), bn.RunningMean.Float32s(), bn.RunningVar.Float32s()}
}

// TestSyncBatchNorm: N ranks with B/N rows each and synchronised
// statistics compute what one rank with all B rows computes: each rank's
// output and input gradient are its rows of the one-rank ones, the weight
// and bias gradients summed over the ranks are the one-rank ones (the
// one-rank loss is the sum of the ranks'), and the running statistics are
// the same on every rank. Tolerance 1e-5 relative: the sync path forms
// the variance as E[x²] - E[x]² over 32 values of mean 0.5 and deviation
// 1, where the kernel takes two passes; both are float32. Without the sync
// the outputs differ by far more (checked, so that the test can fail).
func TestSyncBatchNorm(t *testing.T) {
	const n, rowLen = 8, 3 * 2 * 2
	rng := rand.New(rand.NewPCG(4, 5))
	x, w := make([]float32, n*rowLen), make([]float32, n*rowLen)
	for i := range x {
		x[i] = float32(0.5 + rng.NormFloat64())
		w[i] = float32(rng.NormFloat64())
	}
	want := runBN(x, w, n, nil)
	for _, world := range []int{1, 2, 4} {
		g := parallel.NewFakeGroup(world, 10*time.Second)
		got := make([]bnRun, world)
		var wg sync.WaitGroup
		per := n / world
		for r := range world {
			wg.Go(func() {
				lo, hi := r*per*rowLen, (r+1)*per*rowLen
				got[r] = runBN(x[lo:hi], w[lo:hi], per, fakeReducer{g.Comm(r, tensor.CPU)})
			})
		}
		wg.Wait()
		dw, db := make([]float32, 3), make([]float32, 3)
		for r, gr := range got {
			lo, hi := r*per*rowLen, (r+1)*per*rowLen
			sameValues(t, "output", gr.y, want.y[lo:hi], 1e-5)
			sameValues(t, "input gradient", gr.dx, want.dx[lo:hi], 1e-5)
			sameValues(t, "running mean", gr.mean, want.mean, 1e-5)
			sameValues(t, "running var", gr.variance, want.variance, 1e-5)
			for c := range 3 {
				dw[c] += gr.dw[c]
				db[c] += gr.db[c]
			}
		}
		sameValues(t, "weight gradient summed over the ranks", dw, want.dw, 1e-5)
		sameValues(t, "bias gradient summed over the ranks", db, want.db, 1e-5)
	}
	// Per-rank statistics (no sync) give other outputs on 2 ranks.
	half := runBN(x[:n/2*rowLen], w[:n/2*rowLen], n/2, nil)
	worst := 0.0
	for i, v := range half.y {
		worst = math.Max(worst, math.Abs(float64(v-want.y[i])))
	}
	if worst < 1e-2 {
		t.Errorf("per-rank statistics give the outputs of the whole batch (%.2g apart): the data does not tell the sync apart", worst)
	}
	// Turned off again, the layer uses its own batch.
	bn := nn.NewBatchNorm1d(tensor.CPU, 2)
	defer releaseState(bn)
	if nn.SetSyncBatchNorm(bn, nil) != 1 {
		t.Error("SetSyncBatchNorm(nil) did not find the layer")
	}
	// Inside a Sequential (whose layers walk does not see as fields), once
	// each however often they are listed.
	bn2 := nn.NewBatchNorm2d(tensor.CPU, 3)
	defer releaseState(bn2)
	seq := nn.NewSequential(bn, nn.NewSequential(bn2, nn.ReLU{}), bn2)
	if n := nn.SetSyncBatchNorm(seq, nil); n != 2 {
		t.Errorf("SetSyncBatchNorm found %d layers in a Sequential of two", n)
	}
}
